// The generation engine: owns a full fp32 copy of the policy's weights and a backend
// (rollout/engine_backend.h) that runs the model — on the CPU (a copy of the linear weights and LM
// head packed for the decode kernel: as much memory again, and a paged KV cache) or on the GPU;
// prefills prompts, then decodes every active sequence together, one token per sequence per step,
// with continuous batching (a finished sequence's slot and KV blocks go to the next waiting request
// at once). Optionally tensor parallel (Megatron style) over the ranks of one engine. The engine is
// the scheduler: validation, admission, decode batches, turn hooks, sampling and stats, written
// once for every backend.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "model/decoder_layer.h"
#include "model/layout.h"
#include "model/lora.h"
#include "model/ops/cuda_types.h"
#include "model/provider.h"
#include "parallel/comm.h"
#include "rollout/engine_backend.h"
#include "rollout/finish_reason.h"
#include "rollout/kv_cache.h"
#include "rollout/sampling.h"

namespace rlhf::rollout {

/// Default positions per KV block of a CPU engine. Decode attention reads one KV head's rows of a
/// block as one contiguous run (block_size·head_dim elements): with 16-position blocks a run is
/// 1.5 KB at head_dim 48 and the thread waits on memory (8–9 GB/s of one core's ~29 GB/s
/// sequential read on the development machine); 256-position runs read 1.5–1.9× faster once the
/// cache outgrows L3. The cost is at most 255 unused positions per sequence.
inline constexpr int64_t kCpuKvBlockSize = 256;
/// Default positions per KV block of a GPU engine (vLLM's; the paged decode kernel splits a
/// sequence into 64-key parts whatever the block size).
inline constexpr int64_t kGpuKvBlockSize = 16;

/// Engine settings.
struct EngineOptions {
  int64_t kv_cache_bytes = int64_t(1) << 30;  ///< KV cache budget (--gen_kv_cache_mb)
  /// Element type of a CPU engine's KV cache (--kv_cache_dtype): fp32 (exact: decode equals the
  /// trainer's forward), or fp16 (half the bytes decode attention reads and twice the positions
  /// per byte of budget; keys and values rounded to 11 significant bits). A GPU engine keeps bf16.
  KvDtype kv_cache_dtype = KvDtype::kFloat32;
  /// A CPU engine computes in bf16 (the trainer's --param_dtype bf16, model/layer_bf16.h): bf16
  /// weight copies, prompts through oneDNN, decode through the bf16 packed kernel. Needs oneDNN in
  /// the build. Every weight is read as its bf16 value: generate() rounds the unit buffers in place
  /// (norms, biases, embedding included). false: fp32. (A GPU engine is bf16 always.)
  bool bf16 = false;
  /// Positions per KV block (--kv_block_size); 0 = the device's default, kCpuKvBlockSize or
  /// kGpuKvBlockSize (resolved_block_size()).
  int64_t block_size = 0;
  int64_t max_batch = 256;  ///< most sequences decoded at once (vLLM max_num_seqs)
  /// Most prompt tokens one prefill forward takes (vLLM max_num_batched_tokens): the groups
  /// admitted at a step are prefilled together up to this many tokens (a longer prompt alone).
  /// On the CPU only the batch's size and the activation memory depend on it, never a token or
  /// log-prob; on a GPU the logits move within bf16 tolerance (EngineCuda::prefill_batch).
  int64_t prefill_batch_tokens = 2048;
  int32_t eos_token_id = -1;  ///< stop token; -1 = the model config's eos_token_id
  bool ignore_eos = false;    ///< never stop on EOS (benchmarks)
  /// Multi-turn: feed a turn's observation tokens one decode step each (one row per sequence),
  /// what the engine always does on a backend that takes one row per sequence (the GPU, tensor
  /// parallel CPU); the same tokens and log-probs as feeding them in one step (tests compare).
  bool observations_row_by_row = false;
  /// Run on the current CUDA device (rollout/engine_cuda.h): bf16 weights and KV cache in device
  /// memory; kv_cache_bytes is then derived from gpu_memory_utilization. Tensor parallel over
  /// NCCL when tp_comm has several ranks (one GPU each).
  bool cuda = false;
  /// --vllm_gpu_memory_utilization: the share of the device's memory the engine may hold (weights,
  /// buffers and KV cache), capped by what is free when it starts.
  double gpu_memory_utilization = 0.95;
  /// Decode steps replay CUDA graphs captured per batch bucket (--enforce_eager turns this off).
  bool cuda_graphs = true;
  /// A backend that can (a GPU engine) draws each decode step's tokens on the device when every
  /// sequence of the step samples without top-k / top-p (or greedily): B tokens and log-probs
  /// cross to the host instead of (B, V) logits. Within exp's last bits of the host Sampler
  /// (sample_rows_cuda). false: always the host Sampler (benchmarks compare the two).
  bool device_sampling = true;
  /// A sample interrupted by a generation quota (generate's quota_groups) keeps its KV blocks in
  /// the engine (kept_sequences()) instead of returning them, and a later generate() continues it
  /// from them when asked for its continuation (GenerationRequest::prefix: the same id, sample
  /// index, prompt and prefix), with no prefill — the cache then holds keys and values computed
  /// under the weights of the call that interrupted it, as a vLLM engine paused across a weight
  /// update keeps its requests. A kept sample stays until a call continues it, a call asks for
  /// its (id, sample index, prompt) with other tokens (a sample regenerated from scratch), or a
  /// call needs its blocks to admit a request (oldest kept first), so a call for other prompts in
  /// between (an evaluation) leaves it be where the cache has room; release_kept() and sleep()
  /// free them all. false: every continuation is prefilled again under the current weights
  /// (AReaL's recompute).
  bool keep_interrupted_kv = false;
  /// Tensor-parallel group of this engine (Topology::engine_comm, e.g. through make_comm: a
  /// shared-memory comm inside the node, whose all-reduce is bit-identical on every rank). nullptr
  /// or size 1: TP 1, the fast path. Size T > 1: every rank of the group builds the engine with the
  /// same options and calls generate() with the same requests (collective); see Engine.
  parallel::Comm* tp_comm = nullptr;
  /// Elements to allocate for each unit's weight buffer, host and device (at least the unit's
  /// numel; empty = numel): room for a writer that delivers units in larger pieces — weight sync
  /// lands the trainers' padded shards whole (parallel::WeightSync::engine_unit_room). The engine
  /// reads only [0, numel) of each.
  std::vector<int64_t> unit_room;

  /// The block size an engine built with these options uses: block_size, or when it is 0 the
  /// default of the device `cuda` names.
  int64_t resolved_block_size() const {
    return block_size > 0 ? block_size : cuda ? kGpuKvBlockSize : kCpuKvBlockSize;
  }
};

/// One prompt to complete n_samples times.
struct GenerationRequest {
  uint64_t id = 0;  ///< the random stream's key (with sampling.seed): same id + seed → same tokens
  std::vector<int32_t> prompt;  ///< token ids (BOS included by the caller); non-empty
  int64_t n_samples = 1;        ///< completions of this prompt; they share one prefill
  /// Most tokens to generate per sample (--generate_max_len); capped so that prompt + generated
  /// tokens fit max_position_embeddings.
  int64_t max_new_tokens = 1024;
  SamplingParams sampling;
  /// Sample indices are first_sample_index .. first_sample_index + n_samples − 1 (the random
  /// stream's key and GenerationResult::sample_index): a continuation asks for one sample of a
  /// group by its index.
  int64_t first_sample_index = 0;
  /// A partial rollout's continuation: response tokens generated earlier (under older weights).
  /// They are prefilled after the prompt under the current weights — unless the engine kept the
  /// sample's KV blocks from the call that interrupted it (EngineOptions::keep_interrupted_kv;
  /// then decoding goes on from them) — count against max_new_tokens, open the result's tokens,
  /// and the random stream continues at token index prefix.size(), so with unchanged weights the
  /// continued sample has the tokens the uninterrupted one has either way. Empty: a fresh sample.
  /// Needs prefix.size() < max_new_tokens and no turn hooks.
  std::vector<int32_t> prefix;
  /// The engine log-probs of the prefix tokens (copied into the result); empty = zeros.
  std::vector<float> prefix_logprobs;
  /// The caller's group key for a generation quota (generate's quota_groups); −1 = none.
  int64_t group = -1;
};

/// One completion.
struct GenerationResult {
  int64_t request_index = 0;    ///< position of the request in generate()'s argument
  uint64_t request_id = 0;      ///< GenerationRequest::id
  int64_t sample_index = 0;     ///< 0..n_samples−1
  std::vector<int32_t> tokens;  ///< response ids; ends with the EOS id when finish == kStop
  /// Per token: log softmax(logits / T)[token], full vocabulary; 0 at observation tokens.
  std::vector<float> logprobs;
  /// Per token with a turn hook: 1 = sampled by the model, 0 = an observation the hook appended
  /// (context: no loss). Empty without a turn hook (every token sampled).
  std::vector<uint8_t> action_mask;
  int64_t turns = 1;  ///< model turns taken (1 without a turn hook)
  FinishReason finish = FinishReason::kLength;
  /// The generation quota was reached before this sample finished: tokens (prefix included) are
  /// what it had then, and it may be continued later (GenerationRequest::prefix).
  bool interrupted = false;
};

/// A sample at the end of one of its turns — it sampled EOS, or TurnHooks::ends_turn said its
/// turn ends at its last token (a stop string) — as TurnHooks::on_turn_end sees it and answers.
struct TurnEnd {
  int64_t request_index = 0;  ///< as in GenerationResult
  uint64_t request_id = 0;
  int64_t sample_index = 0;
  int64_t turn = 0;        ///< 0-based index of the turn that ended
  int64_t turn_begin = 0;  ///< response position where that turn began
  bool eos = false;        ///< it ended with EOS: the episode ends whatever the answer
  const std::vector<int32_t>* tokens = nullptr;  ///< the response so far (valid during the call)
  // --- the hook's answer
  /// Tokens to append (action mask 0) before the model's next turn; prefilled onto the sample's
  /// own KV blocks (the sequence so far is not run again). Each in [0, vocab).
  std::vector<int32_t> observation;
  bool done = false;  ///< the episode is over
};

/// Multi-turn generation (rl/episodes.h builds these from an environment and stop strings).
/// A sample continues until EOS, done, max_turns turns, or its length limit (generated and
/// observation tokens together count against max_new_tokens; an observation that does not fit is
/// cut and the sample ends with "length").
struct TurnHooks {
  /// Whether a sample's current turn ends at its last token, given its response tokens and where
  /// the turn began (a stop string in tokens [turn_begin, end)). Called once per sampled token
  /// (not EOS), serially. Null: turns end at EOS only.
  std::function<bool(const std::vector<int32_t>& response, int64_t turn_begin)> ends_turn;
  /// Called after each engine step with every sample whose turn ended in it, ordered by
  /// (request_index, sample_index); fills each one's observation and done. Null: a stop string
  /// ends the sample ("stop_string") and no observation is ever appended. Tensor parallel: every
  /// rank of the group calls it at the same step with the same turn ends, and it must answer the
  /// same on every rank (rl::generate_episodes asks the environment on TP rank 0 and broadcasts
  /// the answers), or the ranks' sequences diverge.
  std::function<void(std::vector<TurnEnd>& ends)> on_turn_end;
  int64_t max_turns = 1;  ///< a sample ends after this many model turns (>= 1)
};

/// Counters of one generate() call.
struct EngineStats {
  int64_t requests = 0, samples = 0;
  int64_t prefills = 0;          ///< prompts prefilled (one per admitted group of samples)
  int64_t prefill_batches = 0;   ///< prefill forwards (backend calls), each of >= 1 prompts
  int64_t prefill_tokens = 0;    ///< prompt tokens run through those forwards
  int64_t generated_tokens = 0;  ///< sampled tokens (first tokens from prefill + decode tokens)
  int64_t decode_tokens = 0;     ///< tokens produced by decode steps (Σ batch over steps)
  int64_t decode_steps = 0;
  /// decode steps whose tokens the backend drew on the device (EngineOptions::device_sampling)
  int64_t device_sampled_steps = 0;
  int64_t max_active = 0;       ///< largest decode batch
  int64_t admission_waits = 0;  ///< times the next request had to wait for KV blocks / a slot
  int64_t peak_kv_blocks = 0;   ///< most KV blocks in use at once
  /// continuations that went on from the KV blocks kept since the call that interrupted them
  /// (EngineOptions::keep_interrupted_kv), without a prefill
  int64_t resumed = 0;
  int64_t resumed_positions = 0;  ///< the cached positions those continuations did not prefill
  int64_t kept = 0;               ///< samples this call interrupted and kept, with their blocks
  /// kept samples this call freed: superseded by a request for them, or their blocks needed
  int64_t kept_evicted = 0;
  int64_t turn_ends = 0;           ///< turns that ended and went to TurnHooks::on_turn_end
  int64_t observation_tokens = 0;  ///< observation tokens appended (and prefilled, when fed)
  double turn_hook_s = 0;          ///< wall time inside TurnHooks::on_turn_end
  double kv_bytes_read = 0;        ///< Σ over decode steps of the K/V bytes attention read
  double prefill_s = 0, decode_s = 0, total_s = 0;  ///< wall time in prefill, decode steps, all
  /// Device time of the decode steps' forwards (GPU engines; 0 on the CPU).
  double decode_device_s = 0;
  /// Device time of the decode steps' token draws on the device (EngineOptions::device_sampling;
  /// 0 on the CPU). decode_s − decode_device_s − this is the host's share (inputs, the tokens'
  /// or logits' copy, host sampling, scheduling).
  double decode_sampling_device_s = 0;
  double mean_active_batch() const {
    return decode_steps > 0 ? double(decode_tokens) / double(decode_steps) : 0.0;
  }
};

/// Called after every decode step (and after the last admission) with the running stats and the
/// number of samples finished so far out of the total.
using ProgressFn =
    std::function<void(const EngineStats& stats, int64_t samples_done, int64_t samples_total)>;

/// The weights of an engine: one full fp32 buffer per unit (ParamLayout order, max(numel,
/// room[u]) elements, zero-initialised), as a read-only UnitProvider for the model code.
class EngineWeights : public model::UnitProvider<float> {
 public:
  /// room: elements per unit (empty, or an entry below numel, means numel). Throws rlhf::Error
  /// when room has an entry count other than the layout's units.
  EngineWeights(const model::ParamLayout& layout, const std::vector<int64_t>& room = {});
  float* unit_buffer(int u) { return units_.at(size_t(u)).data(); }
  const float* unit_buffer(int u) const { return units_.at(size_t(u)).data(); }
  const float* acquire_params(int u) override { return unit_buffer(u); }
  void release_params(int) override {}
  /// Throws rlhf::Error: the engine holds no gradients.
  float* acquire_grads(int u) override;
  void release_grads(int) override {}

 private:
  std::vector<std::vector<float>> units_;
};

/// Batched autoregressive generation over one model. Not thread-safe; OpenMP inside.
///
/// Tensor parallel (options.tp_comm of size T > 1, rank r): every rank still holds the full unit
/// buffers (what loading and weight sync write); generate() first copies this rank's slices — the
/// q/k/v rows of attention heads [r·H/T, (r+1)·H/T) and KV heads [r·Hkv/T, (r+1)·Hkv/T), the o_proj
/// columns of those heads, the gate/up rows and down_proj columns of [r·F/T, (r+1)·F/T) — and
/// computes only those; the o_proj and down_proj outputs are summed over the group
/// (tp_comm->all_reduce) before each residual add (o_proj's bias added by rank 0 only). The KV
/// cache holds this rank's KV heads only. Embedding, norms and the LM head are computed whole on
/// every rank, so every rank samples the same tokens and returns the same results. Requires H,
/// Hkv and F divisible by T (rlhf::Error otherwise). On the GPU (options.cuda) the group is the
/// same and the backend (rollout/engine_cuda.h) sums with an NCCL all-reduce on the engine's
/// stream instead; the device holds only this rank's slices of the layers.
class Engine {
 public:
  /// layout: an LM-head model; options.unit_room sizes the unit buffers. Weights start at zero:
  /// fill unit_buffer(u) (e.g. io::load_model_hdf5 into unit_buffers()). Allocates the KV cache
  /// (throws if the budget holds no block).
  Engine(const model::ParamLayout& layout, const EngineOptions& options);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  const model::ParamLayout& layout() const { return layout_; }
  const EngineOptions& options() const { return opt_; }
  int num_units() const { return layout_.num_units(); }
  /// Full fp32 buffer of unit u (numel floats, or options().unit_room[u]): what weight sync
  /// writes.
  float* unit_buffer(int u) { return weights_.unit_buffer(u); }
  /// unit_buffer(u) for every unit, in order.
  std::vector<float*> unit_buffers();
  /// The weights as a UnitProvider (e.g. for model::Transformer in tests).
  model::UnitProvider<float>& provider() { return weights_; }
  const KvCache& kv_cache() const { return backend_->kv_cache(); }
  /// Ranks of the tensor-parallel group (1 without one) and this rank's place in it.
  int tp_size() const { return tp_.size; }
  int tp_rank() const { return tp_.rank; }
  /// Weight bytes one decode step reads: every linear, the norms and the LM head (fp32 on the
  /// CPU, bf16 on the GPU).
  int64_t weight_bytes_per_decode_step() const;
  /// True when the forward passes run on the GPU (options.cuda).
  bool on_gpu() const { return opt_.cuda; }
  /// LoRA (model/lora.h): the engine's model becomes the unit buffers' base weights with the
  /// adapters `cfg` lays out, held in lora_buffer() (zero, i.e. the base model, until written:
  /// WeightSync::sync_adapters). The CPU backend merges them into its packed decode weights at
  /// every generate() and runs them unmerged beside the prefill GEMMs; the GPU backend uploads
  /// the base with them merged at every generate(). Under tensor parallelism every rank holds
  /// the full adapters (what the sync writes) and applies its slice of them: the CPU backend
  /// slices B's rows of a column-parallel projection and A's columns of a row-parallel one with
  /// the weights (rollout/tp_slice.h), the GPU backend merges on the full weight and uploads its
  /// slice. Throws rlhf::Error from LoraLayout.
  void set_lora(const model::LoraConfig& cfg);
  /// The adapters' flat buffer (LoraLayout::numel floats); nullptr before set_lora.
  float* lora_buffer() { return lora_.empty() ? nullptr : lora_.data(); }
  int64_t lora_numel() const { return int64_t(lora_.size()); }
#ifdef RLHF_CUDA
  /// GPU engine: its bf16 device unit buffers (ParamLayout order), what WeightSync::sync_device
  /// writes. After writing them, call device_weights_updated(): from then on every generate()
  /// (the next rollout, and an evaluation before it) uses them as they are instead of uploading
  /// unit_buffer() — which a device sync never writes — until host_weights_updated().
  std::vector<model::bf16*> device_unit_buffers();
  void device_weights_updated() {
    device_weights_current_ = true;
  }
  /// The host unit buffers hold the weights again (written after a device sync): the next
  /// generate() uploads them.
  void host_weights_updated() {
    device_weights_current_ = false;
  }
#endif

  /// Generates every sample of every request; returns them ordered by (request_index,
  /// sample_index). Requests are admitted in order (first come, first served): a request's
  /// samples start when a decode slot and the KV blocks for their worst case — prompt +
  /// max_new_tokens − 1 positions each — are free; until then it waits for running sequences to
  /// finish. All samples of a request start together after one prefill when they can ever fit
  /// together, else in the largest groups that fit (each group prefills again). The groups
  /// admitted at one step are prefilled in one backend call (EngineBackend::prefill_batch, up to
  /// EngineOptions::prefill_batch_tokens).
  /// A sample's tokens depend only on its weights, prompt, sampling parameters, request id and
  /// sample index — not on the other requests, the order or the batch (decode is batch-invariant).
  /// Throws rlhf::Error on an empty prompt, a token outside the vocabulary, a prompt that leaves
  /// no room under max_position_embeddings, bad sampling parameters (naming the request), or a
  /// single sample whose worst case exceeds the whole KV cache.
  ///
  /// hooks (optional): multi-turn episodes (TurnHooks). Observation rows are fed with the
  /// sample's next decode step, through the same batch-invariant decode kernels (one row per
  /// token at its position, causal over the sample's cache), so the tokens still depend only on
  /// the request, the sample and the hooks' answers. Without hooks the decode loop is the
  /// single-turn one, unchanged. Throws what the hooks throw, and rlhf::Error for an observation
  /// token outside the vocabulary.
  ///
  /// quota_groups > 0 (partial rollouts): generation stops after the first engine step at whose
  /// end quota_groups distinct GenerationRequest::group keys (≥ 0) have every sample of every
  /// request with that key finished; every sample not finished then returns with
  /// GenerationResult::interrupted (its tokens so far; a request never admitted returns its
  /// prefix). Needs no hooks (rlhf::Error otherwise). 0: generate everything.
  std::vector<GenerationResult> generate(const std::vector<GenerationRequest>& requests,
                                         const ProgressFn& progress = {},
                                         const TurnHooks* hooks = nullptr,
                                         int64_t quota_groups = 0);

  /// Sleep (OpenRLHF's --vllm_enable_sleep, for an engine colocated with a trainer): frees the
  /// KV cache's storage and the backend's own weight copies (CPU: packed decode panels, bf16
  /// copies, tensor-parallel slices; GPU: the device KV cache and bf16 weights, and the captured
  /// decode graphs that point into them). The host unit buffers stay (weight sync writes them).
  /// Returns the bytes freed (host bytes on the CPU, device bytes on a GPU; 0 when already
  /// asleep). Throws rlhf::Error while sequences are in flight (inside generate(), e.g. from its
  /// progress callback, or KV blocks in use).
  int64_t sleep();
  /// Takes back what sleep() freed, before the next weight sync (a device sync writes the
  /// device units wake() allocates; the other copies are rebuilt by the next generate()).
  /// Returns the bytes allocated (0 when awake). Throws rlhf::Error when an allocation fails.
  int64_t wake();
  /// Between sleep() and wake(): generate() and device_unit_buffers() refuse.
  bool sleeping() const {
    return sleeping_;
  }
  /// This rank's memory plan (EngineMemoryPlan, in the backend's memory) and, in host_weights,
  /// the engine's fp32 host unit buffers.
  struct MemoryPlan {
    EngineMemoryPlan backend;
    int64_t host_weights = 0;
  };
  MemoryPlan memory_plan() const;
  /// One log line of memory_plan(): "host fp32 weights X | CPU weight copies Y | KV cache Z"
  /// (host bytes), or the GPU's device weights, KV cache and buffers (device bytes); with
  /// `sleep`, what sleep() frees while the trainer trains.
  static std::string describe(const MemoryPlan& plan, bool sleep);

  /// EngineOptions::device_sampling from the next generate() on (benchmarks time both ways).
  void set_device_sampling(bool on) {
    opt_.device_sampling = on;
  }
  bool device_sampling() const {
    return opt_.device_sampling;
  }

  /// Counters of the last generate() call.
  const EngineStats& stats() const {
    return stats_;
  }

  /// Samples kept with their KV blocks since a generate() interrupted them
  /// (EngineOptions::keep_interrupted_kv), not yet continued or freed.
  int64_t kept_sequences() const {
    return int64_t(kept_.size());
  }
  /// Frees every kept sample's KV blocks (their continuations will be prefilled again: e.g. at a
  /// checkpoint, whose resumed run has no KV cache to continue from). Returns how many.
  int64_t release_kept();

 private:
  struct Seq;
  struct Run;   // one generate() call's bookkeeping (rollout/engine_run.h)
  struct Plan;  // the validated requests' per-sample limits (rollout/engine_run.h)
  struct Work;  // the decode batch's host arrays and the samplers
  // Validates the requests (the errors generate() documents) and works out each one's capped
  // max_new_tokens and KV blocks per sample.
  Plan validate(const std::vector<GenerationRequest>& requests) const;
  // Admits waiting requests, first come first served, while decode slots and KV blocks allow;
  // the groups admitted together are prefilled together, up to prefill_batch_tokens a forward.
  void admit(const std::vector<GenerationRequest>& requests, Run& run);
  /// Samples [first, first + n) of request `index`, admitted to start.
  struct Admission {
    int64_t index = 0, first = 0, n = 0;
  };
  // Each admitted group: allocates its samples' KV blocks, prefills its prompt once (all the
  // groups' prompts in one backend call, copied to each group's other samples) and samples each
  // one's first token.
  void start_groups(const std::vector<GenerationRequest>& requests,
                    const std::vector<Admission>& groups, Run& run);
  // The decode inputs (tokens, positions, lengths, block table) of the active sequences: one row
  // per token to feed (the last sampled token, then any observation tokens).
  /// Whether observation tokens go one decode step each (EngineOptions::observations_row_by_row,
  /// or a backend that takes one row per sequence).
  bool observations_row_by_row() const;
  DecodeBatch prepare_decode(const std::vector<Seq*>& active);
  // One decode step over `batch` (the active sequences), each one's next token into
  // work_->sampled: drawn on the device when the backend can for all of them
  // (EngineOptions::device_sampling), else by the host Sampler from the step's logits. by_row:
  // observations_row_by_row() (a sequence still feeding one samples nothing). Throws
  // rlhf::Error when a sampling sequence's logits are not finite.
  void decode_step(const std::vector<Seq*>& batch, bool by_row);
  // One decode step over run.active, then a token sampled for each and routed (Run::append):
  // finished ones leave, those whose turn ended move to run.turning.
  void decode_and_sample(Run& run);
  // Continuations that match a kept sample (rollout/engine_kept.cpp) go straight to run.active on
  // its blocks and leave run.pending; a kept sample a request asks for but does not continue
  // is freed, the others stay.
  void resume_kept(const std::vector<GenerationRequest>& requests, Run& run);
  // Frees kept samples, oldest first, until at least `blocks` KV blocks came back or none is
  // left; returns the blocks freed (admission calls it before it would wait).
  int64_t evict_kept(int64_t blocks);

  model::ParamLayout layout_;
  EngineOptions opt_;
  EngineWeights weights_;
  TpGroup tp_;
  std::unique_ptr<EngineBackend> backend_;  // runs the model: CPU, or GPU with options.cuda
  std::unique_ptr<Work> work_;
  bool device_weights_current_ = false;             // the device units were written directly
  std::unique_ptr<model::LoraLayout> lora_layout_;  // set_lora
  std::vector<float> lora_;
  EngineStats stats_;
  bool sleeping_ = false;    // sleep() without wake()
  bool generating_ = false;  // inside generate(): sleep() refuses
  /// Samples interrupted with EngineOptions::keep_interrupted_kv, holding their KV blocks
  /// (Seq::prompt set), oldest first, until a generate() continues or evicts them.
  std::vector<std::unique_ptr<Seq>> kept_;
};

}  // namespace rlhf::rollout
