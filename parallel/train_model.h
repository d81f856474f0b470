// TrainModel: one model as a trainer drives it — its training state (ParamStore) and its forward
// and backward — on the CPU (Transformer<float> over the store's UnitProvider) or on the GPU
// (TransformerCuda over a Zero3StoreCuda). The trainers (rlhf sft, rm, ppo, grpo, bench) see
// only this interface, so one code path serves both backends.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "model/forward_batch.h"
#include "model/layout.h"
#include "model/lora.h"
#include "parallel/param_store.h"
#include "parallel/runtime.h"

namespace rlhf::parallel {

class Zero3StoreCuda;

/// One micro-batch of a forward-only sweep: tokens, targets (B, seq_len) int32 and out
/// (B, seq_len) fp32 (log-probs or values), host arrays (model::ForwardBatch).
using ForwardBatch = model::ForwardBatch<float>;

/// Bytes of residual stream a forward sweep holds at once (host fp32 on the CPU, device bf16 on
/// the GPU): the batches that do not fit start a new group, which gathers every unit again
/// (256 MiB: e.g. 116k tokens of a 576-wide model on the CPU).
inline constexpr int64_t kSweepResidualBytes = int64_t(256) << 20;

/// Splits `batches` into consecutive groups whose Σ B·seq_len·bytes_per_token stays within
/// budget_bytes (a batch over the budget on its own is a group). Then, while there are fewer than
/// min_groups groups, the first of the groups with the most batches is split in two (the first
/// half takes the extra batch) and, once every group holds one batch, empty groups are appended:
/// every rank of a ZeRO-3 store must sweep as many groups (each gathers every unit, a collective),
/// so the ranks agree on the largest count (TrainModel's sweeps all-reduce it). Returns the first
/// index of each group followed by batches.size() (an empty group repeats the index); {0} for no
/// batches and min_groups = 0.
std::vector<size_t> sweep_groups(const std::vector<ForwardBatch>& batches, int64_t bytes_per_token,
                                 int64_t budget_bytes, int64_t min_groups = 0);

/// The forward/backward contracts are those of model::Transformer (model/transformer.h): tokens
/// and targets (B, T) int32, lp / entropy / values and their gradients (B, T) fp32, all host
/// arrays; parameter gradients accumulate in the store until store().zero_grads(). Collective
/// over the store's communicator like the store's provider calls.
class TrainModel {
 public:
  virtual ~TrainModel() = default;
  virtual ParamStore& store() = 0;
  const model::ParamLayout& layout() { return store().layout(); }
  /// "cpu" or "cuda".
  virtual const char* device() const = 0;

  /// seqs: sample packing (model::SeqLens): the B·T tokens hold seqs.n samples end to end, each
  /// attending to itself only with positions from 0.
  virtual void forward_lm(const int32_t* tokens, const int32_t* targets, int64_t B, int64_t T,
                          float* lp, float* entropy, bool for_backward,
                          float inv_temperature = 1.0f, model::SeqLens seqs = {}) = 0;
  virtual void backward_lm(const float* dlp, const float* dentropy) = 0;
  virtual void forward_scalar(const int32_t* tokens, int64_t B, int64_t T, float* values,
                              bool for_backward, model::SeqLens seqs = {}) = 0;
  virtual void backward_scalar(const float* dvalues) = 0;
  /// Forward-only passes over micro-batches: each batch's out = its log-probs (forward_lm_sweep)
  /// or values (forward_scalar_sweep), bit for bit those of forward_lm / forward_scalar
  /// (for_backward = false) on that batch; no backward state is left. The batches run unit-major
  /// (model::Transformer::forward_lm_sweep, TransformerCuda::forward_lm_sweep) in groups of
  /// sweep_groups(..., kSweepResidualBytes), so a ZeRO-3 store gathers each unit once per group
  /// rather than once per micro-batch; this default runs them one after another (a model without
  /// sweeps). Collective: the ranks of the training communicator agree on the number of groups
  /// (all-reduced maximum; a rank with fewer runs empty sweeps, which still gather every unit),
  /// so their batches may differ in number and length.
  virtual void forward_lm_sweep(const std::vector<ForwardBatch>& batches, float inv_temperature);
  virtual void forward_scalar_sweep(const std::vector<ForwardBatch>& batches);
  /// Bytes of activation memory (host or device) the model currently holds.
  virtual int64_t activation_bytes() const = 0;
  /// True for a LoRA model (make_lora_train_model): a frozen base with trained adapters.
  virtual bool has_adapters() const { return false; }
  /// LoRA: the passes run with the adapters (true, the policy) or the base alone (false, the
  /// reference policy: the same weights, no second copy). Throws rlhf::Error on a model without
  /// adapters.
  virtual void set_adapters_enabled(bool on);
};

/// The CPU model over `store` (any ParamStore with a host provider). sweep_comm: the store's
/// training communicator, over which the forward sweeps agree on their group count (nullptr: a
/// single rank, or a store without collectives); sweep_budget_bytes: the residual-stream budget
/// of one sweep group (kSweepResidualBytes; tests pass a small one); bf16: its GEMMs compute in
/// bf16 (Transformer::set_bf16, which reads every weight as its bf16 value; throws rlhf::Error
/// without oneDNN), else fp32.
std::unique_ptr<TrainModel> make_cpu_train_model(std::unique_ptr<ParamStore> store,
                                                 bool gradient_checkpointing,
                                                 Comm* sweep_comm = nullptr,
                                                 int64_t sweep_budget_bytes = kSweepResidualBytes,
                                                 bool bf16 = false);

#ifdef RLHF_CUDA
/// The GPU model over `store` (on the current CUDA device); sweep_comm, sweep_budget_bytes as
/// make_cpu_train_model.
std::unique_ptr<TrainModel> make_cuda_train_model(std::unique_ptr<Zero3StoreCuda> store,
                                                  bool gradient_checkpointing,
                                                  Comm* sweep_comm = nullptr,
                                                  int64_t sweep_budget_bytes = kSweepResidualBytes);
#endif

/// The ZeRO flags of a training command (DeepSpeed/OpenRLHF names), as plain values.
struct ZeroOptions {
  int zero_stage = 3;                   ///< --zero_stage: 0 (replicated) or 3 (sharded)
  bool adam_offload = false;            ///< --adam_offload: Adam state + step on the host
  bool gradient_checkpointing = false;  ///< --gradient_checkpointing: recompute activations
  bool zero_keep_params = false;        ///< --zero_keep_params: keep forward's gathers
  /// --lora_rank, --lora_alpha, --target_modules, --lora_dropout: rank 0 trains every weight;
  /// rank > 0 freezes the base and trains LoRA adapters (make_lora_train_model).
  model::LoraConfig lora;
  /// --packing_samples: the trainers pack each micro-batch's samples into one row (model::SeqLens).
  bool packing_samples = false;
};

/// The training state for z.zero_stage: ZeRO-3 shards (with adam_offload, zero_keep_params,
/// and bf16_gather: the CPU's --param_dtype bf16 gathers bf16 shards, Zero3Options), or ZeRO-0
/// replicas (all-reduced gradients), or whole local buffers on a single rank (ZeRO-0 and local,
/// with bf16_gather: bf16 copies of the weights made once per optimizer step, LocalBf16Provider).
/// Throws rlhf::Error for --adam_offload with --zero_stage 0.
std::unique_ptr<ParamStore> make_param_store(const model::ParamLayout& layout, Comm& comm,
                                             const ZeroOptions& z, bool bf16_gather = false);

/// The model a training command trains (or scores with, frozen) on rt's device: on the CPU the
/// store of make_param_store (frozen: a weights-only ZeRO-3 store) with Transformer<float> (in
/// bf16 when rt.bf16); on the GPU a Zero3StoreCuda over rt.device_comm with TransformerCuda.
/// With z.lora enabled and not frozen: make_lora_train_model (parallel/lora_store.h). Call on
/// training ranks only. Throws rlhf::Error for --zero_stage 0 on the GPU, and for LoRA on a model
/// with a value or reward head (its head would stay frozen) or on the GPU.
std::unique_ptr<TrainModel> make_train_model(const model::ParamLayout& layout, TrainRuntime& rt,
                                             const ZeroOptions& z, bool frozen = false);

/// Logs this rank's memory (rank 0 prints the max over ranks of each part): params, grads,
/// optimizer, gather buffers, activations and the process's peak resident size. Collective.
void log_memory(const ParamStore& store, int64_t activation_bytes, Comm& comm);

}  // namespace rlhf::parallel
