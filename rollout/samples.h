// The samples of one generation round: what the engines produced, as plain records that travel
// between ranks (serialized bytes through a parallel::Comm) and are put in a canonical order, so
// the result does not depend on which engine made which sample.
#pragma once

#include <cstdint>
#include <vector>

#include "parallel/comm.h"
#include "rollout/finish_reason.h"

namespace rlhf::rollout {

/// One generated sample.
struct Sample {
  int64_t prompt_pos = 0;           ///< position of its prompt in the round (0..prompts−1)
  int64_t sample_index = 0;         ///< 0..n_samples_per_prompt−1
  std::vector<int32_t> prompt;      ///< prompt token ids (BOS included)
  std::vector<int32_t> response;    ///< generated ids (ends with EOS when stopped)
  std::vector<float> gen_logprobs;  ///< the engine's sampling log-probs, one per response token
  /// Ended on its own (EOS, a stop string or the environment's done; see ended_naturally), not
  /// cut by --generate_max_len or --env_max_turns.
  bool stopped = false;
  FinishReason finish = FinishReason::kLength;  ///< why it ended
  /// Per response token: 1 = sampled by the model, 0 = an environment observation (context: no
  /// loss, no KL, no entropy). Empty = every token sampled (single-turn generation).
  std::vector<uint8_t> action_mask;
  int32_t turns = 1;            ///< model turns of the episode
  bool has_env_reward = false;  ///< the environment gave a reward (env_reward)
  double env_reward = 0;        ///< the last reward the environment gave for this episode
  /// Per response token: the weight version (RL steps done) of the engine that sampled it.
  /// Empty = not recorded (all from the rollout's one version). Partial rollouts
  /// (--partial_rollout) record it: a continued sample mixes versions.
  std::vector<int32_t> versions;
  /// A partial rollout's sample that has not finished yet (the quota interrupted it).
  bool interrupted = false;
};

/// Whether response token k of s was sampled by the model (action mask 1).
inline bool is_action(const Sample& s, size_t k) {
  return s.action_mask.empty() || s.action_mask[k] != 0;
}

/// Response tokens of s sampled by the model (action mask 1).
int64_t action_tokens(const Sample& s);

/// Bytes of a sample list; deserialize_samples(serialize_samples(x)) == x. (The bytes start with
/// a format tag; deserialize_samples also reads the earlier, untagged single-turn form.)
std::vector<uint8_t> serialize_samples(const std::vector<Sample>& samples);
/// Throws rlhf::Error on a malformed buffer.
std::vector<Sample> deserialize_samples(const uint8_t* data, size_t size);

/// Sorts by (prompt_pos, sample_index): the canonical order.
void sort_samples(std::vector<Sample>& samples);

/// Gathers every rank's samples to every rank of `comm` (Comm::all_gather_bytes, accounted to
/// comm) in the canonical order. Collective. Throws rlhf::Error when one round's samples reach
/// 2 GiB.
std::vector<Sample> gather_samples(const std::vector<Sample>& local, parallel::Comm& comm);

}  // namespace rlhf::rollout
