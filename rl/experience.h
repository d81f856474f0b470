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
  std::vector<int32_t> resp_len;  ///< (B) response tokens (sampled and observation)
  std::vector<int32_t> act_len;   ///< (B) action tokens: sampled by the model (mask 1)
  /// (B, Tr) action mask: 1 at tokens the model sampled, 0 at environment observations
  /// (multi-turn: context, with no loss, KL or entropy) and past the response. Empty when every
  /// sample is single-turn (then every token below resp_len is an action).
  std::vector<uint8_t> mask;
  std::vector<double> score;  ///< (B) reward per sample (after normalisation if asked)
  std::vector<float> lp_old, lp_ref, values, kl, advantages, returns;  ///< (B, Tr)
  /// (B, Tr) the engine's sampling log-probs (Sample::gen_logprobs; 0 at observations), or empty
  /// when some sample carries none (then no off-policy correction and no mismatch metrics).
  std::vector<float> lp_rol;
  /// The old-log-prob pass was skipped (PpoTrainer::old_logprobs_are_current): lp_old and kl are
  /// zeros here, and the update takes lp_old = sg[lp] from its own forward pass, where the two are
  /// equal by construction (one optimizer step on the policy that generated the batch).
  bool lp_old_is_current = false;
  /// Σ act_len: the action tokens of the step (what every loss and metric averages over).
  int64_t response_tokens() const {
    int64_t n = 0;
    for (int32_t l : act_len) n += l;
    return n;
  }
  /// Whether token t of sample i is an action (t < resp_len[i], and mask 1 where there is one).
  bool is_action(int64_t i, int64_t t) const {
    return t < resp_len[size_t(i)] && (mask.empty() || mask[size_t(i * Tr + t)] != 0);
  }
};

}  // namespace rlhf::rl
