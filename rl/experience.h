// The experience of one RL step: the per-sample and per-token training data the trainers derive
// from the generated samples (old/ref log-probs, values, KL, advantages).
#pragma once

#include <cstdint>
#include <vector>

#include "rollout/samples.h"

namespace rlhf::rl {

using rollout::Sample;

/// Per-sample and per-token training data of one RL step, in the canonical sample order.
/// Per-token arrays are (B, Tr) row-major with Tr = the longest response; entries past a
/// sample's response are 0.
struct Experience {
  int64_t B = 0, Tr = 0;
  std::vector<const Sample*> samples;
  std::vector<int32_t> resp_len;  ///< (B)
  std::vector<double> score;      ///< (B) reward per sample (after normalisation if asked)
  std::vector<float> lp_old, lp_ref, values, kl, advantages, returns;  ///< (B, Tr)
  /// The old-log-prob pass was skipped (PpoTrainer::old_logprobs_are_current): lp_old and kl are
  /// zeros here, and the update takes lp_old = sg[lp] from its own forward pass, where the two are
  /// equal by construction (one optimizer step on the policy that generated the batch).
  bool lp_old_is_current = false;
  /// Σ resp_len: the response (action) tokens of the step.
  int64_t response_tokens() const {
    int64_t n = 0;
    for (int32_t l : resp_len) n += l;
    return n;
  }
};

}  // namespace rlhf::rl
