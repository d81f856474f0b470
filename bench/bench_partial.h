// `rlhf bench partial`: partial rollouts (--partial_rollout) against the synchronous rollout on a
// step whose samples are all short but one in `samples` that is `long_factor`× longer — the
// straggler that holds a synchronous step. The real engine and the real pool of groups in flight
// (rl/partial_rollout.h) on the stories15M shape with random weights; lengths are set by
// max_new_tokens with EOS ignored, so every run generates the same tokens per sample.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>

#include "bench/bench_train.h"
#include "model/config.h"

namespace rlhf::bench {

struct BenchPartialOptions {
  model::ModelConfig config = stories15m_config();
  int64_t samples = 64;       ///< groups per step (one sample each): --rollout_batch_size
  int64_t short_tokens = 32;  ///< new tokens of an ordinary sample
  int64_t long_factor = 8;    ///< the straggler's new tokens = long_factor × short_tokens
  int64_t prompt_len = 16;
  /// Partial-rollout steps; from the second on each is followed by a synchronous step, and
  /// each side's median over those steps is reported.
  int64_t steps = 8;
  int64_t max_staleness = 8;  ///< --max_staleness
  bool cuda = false;          ///< --device cuda: the GPU engine (bf16, CUDA graphs)
  uint64_t seed = 42;
};

/// Rank 0 only (others return). Emits one row
///   {"bench":"partial", samples, short_tokens, long_tokens, steps, sync_step_s, partial_step_s,
///    ratio, partial_recompute_step_s, ratio_recompute, sync_tail_s, ratio_no_tail,
///    sync_step_cpu_s, partial_step_cpu_s, ratio_cpu, ratio_recompute_cpu, sync_prefill_s,
///    partial_prefill_s, partial_prefill_tokens, partial_kv_resumed_mean,
///    partial_recompute_prefill_s, partial_recompute_prefill_tokens, carried_mean,
///    interrupted_mean, dropped, gen_tokens_sync, gen_tokens_partial, device_sampled_share}
/// where a step is its generation phase (what partial rollouts change; the trainer's phases cost
/// the same per trained sample): a synchronous step generates `samples` fresh groups to the end;
/// a partial step tops the pool up, runs one round to the quota (interrupting the rest) and takes
/// the step's groups. Partial steps come in two kinds, each on its own engine and pool: carried
/// samples continue from the KV blocks their engine kept (--partial_rollout_kv keep: partial_*,
/// ratio) or are prefilled again (recompute: partial_recompute_*, ratio_recompute). Steps
/// alternate (keep, recompute, synchronous, keep, ...; the first step of each kind is not timed:
/// nothing is carried yet, and GPU engines upload their weights and capture their graphs in it)
/// and each side's median is reported, as wall time and as process
/// CPU time (user + system: steadier on a shared machine); ratio = partial / sync.
/// sync_tail_s: the synchronous step's time after every sample but the straggler finished (the
/// straggler decoding alone); ratio_no_tail = (sync_step_s − sync_tail_s) / sync_step_s, what
/// removing the tail at no cost would give — the bound for the ratio on this machine and shape.
/// *_prefill_s: the engines' prefill time per step (a recompute step's includes re-prefilling the
/// carried samples' tokens); partial_kv_resumed_mean: samples a keep step continued on kept KV. The
/// weight version advances every partial step (staleness and versions are real; the weights
/// themselves are left unchanged, which does not change the cost). A GPU engine then keeps its
/// device weights (Engine::device_weights_updated, as after the RL loop's device weight sync)
/// instead of uploading the host weights at every generate(); a CPU engine packs its weights at
/// every generate() (once a step on either side, as in the loop). device_sampled_share: the share
/// of decode steps whose tokens were drawn on the device (a GPU engine: 1; the CPU: 0).
void run_bench_partial(const BenchPartialOptions& opt, const Emit& emit);

}  // namespace rlhf::bench
