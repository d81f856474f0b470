// `rlhf bench packing`: training throughput on ragged sample lengths with sample packing and
// token-budget micro-batches (--packing_samples --use_dynamic_batch) against the padded
// micro-batches of --micro_train_batch_size samples, on the same global batch (one process).
#pragma once

#include <cstdint>

#include "bench/bench_train.h"
#include "model/config.h"

namespace rlhf::bench {

struct BenchPackingOptions {
  model::ModelConfig config = stories15m_config();
  int64_t samples = 32;  ///< the global batch: samples of one optimizer step
  int64_t len_lo = 64;   ///< sample lengths uniform in [len_lo, len_hi] tokens (seeded)
  int64_t len_hi = 1024;
  int64_t micro_batch = 8;   ///< padded run: samples per micro-batch
  int64_t token_budget = 0;  ///< packed run: tokens per micro-batch (0 = micro_batch · len_hi)
  int64_t steps = 2;         ///< timed passes over the global batch (after one warm-up)
  uint64_t seed = 42;
};

/// Rank 0 only (other ranks return at once). A randomly initialised LM of opt.config on one
/// process (LocalParamStore, Transformer<float>): the same opt.samples random-token samples run
/// forward and backward (LM log-probs, the gradient of their sum) first padded — micro-batches of
/// micro_batch samples in their order, each right-padded to its longest — then packed — runs of
/// samples whose summed length stays within token_budget (rl::token_budget_runs, packed), each
/// one row with block-diagonal attention (rl::pack_rows, model::SeqLens). Emits one row
///   {"bench":"packing", samples, len_lo, len_hi, real_tokens, padded_micro_batches,
///    padded_tokens, padded_s, padded_tokens_per_s, packed_micro_batches, packed_budget,
///    packed_s, packed_tokens_per_s, speedup}
/// with seconds the mean over opt.steps timed passes and tokens/s counting real tokens only.
/// The config's max_position_embeddings is raised to len_hi if below (the weights are random).
/// Throws rlhf::Error unless 2 <= len_lo <= len_hi.
void run_bench_packing(const BenchPackingOptions& opt, const Emit& emit);

}  // namespace rlhf::bench
