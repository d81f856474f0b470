// One RL step (docs/design.md, "One RL step") as a type: generation on the engines, rewards,
// experience, advantages, the PPO/GRPO updates, and the weight sync into the engines — each phase
// timed with its communication. The caller builds the parts (models, engine, sync, prompts,
// rewards: see rl/rl_run.h) and calls step() until done; state() and load_state() are what a
// checkpoint keeps besides the weights and moments.
//
// Determinism: sampling uses a counter-based stream keyed by (seed, the prompt's global
// position), the prompt order is a seeded permutation per episode, and the experience is put in a
// canonical order — so a run does not depend on how many engines there are, and resuming from a
// checkpoint continues bit for bit.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <deque>
#include <functional>
#include <vector>

#include "io/tokenizer.h"
#include "parallel/comm.h"
#include "parallel/topology.h"
#include "parallel/weight_sync.h"
#include "rl/episodes.h"
#include "rl/partial_rollout.h"
#include "rl/ppo_trainer.h"
#include "rl/prompts.h"
#include "rl/rewards.h"
#include "rollout/engine.h"
#include "rollout/samples.h"
#include "rollout/sampling.h"

namespace rlhf::rl {

/// What one RL step does, beyond the trainer's own options (OpenRLHF flag names).
struct RlStepOptions {
  int64_t rollout_batch_size = 1024;  ///< --rollout_batch_size: prompts per step
  int64_t n_samples_per_prompt = 1;   ///< --n_samples_per_prompt
  int64_t generate_max_len = 1024;    ///< --generate_max_len (capped by the model's context)
  int64_t max_len = 0;  ///< --max_len: prompt + response tokens per sample (0 = no such cap)
  rollout::SamplingParams sampling;  ///< --temperature, --top_p, --top_k, --greedy; seed
  int64_t max_epochs = 1;            ///< --max_epochs (for the trained-token count)
  /// DAPO dynamic sampling (Yu et al. 2025, §3.2; --dynamic_filtering): a group of samples is
  /// kept iff lo < mean(its scores) < hi (--dynamic_filtering_reward_range); dropped groups are
  /// replaced by generating for further prompts, up to max_num_gen_batches rounds per step.
  bool dynamic_filtering = false;
  double filter_lo = 0.0, filter_hi = 1.0;
  int64_t max_num_gen_batches = 4;  ///< --max_num_gen_batches (veRL's name)
  /// DAPO overlong shaping (eq. 13): --overlong_buffer_len (0 = off), --overlong_penalty_factor.
  int64_t overlong_buffer_len = 0;
  double overlong_penalty_factor = 1.0;
  int64_t log_completions = 0;  ///< --log_completions: every N steps, log_samples (0 = off)
  /// One-step off-policy training (--async_train; docs/algorithms.md "Async"): with dedicated
  /// generation ranks, the engines generate the rollout of a later step while the trainers train
  /// on this one. async_queue_size k (--async_queue_size): a rollout generated with the weights
  /// of version v is trained at version ≤ v + k; k = 0 is the synchronous loop.
  bool async_train = false;
  int64_t async_queue_size = 1;
  /// The run has an environment (--env_command; RlStepParts::episodes.env on the generation
  /// ranks): every rank then records its metrics (env_s, turns, observation tokens).
  bool environment = false;
  /// Steps the run will take (-1 = unknown): the engines do not generate ahead past the last.
  int64_t total_steps = -1;
  /// Partial rollouts (--partial_rollout; rl/partial_rollout.h): every round adds
  /// rollout_batch_size fresh prompts to the groups in flight, and the engines stop once the
  /// step has rollout_batch_size finished groups; the others continue next round under the new
  /// weights. max_staleness (--max_staleness): versions a sample's oldest token may lag the
  /// engines' weights before the sample is dropped and generated again.
  bool partial_rollout = false;
  int64_t max_staleness = 8;
  /// --vllm_enable_sleep, for colocated engines (the caller sets it only then): each engine
  /// sleeps (rollout::Engine::sleep: KV cache and weight copies freed) once the step's rollout
  /// is generated and wakes before the weight sync; metrics sleep_freed_bytes and sleep_s.
  bool enable_sleep = false;
};

/// What a step trained on, for --log_completions: one entry per kept sample, in training order.
struct StepSamples {
  int64_t step = 0;  ///< 1-based
  std::vector<std::string> prompts, completions;
  std::vector<double> scores, advantages;  ///< advantage of each sample's first token
  std::vector<int64_t> response_lengths;
  std::vector<bool> stopped;
};

/// The parts a step drives, built by the caller. A pointer is null on ranks without that role.
struct RlStepParts {
  const parallel::Topology* topology = nullptr;  ///< every rank
  parallel::Comm* world = nullptr;       ///< every rank: the sample gather and the metrics record
  PpoTrainer* trainer = nullptr;         ///< training ranks (collective over train_comm)
  parallel::Comm* train_comm = nullptr;  ///< training ranks
  rollout::Engine* engine = nullptr;     ///< ranks with a generation engine
  /// Rule or command reward (run on train rank 0); null: none. A reward model of the trainer
  /// scores too (added to it).
  RewardFn* reward = nullptr;
  PromptSource* prompts = nullptr;           ///< every rank (all read the same prompts)
  const io::Tokenizer* tokenizer = nullptr;  ///< decodes completions for the rule rewards
  /// Puts the trainer's weights into every engine; collective over the world.
  std::function<parallel::SyncStats()> sync_weights;
  /// Multi-turn episodes (--env_command, --env_max_turns, --stop_strings): the environment on
  /// ranks with an engine (one per engine, run by its TP rank 0). A sample's score is the
  /// environment's reward when it gave one, else the rule reward (then plus the reward model and
  /// the overlong shaping, as always).
  EpisodeOptions episodes;
  /// Receives the trained samples every --log_completions steps, on train rank 0 (may be empty).
  std::function<void(const StepSamples&)> log_samples;
};

/// The RL loop's step. Collective over the world: every rank constructs it and calls step(),
/// state() and load_state() in the same order.
class RlStep {
 public:
  /// steps_per_episode: whole rollout batches in one pass over the prompts (the prompts left
  /// over at the end of a pass are not used in it).
  RlStep(const RlStepParts& parts, const RlStepOptions& options, int64_t steps_per_episode);

  /// Runs the next step: generation, rewards, experience, training, weight sync. Returns its
  /// metrics record (the same on every rank; the field names and units of metrics.jsonl).
  /// Throws rlhf::Error from any phase (a reward command failing, a non-finite gradient, ...).
  nlohmann::json step();

  /// Steps done so far (0-based index of the next step).
  int64_t steps_done() const { return step_; }
  /// Generation rounds so far (one per step, more with dynamic filtering): the prompt cursor.
  int64_t rounds_done() const { return round_; }

  /// What a checkpoint keeps of the loop (meaningful on training ranks): the step, the generation
  /// rounds, the KL coefficient, the optimizers' step counts, the running reward moments, the
  /// prompt position, and with --async_train the rollouts generated ahead ("async_queue": their
  /// samples, scores and weight versions, so a resumed run trains on exactly them), and with
  /// --partial_rollout the groups in flight ("partial_pool": their tokens, per-token versions and
  /// engine log-probs).
  nlohmann::json state() const;
  /// Restores state(): every rank passes the same record (from train rank 0). Throws rlhf::Error
  /// naming a missing key.
  void load_state(const nlohmann::json& state);
  /// At a checkpoint (every rank): this rank's engine frees the KV blocks it kept for carried
  /// samples (rollout::EngineOptions::keep_interrupted_kv), so the next step prefills them again
  /// as a run resumed from the checkpoint (which has no KV cache to continue from) does.
  void release_kept_kv();

  /// Broadcasts a JSON value from rank `root` of `comm` to every rank (a value or a record).
  static nlohmann::json broadcast_json(const nlohmann::json& j, int root, parallel::Comm& comm);

 private:
  // A rollout ready to train on: its kept samples and scores (training ranks), the weight version
  // the engines generated it with (steps done then), and its generation/reward metrics.
  struct Batch {
    std::vector<rollout::Sample> samples;
    std::vector<double> scores;
    int64_t version = 0;
    nlohmann::json rec = nlohmann::json::object();
  };
  // Generates (and scores) the next rollout: collect() into a Batch.
  Batch next_batch();
  // Whether another rollout should be generated now: one that some step will train on, given
  // `in_hand` rollouts taken off the queue by the current step.
  bool wants_batch(int64_t in_hand) const;
  // Trains on a popped batch (training ranks): resize to whole optimizer steps, train() or the
  // empty-step record.
  void train_batch(Batch& b, nlohmann::json& rec);
  // The global prompt position of prompt i (0..rollout_batch_size−1) of generation round r.
  int64_t prompt_position(int64_t round, int64_t i) const;
  // Phase 1: this engine's share of the round's prompts, all samples of them; gathered to all.
  std::vector<rollout::Sample> generate(int64_t round, nlohmann::json& totals);
  // Phase 2: one score per sample (rule reward + reward model + overlong shaping), on training
  // ranks.
  std::vector<double> score(int64_t round, const std::vector<rollout::Sample>& samples,
                            nlohmann::json& totals);
  // score() of samples whose prompt_pos is the global prompt position (partial rollouts).
  std::vector<double> score_at(const std::vector<rollout::Sample>& samples,
                               const std::function<int64_t(const rollout::Sample&)>& position,
                               nlohmann::json& totals);
  // collect() with --partial_rollout (rl/rl_step_partial.cpp): rounds over the pool of groups in
  // flight until rollout_batch_size groups finished; those, oldest first, are the step's.
  void collect_partial(std::vector<rollout::Sample>& kept, std::vector<double>& kept_scores,
                       nlohmann::json& rec);
  // One partial round: this engine's pending groups with their quota, gathered into the pool.
  void generate_partial(int64_t quota, nlohmann::json& totals, PartialStats& st);
  // After a round's generate() on every rank (collective over world): adds the engines' decode
  // steps to totals — gen_decode_s (slowest rank), gen_decode_steps (most on a rank) and
  // gen_decode_read_bytes (Σ over ranks of the weight bytes each decode step reads plus the K/V
  // bytes attention read: the bytes model of a decode step). generated: this rank's engine ran.
  void add_decode_stats(nlohmann::json& totals, bool generated);
  // The round totals' rates: gen_tokens_per_s, gen_decode_read_GBps (gen_decode_read_bytes over
  // gen_decode_s, GB = 1e9: compare with the machine's memory bandwidth), integer counts.
  static void finish_gen_metrics(nlohmann::json& rec);
  // Phases 1–2 until the step has its groups (one round without dynamic filtering): the kept
  // samples (renumbered 0..K−1 by group) and their scores, on training ranks.
  void collect(std::vector<rollout::Sample>& kept, std::vector<double>& kept_scores,
               nlohmann::json& rec);
  // Phases 3 and 4: experience and the updates, on training ranks.
  void train(const std::vector<rollout::Sample>& samples, const std::vector<double>& scores,
             nlohmann::json& rec);

  RlStepParts p_;
  RlStepOptions opt_;
  int64_t steps_per_episode_;
  int64_t step_ = 0;
  int64_t round_ = 0;
  std::deque<Batch> queue_;  // rollouts generated and not yet trained on (oldest first)
  PartialPool pool_;         // --partial_rollout: groups in flight (the same on every rank)
};

}  // namespace rlhf::rl
