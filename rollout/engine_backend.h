// The device half of a generation engine (rollout/engine.h): what runs the model. The engine
// (the scheduler) owns the sequences, admission, continuous batching, turn hooks, sampling and the
// stats, and hands a backend one prompt to prefill, a prefix to copy, or a batch of rows to
// decode; the backend owns its weights' layout (packed, sliced, uploaded), the KV cache's storage,
// its activation buffers and, under tensor parallelism, the per-layer partial-sum all-reduce.
// Backends: the CPU one (rollout/engine_cpu.cpp, fp32 weights, fp32 or fp16 KV cache, tensor
// parallel over a parallel::Comm) and, in a build with CUDA, the GPU one (rollout/engine_cuda.h).
#pragma once

#include <string>

#include <array>
#include <cstdint>
#include <memory>
#include <vector>

#include "core/error.h"
#include "model/decoder_layer.h"
#include "model/layer_params.h"
#include "model/layout.h"
#include "model/lora.h"
#include "model/ops/cuda_types.h"
#include "parallel/comm.h"
#include "rollout/kv_cache.h"
#include "rollout/sampling.h"

namespace rlhf::rollout {

struct EngineOptions;
class EngineWeights;

/// The tensor-parallel group of one engine: `size` ranks, this one `rank`; comm is null for size 1.
struct TpGroup {
  parallel::Comm* comm = nullptr;
  int size = 1, rank = 0;
};

/// The group an engine built with options.tp_comm runs in (size 1 without one).
TpGroup tp_group(parallel::Comm* tp_comm);

/// Why a tensor-parallel group of size T cannot split model c (Megatron style: attention heads,
/// KV heads and MLP columns evenly over the group): "" when it can, else one message naming the
/// three sizes and, as a hint, every size from 1 to 64 that would work. The one rule both the
/// engine (tp_layer_spec) and the start-up usage check (app/usage_checks.cpp) apply.
std::string tp_split_problem(const model::ModelConfig& c, int T);

/// This rank's layer dims under tensor parallelism (Megatron style): H/T attention heads, Hkv/T
/// KV heads and F/T MLP columns of the config's. Throws rlhf::Error (tp_split_problem's message)
/// when T does not divide all three.
model::LayerSpec tp_layer_spec(const model::ModelConfig& c, const TpGroup& tp);

/// The config whose KV heads are this rank's (what its KV cache holds): num_key_value_heads
/// Hkv/T, head_dim fixed to the full config's D.
model::ModelConfig tp_kv_config(const model::ModelConfig& c, const TpGroup& tp);

/// One decode step's inputs: host arrays that the scheduler fills and the backend reads during
/// decode(). Row i feeds tokens[i] at position pos[i], attending to lens[i] = pos[i] + 1 cached
/// positions through block-table row i; a sequence has one row (its last sampled token) and, in
/// multi-turn generation, one more per observation token after it, at consecutive positions.
struct DecodeBatch {
  int64_t B = 0;                      ///< sequences
  int64_t rows = 0;                   ///< rows fed (>= B)
  const int32_t* tokens = nullptr;    ///< (rows)
  const int32_t* pos = nullptr;       ///< (rows)
  const int32_t* lens = nullptr;      ///< (rows)
  const int32_t* table = nullptr;     ///< (rows, max_blocks) KV block ids
  int64_t max_blocks = 0;             ///< block-table row length
  const int64_t* last_row = nullptr;  ///< (B) each sequence's last row (whose logits are sampled)
};

/// Several prompts to prefill in one forward (EngineBackend::prefill_batch): prompt g is
/// tokens[offsets[g], offsets[g + 1]), at positions [0, P_g), into the KV blocks blocks[g]
/// (⌈P_g / block_size⌉ ids, host). Host arrays the scheduler owns during the call.
struct PrefillBatch {
  int64_t G = 0;                           ///< prompts (>= 1)
  const int32_t* tokens = nullptr;         ///< (offsets[G]) the prompts, concatenated
  const int64_t* offsets = nullptr;        ///< (G + 1) offsets[0] = 0, each prompt >= 1 token
  const int32_t* const* blocks = nullptr;  ///< (G) each prompt's block-table row
  int64_t vocab_size = 0;                  ///< V, the logits' row length
};

/// A decode step's sampling inputs when the backend samples on the device
/// (EngineBackend::decode_sampled): host arrays of B values, one per sequence, that the scheduler
/// owns during the call.
struct DeviceSampling {
  const float* inv_temperature = nullptr;  ///< (B) float(1/T); 0 = greedy
  const double* u = nullptr;  ///< (B) the sequences' counter_uniform draws (ignored when greedy)
};

/// An engine rank's memory, in bytes of the memory its backend computes in: host memory for the
/// CPU backend, device memory for a GPU one (the engine's fp32 host unit buffers are counted
/// apart, by Engine::memory_plan).
struct EngineMemoryPlan {
  bool device = false;      ///< the bytes below are device (GPU) bytes, else host bytes
  int64_t weights = 0;      ///< the backend's own weight copies (packed panels, bf16, TP slices)
  int64_t kv_cache = 0;     ///< the KV cache's storage (num_blocks x bytes_per_block)
  int64_t buffers = 0;      ///< fixed activation and input buffers (0: grown on demand)
  int64_t sleep_frees = 0;  ///< what sleep() frees (0: this backend keeps everything)
};

/// What runs the model for an Engine. Not thread-safe.
class EngineBackend {
 public:
  virtual ~EngineBackend() = default;

  /// The KV cache: block bookkeeping that the scheduler allocates from and releases to (the same
  /// block ids in every layer), with the storage this backend owns (host storage in the KvCache,
  /// or elsewhere, e.g. device memory, with a KvCache of bookkeeping only).
  virtual KvCache& kv_cache() = 0;

  /// Brings the backend's own copies of the weights up to date with the engine's host unit
  /// buffers (loading and weight sync write those): packing, tensor-parallel slices, upload.
  /// Called at the start of every generate(). device_current: the backend's device buffers were
  /// written directly since the last call (device_units()): use them as they are.
  virtual void prepare_weights(bool device_current) = 0;

  /// Prompt forward for positions [0, P) into the KV blocks `blocks` (⌈P / block_size⌉ ids, host):
  /// writes their K/V; returns the last position's logits (V fp32, host, valid until the next
  /// call).
  virtual const float* prefill(const int32_t* prompt, int64_t P, const int32_t* blocks) = 0;

  /// prefill() of every prompt of `batch`, in one forward where the backend can (the CPU's fp32
  /// path: the prompts' rows through each linear together, attention within each prompt) and one
  /// prompt at a time otherwise (this default). Returns the last position's logits of each
  /// prompt, (G, V) fp32 host, valid until the next call. The CPU's is row-invariant: prompt g's
  /// K/V and logits are bitwise what prefill() of it alone gives, whatever else is in the batch;
  /// the GPU's is within bf16 tolerance of it (EngineCuda::prefill_batch).
  virtual const float* prefill_batch(const PrefillBatch& batch);

  /// Copies positions [0, n) of every layer from the sequence with blocks `src` to the one with
  /// blocks `dst` (n samples of one prompt: prefill once, copy its rows).
  virtual void copy_prefix(const int32_t* src, const int32_t* dst, int64_t n) = 0;

  /// One decode step: writes every row's K/V (all before any row attends, so the rows of one
  /// sequence attend causally to each other) and returns the logits of each sequence's last row,
  /// (B, V) fp32 host, valid until the next call. Batch-invariant: a row's logits do not depend on
  /// the other rows.
  virtual const float* decode(const DecodeBatch& batch) = 0;

  /// Whether decode_sampled() can draw tokens with these parameters on the device; false (this
  /// default): the engine copies decode()'s logits to the host and samples there.
  virtual bool samples_on_device(const SamplingParams& p) const {
    (void)p;
    return false;
  }

  /// decode() with each sequence's next token drawn on the device from its last row's logits
  /// (the host Sampler's rule, sample_rows_cuda), so only B tokens and log-probs come back:
  /// (B) host, valid until the next call. A sequence whose logits are not finite comes back with
  /// token −1. For batches whose every sequence's parameters samples_on_device() accepts; this
  /// default throws rlhf::Error.
  virtual const SampledToken* decode_sampled(const DecodeBatch& batch, const DeviceSampling& s) {
    (void)batch;
    (void)s;
    RLHF_FAIL("this generation engine backend does not sample on the device");
  }

  /// Seconds the device spent in decode() forwards since the backend was made (CUDA events around
  /// each step's forward or graph replay); 0 for a backend without a device (the CPU). The rest
  /// of a decode step's wall time is the device's sampling (decode_sampling_device_seconds) and
  /// the host's: inputs, logits copy, host sampling, scheduling.
  virtual double decode_device_seconds() const { return 0; }
  /// Seconds the device spent drawing decode steps' tokens (decode_sampled's kernels, CUDA events
  /// around them) since the backend was made; 0 for a backend that never samples on the device.
  virtual double decode_sampling_device_seconds() const { return 0; }

  /// Whether decode() takes more than one row per sequence (observation tokens of multi-turn
  /// generation); when false the scheduler feeds them one decode step each (one row per
  /// sequence), with the same results.
  virtual bool feeds_observations() const = 0;

  /// Bytes of one weight element that a decode step reads (4 for fp32, 2 for bf16).
  virtual int64_t weight_element_bytes() const = 0;

  /// LoRA (model/lora.h): from now on the model is the unit buffers' base weights with the
  /// adapters of `layout` in `adapters` (layout->numel() floats the engine owns, read at every
  /// prepare_weights and prefill; nullptr layout: none). Both backends apply them, tensor parallel
  /// or not (the CPU's unmerged beside prefill and merged into its decode copies, each rank on its
  /// slices; EngineCuda merged into its device weights, or their slices, at each
  /// prepare_weights); this default, for a backend without LoRA, throws rlhf::Error.
  virtual void set_lora(const model::LoraLayout* layout, const float* adapters) {
    (void)adapters;
    RLHF_CHECK(layout == nullptr,
               "--lora_rank: this generation engine does not apply LoRA adapters");
  }

  /// The memory this backend holds once prepare_weights() has run (EngineMemoryPlan).
  virtual EngineMemoryPlan memory_plan() const = 0;

  /// Sleep (OpenRLHF's --vllm_enable_sleep): frees the KV cache's storage and the backend's own
  /// weight copies while the trainer trains; the engine's host unit buffers stay, and the block
  /// bookkeeping too. Returns the bytes freed (0: this backend keeps everything, the default).
  /// The caller (Engine::sleep) has checked that no sequence is in flight.
  virtual int64_t sleep() { return 0; }
  /// Takes back what sleep() freed (storage uninitialised: prepare_weights() rebuilds the weight
  /// copies, a weight sync writes the device units). Returns the bytes allocated (0 when not
  /// asleep). Throws rlhf::Error when an allocation fails.
  virtual int64_t wake() { return 0; }

#ifdef RLHF_CUDA
  /// A GPU backend's bf16 device unit buffers (ParamLayout order), what a device-to-device weight
  /// sync writes; empty for a host backend.
  virtual std::vector<model::bf16*> device_units() {
    return {};
  }
#endif

 protected:
  /// The host buffer prefill_batch returns its (G, V) fp32 logits in, grown to at least G·V
  /// floats (checked_grow: contents not kept). Throws rlhf::Error when the allocation fails.
  float* batch_logits(int64_t G, int64_t V);

 private:
  std::vector<float> batch_logits_;  // batch_logits()
};

/// The CPU backend (rollout/engine_cpu.cpp): reads the host unit buffers of `weights` (which must
/// outlive it), packs the linear weights for the batch-invariant decode kernel, and under tensor
/// parallelism (tp.size > 1) computes this rank's slices with an all-reduce on tp.comm per
/// o_proj/down_proj output. The KV cache holds options.kv_cache_bytes in options.kv_cache_dtype
/// (this rank's KV heads). Throws rlhf::Error when the budget holds no block or T does not divide
/// the heads and MLP columns.
std::unique_ptr<EngineBackend> make_cpu_backend(const model::ParamLayout& layout,
                                                const EngineOptions& options,
                                                const EngineWeights& weights, const TpGroup& tp);

/// The GPU backend (rollout/engine_cuda.h) on the current CUDA device: uploads the host unit
/// buffers of `weights` (which must outlive it) as bf16, its KV cache sized from
/// options.gpu_memory_utilization; under tensor parallelism (tp.size > 1) this rank's slices and
/// KV heads, an NCCL communicator over tp.comm (collective). Throws rlhf::Error in a build without
/// CUDA (or, for tp.size > 1, without NCCL), when T does not divide the model, or when the device
/// memory leaves nothing for the KV cache.
std::unique_ptr<EngineBackend> make_cuda_backend(const model::ParamLayout& layout,
                                                 const EngineOptions& options,
                                                 const EngineWeights& weights, const TpGroup& tp);

}  // namespace rlhf::rollout
