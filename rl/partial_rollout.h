// Partial rollouts (--partial_rollout; Kimi k1.5 §2.6.2, slime/OpenRLHF): a step's generation
// ends once the step has its quota of finished groups; the samples still going are interrupted,
// keep their tokens and engine log-probs, and continue in the next round under the newer weights.
// Every response token records the weight version (RL steps done) of the engine that sampled it;
// a sample whose oldest token is more than --max_staleness versions behind the engines' weights is
// dropped and generated again from its prompt. This file holds the pool of groups in flight and
// how a round's engine requests, quotas and results map onto it; rl/rl_step.cpp drives it.
//
// Continuations are prefilled again under the new weights (the prompt and the tokens kept, one
// prefill): no KV block outlives an engine call, so weight sync never has to reconcile a cache
// computed with older weights, and the checkpoint holds only tokens.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <vector>

#include "rollout/engine.h"
#include "rollout/samples.h"

namespace rlhf::rl {

/// One prompt's group of n samples in flight. samples[j].sample_index = j; a sample with
/// interrupted = true has not finished (its response may be empty: nothing generated yet).
struct PartialGroup {
  int64_t pos = 0;  ///< the prompt's global position (PromptSource::at; the random stream's key)
  std::vector<rollout::Sample> samples;
  /// Whether every sample finished.
  bool complete() const;
};

/// What the pool did in one step (metrics.jsonl keys partial_*; see PartialPool).
struct PartialStats {
  int64_t dropped = 0;            ///< samples dropped as stale and regenerated from their prompt
  int64_t interrupted = 0;        ///< samples the quota interrupted in this step's rounds
  int64_t carried = 0;            ///< samples left in flight for later steps (finished or not)
  int64_t trained_carried = 0;    ///< taken samples with tokens from an older version
  double age_mean = 0;            ///< taken samples: mean of version − min_t v_t
  int64_t age_max = 0;            ///< taken samples: max of version − min_t v_t
  double old_token_fraction = 0;  ///< taken samples' response tokens with v_t < version
  /// The metrics record's fields.
  nlohmann::json to_json() const;
};

/// The groups in flight between rounds, oldest first. The same on every rank (built from
/// gathered samples), so a checkpoint from any rank restores it.
class PartialPool {
 public:
  /// n: samples per prompt (>= 1); max_staleness: versions a sample's oldest token may lag
  /// (>= 0).
  PartialPool(int64_t n_samples, int64_t max_staleness);

  /// Resets every sample (finished or not) whose oldest token is more than max_staleness
  /// versions behind `version` to an empty, unfinished sample; returns how many.
  int64_t drop_stale(int64_t version);
  /// Appends a fresh group per prompt position, all samples unfinished and empty.
  void add_fresh(const std::vector<int64_t>& positions,
                 const std::vector<std::vector<int32_t>>& prompts);
  /// Fresh prompts a round adds for a step of `batch` groups (--rollout_batch_size): enough that
  /// the groups still to generate number what the step lacks plus ⌈batch/8⌉ (at least 1) —
  /// the engines always run a few groups more than the quota, so up to that many stragglers
  /// are interrupted and carried instead of holding the step (slime's over-sampling, in rounds).
  int64_t fresh_needed(int64_t batch) const;
  /// Groups whose samples all finished.
  int64_t complete_groups() const;
  /// Fresh prompts drawn so far (the prompt cursor of a run with partial rollouts).
  int64_t drawn = 0;
  /// Indices (into groups()) of the groups with a sample still to generate, in pool order.
  std::vector<int64_t> pending_groups() const;

  /// The quota of each of E engines, summing to min(quota, pending groups), when pending group
  /// k goes to engine k mod E: dealt one at a time, never more than an engine's groups.
  static std::vector<int64_t> engine_quotas(int64_t pending, int64_t quota, int E);

  /// Engine e's requests (of E) for the pending groups `pending` (pending_groups()): pending
  /// group k (k mod E = e) asks for its unfinished samples — one request of n samples when none
  /// has a token, else one continuation request per unfinished sample (GenerationRequest::prefix,
  /// its engine log-probs). Each request has id = the group's position, group = k, the sampling
  /// parameters given and max_new_tokens = max_new(prompt).
  std::vector<rollout::GenerationRequest> requests(
      const std::vector<int64_t>& pending, int e, int E, const rollout::SamplingParams& sampling,
      const std::function<int64_t(const std::vector<int32_t>&)>& max_new) const;
  /// The engine's results as samples with prompt_pos = the request's group key (k), for
  /// gather_samples; versions: the prefix's, then `version` for every new token.
  std::vector<rollout::Sample> to_samples(const std::vector<rollout::GenerationRequest>& requests,
                                          std::vector<rollout::GenerationResult>&& results,
                                          const std::vector<int64_t>& pending,
                                          int64_t version) const;
  /// Puts gathered samples (prompt_pos = group key k into `pending`) back into their groups;
  /// returns how many came back interrupted.
  int64_t merge(std::vector<rollout::Sample>&& gathered, const std::vector<int64_t>& pending);

  /// Removes and returns the first `q` complete groups (oldest first), their samples with
  /// prompt_pos = the global prompt position; stats (taken samples' ages against `version`,
  /// samples left in flight) into `st`.
  std::vector<rollout::Sample> take(int64_t q, int64_t version, PartialStats& st);

  const std::vector<PartialGroup>& groups() const { return groups_; }
  bool empty() const { return groups_.empty(); }
  /// Samples in the pool (finished or not).
  int64_t samples() const;

  /// The pool for a checkpoint: the samples' bytes (serialize_samples, prompt_pos = position)
  /// and `drawn` — a group is n consecutive samples. from_json inverts it; throws
  /// rlhf::Error when the sample count is not a multiple of n.
  nlohmann::json to_json() const;
  void from_json(const nlohmann::json& j);

 private:
  int64_t n_, max_staleness_;
  std::vector<PartialGroup> groups_;
};

/// The smallest weight version among a sample's tokens (`none` when it has none recorded).
int64_t oldest_version(const rollout::Sample& s, int64_t none);

}  // namespace rlhf::rl
