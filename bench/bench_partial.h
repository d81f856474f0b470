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
  int64_t steps = 12;         ///< partial-rollout steps (the mean is over steps 2..steps)
  int64_t sync_steps = 3;     ///< synchronous steps (their mean)
  int64_t max_staleness = 8;  ///< --max_staleness
  uint64_t seed = 42;
};

/// Rank 0 only (others return). Emits one row
///   {"bench":"partial", samples, short_tokens, long_tokens, sync_step_s, partial_step_s, ratio,
///    carried_mean, interrupted_mean, dropped, gen_tokens_sync, gen_tokens_partial}
/// where a step is its generation phase (what partial rollouts change; the trainer's phases cost
/// the same per trained sample): sync_step_s = mean of generating `samples` fresh groups to the
/// end; partial_step_s = mean over steps 2..N of topping the pool up, one round to the quota
/// (interrupting the rest), and taking the step's groups; ratio = partial / sync. The weight
/// version advances every step (staleness and versions are real; the weights themselves are
/// left unchanged, which does not change the cost).
void run_bench_partial(const BenchPartialOptions& opt, const Emit& emit);

}  // namespace rlhf::bench
