// The training part of an RL step's metrics record (metrics.jsonl), as a type: every key is
// written on every step — an empty step (dynamic filtering kept nothing) writes the defaults — so
// the schema of metrics.jsonl never changes from one step to the next.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>

#include "rl/ppo_trainer.h"

namespace rlhf::rl {

/// What the experience and training phases of one step report (rl/rl_step.cpp RlStep::train).
struct TrainRecord {
  PpoStats stats;             ///< the trainer's metrics (losses, KL, norms, mismatch)
  double logprob_s = 0;       ///< seconds of the forward-only passes (make_experience)
  double logprob_comm_s = 0;  ///< their time in train_comm collectives
  int64_t logprob_comm_bytes = 0;
  bool logprob_old_skipped = false;  ///< the old-log-prob pass was skipped (lp_old = the update's)
  int64_t trained_samples = 0;       ///< samples trained on (0 on an empty step)
  double train_s = 0;                ///< seconds of train()
  int64_t train_tokens = 0;          ///< tokens through forward+backward, all epochs

  /// The record's keys and values (seconds, bytes, means over action tokens; metrics.jsonl's
  /// names: kl_mean, policy_loss, ..., mismatch_kl, vllm_kl, is_weight_mean, ...).
  nlohmann::json to_json() const;
};

}  // namespace rlhf::rl
