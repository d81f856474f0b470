// Partial rollouts (--partial_rollout; Kimi k1.5 §2.6.2, slime/OpenRLHF): a step's generation
// ends once the step has its quota of finished groups; the samples still going are interrupted,
// keep their tokens and engine log-probs, and continue in the next round under the newer weights.
// Every response token records the weight version (RL steps done) of the engine that sampled it;
// a sample whose oldest token is more than --max_staleness versions behind the engines' weights is
// dropped and generated again from its prompt. This file holds the pool of groups in flight and
// how a round's engine requests, quotas and results map onto it; rl/rl_step.cpp drives it.
//
// A continuation goes on from the KV blocks its engine kept when the quota interrupted it
// (--partial_rollout_kv keep, the default: rollout::EngineOptions::keep_interrupted_kv — the keys
// and values of its earlier tokens stay those of the weights that sampled them, as in a vLLM
// engine paused across a weight update), or is prefilled again under the new weights
// (--partial_rollout_kv recompute, AReaL's choice: one prefill of the prompt and the tokens kept).
// A group stays on the engine that first generated for it, so its samples find their blocks. The
// checkpoint holds only tokens: the step after a checkpoint recomputes (RlStep::release_kept_kv),
// so a resumed run continues exactly as the uninterrupted one.
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
  /// The engine that generates it (PartialPool::deal): fixed once dealt, so a sample continues
  /// where its kept KV blocks are. −1: not dealt yet.
  int engine = -1;
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
  /// continuations that went on from the KV blocks their engine kept (no prefill), and the
  /// cached positions they did not prefill again
  int64_t kv_resumed = 0, kv_resumed_positions = 0;
  int64_t reprefilled = 0;  ///< continuations prefilled again (recompute, or no kept KV)
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
  /// Pending groups dealt to each engine of [0, E) (the others not counted).
  std::vector<int64_t> pending_per_engine(int E) const;

  /// Gives every pending group without an engine of [0, E) one: in pool order, each to the engine
  /// with the fewest pending groups (the lowest index on a tie). A group keeps its engine after.
  void deal(int E);
  /// The quota of each of E engines for the pending groups (after deal(E)), summing to
  /// min(quota, pending groups): dealt one at a time, never more than an engine's groups.
  std::vector<int64_t> engine_quotas(int64_t quota, int E) const;
  /// The same from each engine's pending group count `have`.
  static std::vector<int64_t> engine_quotas(const std::vector<int64_t>& have, int64_t quota);

  /// Engine e's requests for the pending groups `pending` (pending_groups(), after deal()):
  /// pending group k dealt to e asks for its unfinished samples — one request of n samples when
  /// none has a token, else one continuation request per unfinished sample
  /// (GenerationRequest::prefix, its engine log-probs). Each request has id = the group's
  /// position, group = k, the sampling parameters given and max_new_tokens = max_new(prompt).
  std::vector<rollout::GenerationRequest> requests(
      const std::vector<int64_t>& pending, int e, const rollout::SamplingParams& sampling,
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

  /// The pool for a checkpoint: the samples' bytes (serialize_samples, prompt_pos = position),
  /// each group's engine and `drawn` — a group is n consecutive samples. from_json inverts it
  /// (a checkpoint without engines leaves the groups to deal); throws rlhf::Error when the
  /// sample count is not a multiple of n.
  nlohmann::json to_json() const;
  void from_json(const nlohmann::json& j);

 private:
  int64_t n_, max_staleness_;
  std::vector<PartialGroup> groups_;
};

/// The smallest weight version among a sample's tokens (`none` when it has none recorded).
int64_t oldest_version(const rollout::Sample& s, int64_t none);

}  // namespace rlhf::rl
