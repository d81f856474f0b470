// The GPU backend of the generation engine (rollout/engine_backend.h): bf16 weights and a bf16
// paged KV cache in device memory, prefill and batched decode on the CUDA ops, decode steps'
// tokens sampled on the device (untruncated and greedy sampling; logits back to the host for the
// engine's sampler otherwise); tensor parallel over an NCCL communicator
// (rollout/engine_cuda_tp.h). The engine keeps the scheduling (admission, continuous batching, KV
// block bookkeeping in a KvCache without storage) exactly as on the CPU, so a sample's random
// stream and the order of results do not depend on the device.
#pragma once

#ifdef RLHF_CUDA
#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "core/device_memory.h"
#include "model/decoder_layer.h"
#include "model/layout.h"
#include "model/ops/cuda_types.h"
#include "rollout/engine_backend.h"
#include "rollout/kv_cache.h"

namespace rlhf::rollout {

class EngineCudaTp;

/// Device state and forward passes of one engine rank on the current CUDA device, on its own
/// stream. Not thread-safe.
///
/// Tensor parallel (a TpGroup of size T > 1): the rank holds its Megatron-style slices of every
/// decoder layer (EngineCudaTp: the CPU engine's split) and the embedding, final norm and LM head
/// whole; its KV cache holds its Hkv/T KV heads; the o_proj and down_proj outputs are summed over
/// the group by an NCCL all-reduce on the engine's stream (captured into the decode graphs with
/// the rest of the step). Every rank computes the same logits, so every rank samples the same
/// tokens. The full layer units exist on the device only between device_units() (a device weight
/// sync's target) and the next prepare_weights(true), which slices and frees them.
///
/// Decode with CUDA graphs: with use_graphs, the decode step of a batch of B sequences is captured
/// once per batch bucket (B rounded up to 1, 2, 4, 8, then multiples of 8, up to max_batch) and
/// replayed: inputs live in fixed device buffers (padded rows decode a dummy token into a scratch
/// block and are ignored), so a replay is one launch instead of ~12 per layer.
class EngineCuda final : public EngineBackend {
 public:
  /// Bytes of the device buffers the engine allocates besides its weights and KV cache: RoPE
  /// tables, activations for max(max_batch, max_position_embeddings) rows, decode logits for
  /// max_batch sequences, attention workspaces, inputs.
  static int64_t buffer_bytes(const model::ParamLayout& layout, int64_t max_batch,
                              int64_t block_size);
  /// Bytes of device memory the engine needs besides its KV cache: weights (bf16),
  /// buffer_bytes(), and 64 MiB for the cuBLASLt workspace and slack.
  /// Under tensor parallelism (tp_size > 1) the layers count as one rank's slices.
  static int64_t fixed_bytes(const model::ParamLayout& layout, int64_t max_batch,
                             int64_t block_size, int tp_size = 1);

  /// KV cache budget from --vllm_gpu_memory_utilization: util·(device memory) − fixed_bytes(),
  /// capped at the memory free now minus a 512 MiB margin (a colocated trainer holds the rest).
  /// Throws rlhf::Error with the numbers and a hint when that leaves nothing.
  static int64_t kv_budget_bytes(const model::ParamLayout& layout, double util, int64_t max_batch,
                                 int64_t block_size, int tp_size = 1);

  /// kv: the engine's block bookkeeping (its num_blocks and block_size size the device cache),
  /// kept by the backend (kv_cache()). unit_room: elements per device unit buffer
  /// (EngineOptions::unit_room; empty = numel). host: the engine's host weights that
  /// prepare_weights() uploads (null: call upload_weights() instead; it must outlive this).
  /// tp: the engine's tensor-parallel group (size 1: none); with size > 1 the construction is
  /// collective over tp.comm (the group's NCCL communicator) and kv must hold this rank's KV heads
  /// (tp_kv_config). Throws rlhf::Error when the group cannot split the model (tp_split_problem).
  EngineCuda(const model::ParamLayout& layout, KvCache kv, int64_t max_batch, bool use_graphs,
             const std::vector<int64_t>& unit_room = {}, const EngineWeights* host = nullptr,
             const TpGroup& tp = {});
  ~EngineCuda() override;
  EngineCuda(const EngineCuda&) = delete;
  EngineCuda& operator=(const EngineCuda&) = delete;

  /// Uploads the full fp32 unit buffers (ParamLayout order, numel each) as bf16 (tensor
  /// parallel: this rank's slices of the layer units).
  void upload_weights(const std::vector<const float*>& units);
  /// The bf16 device unit buffers, full units (for a device-to-device weight sync; tensor
  /// parallel: the layer units are allocated here, sliced and freed by prepare_weights(true)).
  std::vector<model::bf16*> device_units() override;

  // --- EngineBackend
  KvCache& kv_cache() override { return cache_; }
  /// Uploads the host weights given at construction unless device_current (tensor parallel and
  /// device_current: slices the layer units written since device_units()); with LoRA adapters
  /// (set_lora) every adapted projection is uploaded merged (upload_merged).
  void prepare_weights(bool device_current) override;
  /// LoRA: from now on prepare_weights() uploads the host base weights with the adapters of
  /// `layout` in `adapters` (host fp32, the engine's, rewritten by each adapter sync) merged in.
  /// nullptr layout: none.
  void set_lora(const model::LoraLayout* layout, const float* adapters) override {
    lora_layout_ = layout;
    lora_adapters_ = adapters;
  }
  bool feeds_observations() const override { return false; }
  int64_t weight_element_bytes() const override { return int64_t(sizeof(model::bf16)); }
  /// Device bytes: the bf16 weights, the KV cache (with its scratch block), buffer_bytes();
  /// sleep frees the first two.
  EngineMemoryPlan memory_plan() const override;
  /// Frees the device KV cache and the device weights and drops the captured decode graphs
  /// (their kernels hold those buffers' addresses: wake's buffers are new ones, so the graphs
  /// are captured again on the next decode). Returns the device bytes freed.
  int64_t sleep() override;
  /// Allocates the KV cache and the weights again (weights zeroed: the next weight sync or
  /// prepare_weights() fills them). Returns the device bytes allocated.
  int64_t wake() override;
  /// decode() below over the batch; one row per sequence (rows == B).
  const float* decode(const DecodeBatch& batch) override;
  /// Untruncated sampling and greedy (sample_rows_cuda); top-k / top-p go through the host.
  bool samples_on_device(const SamplingParams& p) const override {
    return p.is_greedy() || !p.truncates(V_);
  }
  /// The decode step, then sample_rows_cuda over its logits on the engine's stream: B tokens and
  /// log-probs come back instead of (B, V) logits.
  const SampledToken* decode_sampled(const DecodeBatch& batch, const DeviceSampling& s) override;
  /// GPU seconds of the decode forwards so far (events around each step's forward or replay).
  double decode_device_seconds() const override { return decode_device_s_; }
  double decode_sampling_device_seconds() const override { return sampling_device_s_; }

  /// Prompt forward for positions [0, P) into the KV blocks `blocks` (host, ⌈P / block_size⌉
  /// ids); returns the last position's logits (V fp32, host, valid until the next call).
  const float* prefill(const int32_t* prompt, int64_t P, const int32_t* blocks) override;
  /// Several prompts in one forward (as many as fit max_position_embeddings rows, the decode
  /// block table and max_batch logits rows; more in several): their rows through each GEMM
  /// together, attention block-diagonal causal (attention_forward_varlen_cuda), each prompt's K/V
  /// into its blocks. Returns (G, V) fp32 host logits, valid until the next call. Within bf16
  /// tolerance of prefill() one prompt at a time (GEMMs of another M, the flash kernels' tiles),
  /// not bitwise.
  const float* prefill_batch(const PrefillBatch& batch) override;

  /// Copies positions [0, n) of every layer from blocks src to blocks dst (host id lists).
  void copy_prefix(const int32_t* src, const int32_t* dst, int64_t n) override;

  /// One decode step: tokens, pos, lens (B) and the block table (B, max_blocks), host arrays;
  /// token b is fed at position pos[b] and attends to lens[b] = pos[b] + 1 positions. Returns the
  /// logits (B, V) fp32, host, valid until the next call.
  const float* decode(const int32_t* tokens, const int32_t* pos, const int32_t* lens,
                      const int32_t* table, int64_t B, int64_t max_blocks);

  int64_t weight_bytes() const { return weight_bytes_; }
  int64_t kv_bytes() const { return kv_.bytes(); }
  /// Elements of the device KV cache: (L, 2, num_blocks + 1, Hkv, block_size, D).
  int64_t kv_elems() const { return 2 * L_ * (num_blocks_ + 1) * Hkv_ * block_size_ * D_; }
  /// Decode graphs captured so far, and replays.
  int64_t graphs_captured() const { return graphs_captured_; }
  int64_t graph_replays() const { return graph_replays_; }

 private:
  struct Graph;
  struct Dims;
  // Every device buffer but the weights and the KV cache, with its element count: calls
  // fn(DeviceArray<T>* buffer, int64_t elems, const char* what) for each, buffer null when self
  // is (sizing only). The one list that both allocates them and sizes them (fixed_bytes).
  template <typename Fn>
  static void for_each_buffer(EngineCuda* self, const Dims& d, Fn&& fn);
  // The layer routine's activations for N rows, carved out of the buffers.
  model::LayerActsCuda layer_acts(int64_t N);
  void layer_forward(int l, int64_t N, const model::bf16* x_in, model::bf16* x_out, bool decode,
                     int64_t table_stride, int64_t max_blocks);
  // Embedding, the layers and the head over N rows (tokens_, pos_ on the device): the logits of
  // rows [first_out, N) into logits_. decode: attention over the block table table_ (row stride
  // table_stride), else causal over the rows themselves (a prompt in blocks_).
  // out_rows (optional): the logits of these rows instead, in this order (a batch of prompts'
  // last rows); table_stride > 0 without decode: a batch of prompts (pos_ restarting at each,
  // table_ a block-table row per row).
  void forward(int64_t N, bool decode, int64_t table_stride, int64_t max_blocks, int64_t first_out,
               const std::vector<int64_t>* out_rows = nullptr);
  const float* logits_to_host(int64_t rows);
  // A decode step's inputs uploaded and its forward (or graph replay) enqueued, between the
  // timing events; the caller waits (wait_step) and calls add_step_time().
  void decode_forward(const int32_t* tokens, const int32_t* pos, const int32_t* lens,
                      const int32_t* table, int64_t B, int64_t max_blocks);
  // Adds the last decode forward's GPU time (its events) to decode_device_s_.
  void add_step_time();
  // Waits for a prefill's or decode step's work on the stream. A tensor-parallel engine's step
  // ends in its peers' all-reduces, so its wait is watched (parallel/watchdog.h, --comm_timeout):
  // a peer that never reaches its all-reduce ends the job with the watchdog's message.
  void wait_step();
  int64_t bucket(int64_t B) const;
  // Tensor parallel: unit u is a decoder layer, held as this rank's slices (tp_).
  bool sliced_unit(int u) const;
  // The elements unit u's device buffer holds while awake (0: a sliced layer unit).
  int64_t resident_elems(int u) const { return sliced_unit(u) ? 0 : unit_elems_[size_t(u)]; }
  model::LayerParams<const model::bf16> layer_weights(int l) const;
  // Unit u from n host fp32 values, rounded to bf16 (staged in `tmp`; synchronises the stream).
  void upload_unit(size_t u, const float* src, int64_t n, std::vector<model::bf16>& tmp);
  // The host units with every adapter merged into a layer unit's weights: W + (α/r)·B·A in fp32
  // from the host base (which stays as it is, so merges never accumulate), one bf16 rounding;
  // tensor parallel: merged on the full layer unit, then this rank's slices of it uploaded
  // (EngineCudaTp::load_from_host), so each rank holds the slice of the merged weight.
  void upload_merged();

  model::ParamLayout layout_;
  const model::LoraLayout* lora_layout_ = nullptr;  // set_lora
  const float* lora_adapters_ = nullptr;
  KvCache cache_;  // block bookkeeping only: the keys and values are kv_
  const EngineWeights* host_ = nullptr;
  model::LayerSpec spec_;
  int64_t C_, F_, H_, Hkv_, D_, V_, L_, max_pos_;
  int64_t num_blocks_, block_size_, max_batch_, max_blocks_cap_;
  bool use_graphs_;
  CudaStream stream_;
  std::vector<DeviceArray<model::bf16>> units_;
  std::vector<int64_t> unit_elems_;  // each device unit buffer's elements (numel or its room)
  int64_t weight_bytes_ = 0;
  bool asleep_ = false;          // sleep() freed units_ and kv_
  DeviceArray<model::bf16> kv_;  // (L, 2, num_blocks, Hkv, block_size, D)
  DeviceArray<float> rope_cos_, rope_sin_;
  // Activations for up to rows_cap rows (decode: max_batch; prefill: max_pos).
  DeviceArray<model::bf16> x_, x2_, ln_, q_, k_, v_, atty_, xmid_, gate_, up_, h_, proj_, logits_;
  bool fused_qkv_ = false;        // every layer's q/k/v packed (model::qkv_packed): one GEMM
  DeviceArray<model::bf16> qkv_;  // (rows, q + 2·kv) packed QKV output when fused_qkv_
  DeviceArray<float> rstd_, qk_rstd_, lse_, attn_ws_;
  DeviceArray<int32_t> tokens_, pos_, lens_, table_, blocks_, blocks2_;
  // decode_sampled: per sequence 1/T and u in, token and log-prob out (max_batch each).
  DeviceArray<float> sample_inv_t_, sample_logprob_;
  DeviceArray<double> sample_u_;
  DeviceArray<int32_t> sample_token_;
  // The outputs' pinned host side (max_batch each, made at the first decode_sampled): their copies
  // stay asynchronous, so the step's one wait is wait_step's (watched under tensor parallelism).
  PinnedArray<float> sample_logprob_host_;
  PinnedArray<int32_t> sample_token_host_;
  std::vector<SampledToken> sampled_;
  std::vector<float> logits_host_;
  PinnedArray<model::bf16> logits_bf16_host_;  // pinned: the copy runs at the link's speed
  cudaEvent_t step_begin_ = nullptr, step_end_ = nullptr;  // timing of each decode forward
  cudaEvent_t sample_end_ = nullptr;  // after decode_sampled's kernels (from step_end_)
  double decode_device_s_ = 0, sampling_device_s_ = 0;
  std::vector<std::unique_ptr<Graph>> graphs_;  // by bucket index
  std::unique_ptr<EngineCudaTp> tp_;            // tensor parallel size > 1: the slices and NCCL
  bool staged_ = false;  // tensor parallel: full layer units handed out by device_units()
  int64_t graphs_captured_ = 0, graph_replays_ = 0;
};

}  // namespace rlhf::rollout
#endif  // RLHF_CUDA
