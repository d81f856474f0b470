// `rlhf bench rl`: GRPO steps of the real RL loop (rl::run_rl) on a randomly initialised model
// of the stories15M shape, on every rank of MPI_COMM_WORLD: the time of each phase (gen, reward,
// logprob, train, sync) and its share of the step, the step's achieved GFLOP/s against the same
// run's sgemm on the training GEMM shapes, and generation tokens/s at the last step against the
// first (the drop colocated engines can show once training has started).
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>

#include "bench/bench_train.h"
#include "model/config.h"

namespace rlhf::bench {

struct BenchRlOptions {
  model::ModelConfig config = stories15m_config();
  int64_t prompts_per_step = 8;    ///< --rollout_batch_size
  int64_t samples_per_prompt = 8;  ///< --n_samples_per_prompt (8 x 8 = 64 samples)
  int64_t new_tokens = 128;        ///< --generate_max_len
  int64_t micro_batch = 4;         ///< --micro_train_batch_size and --micro_rollout_batch_size
  int64_t steps = 10;              ///< RL steps (tokens/s compared at the last vs the first)
  /// GRPO steps of the dynamic-filtering comparison (the tiny model on 1-digit additions, with
  /// and without --dynamic_filtering); 0 skips it.
  int64_t filter_steps = 60;
  /// Steps of each run of the async comparison (2 ranks only: 1 training + 1 generation rank,
  /// two shapes, synchronous and with --async_train); 0 skips it.
  int64_t async_steps = 6;
  uint64_t seed = 42;
  std::string work_dir = "/tmp";  ///< a fresh rlhf_bench_rl_XXXXXX folder in it, removed after
};

/// Collective over MPI_COMM_WORLD. Writes the model config and a random reward model (the same
/// shape with a scalar head: a rule reward would need a tokenizer of the model's 32000 ids) into a
/// temporary folder, runs `rlhf grpo` on the builtin addition prompts (2 digits) with
/// `opt.steps` steps, then (rank 0) emits from its metrics.jsonl:
///   {"bench":"rl_phase", phase, seconds, share, comm_s, gflops_per_s}  per phase, mean of steps
///     2..N (step 1 warms caches); "step" is the whole step;
///   {"bench":"rl", ranks, samples, new_tokens, step_s, gflop_per_step, gflops_per_s_per_rank,
///    sgemm_gflops_per_s, ratio_to_sgemm, gen_tokens_per_s_first, gen_tokens_per_s_last,
///    gen_tokens_per_s_ratio};
/// then (filter_steps > 0) a 150-step SFT warm start of the tiny byte-level model on 1-digit
/// additions and filter_steps GRPO steps with the math reward without and with
/// --dynamic_filtering, each a row
///   {"bench":"rl_filter", dynamic_filtering, steps, step_s, samples_generated,
///    samples_trained, seconds_per_trained_sample, reward_first_tenth, reward_last_tenth};
/// then (async_steps > 0, 2 ranks) GRPO on 1 training + 1 generation rank, without and with
/// --async_train (queue 1), in two shapes: "main" (the main run's) and "rule_reward" (DAPO-style:
/// the same shape with the byte-level vocabulary, the math rule instead of a reward model, no
/// reference, 1 prompt × 8 samples × 512 new tokens), a row each
///   {"bench":"rl_async", shape, steps, sync_step_s, async_step_s, speedup,
///    speedup_full_overlap, async_wait_s, sync_gen_s, sync_train_s, sync_trainer_s}  (means over
///   steps 2..N), where speedup_full_overlap = sync_step_s / max(sync_gen_s, sync_trainer_s):
///   what hiding all of generation behind the synchronous run's trainer work (sync_trainer_s =
///   sync_step_s − sync_gen_s) would give — an estimate, not a bound (the async trainer's own
///   step can be a little shorter).
/// FLOPs per step, with S the tokens of all sequences (prompt + response) and T their mean length:
/// S·F_fwd(T) for generation (prefill and decode), S·F_fwd,reward(T) for the reward model,
/// S·F_fwd(T)·(old + reference) for the old (unless skipped) and reference log-probs,
/// S·F_train(T)·max_epochs for the update (model::forward_flops_per_token /
/// training_flops_per_token). Throws rlhf::Error when the folder cannot be made.
void run_bench_rl(const BenchRlOptions& opt, const Emit& emit);

}  // namespace rlhf::bench
