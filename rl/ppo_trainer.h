// The trainer side of one PPO/GRPO step (ALGORITHMS.md): experience (old and reference log-probs,
// values, KL, rewards, advantages) from generated samples, then --max_epochs passes of clipped
// policy (+ KL loss, entropy bonus) and value updates in optimizer steps of --train_batch_size.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/ops/rl_loss.h"
#include "optim/adamw.h"
#include "optim/schedule.h"
#include "parallel/comm.h"
#include "parallel/param_store.h"
#include "parallel/train_model.h"
#include "rollout/advantages.h"
#include "rollout/experience.h"

namespace rlhf::rollout {

/// Algorithm options (OpenRLHF's flags and defaults).
struct PpoOptions {
  AdvantageEstimator estimator = AdvantageEstimator::kGae;
  double gamma = 1.0, lambd = 1.0;
  double init_kl_coef = 0.01;
  model::KlEstimator kl_estimator = model::KlEstimator::kK1;
  bool use_kl_loss = false;  ///< KL as a loss term (GRPO) instead of in the reward
  double kl_target = 0, kl_horizon = 10000;
  double eps_clip_low = 0.2, eps_clip_high = 0.2, dual_clip = 0, value_clip = 0.5;
  double entropy_loss_coef = 0;
  int n_samples_per_prompt = 1;
  int64_t micro_rollout_batch_size = 8;  ///< per rank, forward-only passes
  int64_t train_batch_size = 128;        ///< global samples per optimizer step
  int64_t micro_train_batch_size = 4;    ///< per rank per forward/backward
  int64_t max_epochs = 1;
  double temperature = 1.0;  ///< the generation temperature; log-probs use logits / temperature
  int64_t freezing_actor_steps = -1;  ///< RL steps during which only the critic learns
  bool normalize_reward = false;      ///< running mean/std normalisation of the scores
  double max_norm = 1.0;
  int32_t pad_id = 0;
  uint64_t seed = 42;
};

/// The models of a run. actor is required; ref when a KL term is used; critic for GAE; reward
/// model when scores come from one. Each is a store with its network, on the CPU or the GPU
/// (parallel/train_model.h).
struct PpoModels {
  parallel::TrainModel* actor = nullptr;
  parallel::TrainModel* ref = nullptr;
  parallel::TrainModel* critic = nullptr;
  parallel::TrainModel* reward = nullptr;
};

/// Metrics of one RL step's training (means over the step's response tokens unless noted).
struct PpoStats {
  double policy_loss = 0, value_loss = 0, kl_loss = 0, entropy = 0;
  double clip_frac = 0;        ///< share of tokens where a clipped branch was taken
  double approx_kl = 0;        ///< k3(lp, lp_old): how far the updates moved the policy
  double actor_grad_norm = 0;  ///< mean over the optimizer steps (before clipping)
  double critic_grad_norm = 0;
  double kl = 0;                       ///< mean KL(π_old ‖ π_ref) estimate over the rollout
  double kl_coef = 0;                  ///< β used this step
  double actor_lr = 0, critic_lr = 0;  ///< learning rates of the last optimizer step
  int64_t optimizer_steps = 0;
  double comm_seconds = 0;  ///< time inside train_comm collectives during training
  int64_t comm_bytes = 0;
};

/// Running mean and variance (Chan et al. parallel update) of the reward, for --normalize_reward.
struct RunningMoments {
  double count = 0, mean = 0, m2 = 0;
  void update(const std::vector<double>& xs);
  double std() const;
};

/// Collective over train_comm: every training rank constructs it and calls every method in the
/// same order. The experience and the updates do not depend on the number of training ranks
/// beyond fp32 summation order.
class PpoTrainer {
 public:
  PpoTrainer(const PpoModels& models, const PpoOptions& options, parallel::Comm& train_comm);

  /// Reward-model scores of the samples (value of the last token). Collective.
  std::vector<double> reward_model_scores(const std::vector<Sample>& samples);

  /// Log-probs (old, ref), values, KL, rewards and advantages of the samples (the global batch,
  /// in canonical order); scores one per sample. Collective.
  Experience make_experience(const std::vector<Sample>& samples, std::vector<double> scores);

  /// Trains on the experience. The learning rate of each optimizer step is the schedule's value
  /// at that optimizer step (the trainer counts them across RL steps). critic_sched may be null
  /// when there is no critic.
  PpoStats train(const Experience& exp, int64_t rl_step, const optim::AdamWConfig& actor_adam,
                 const optim::LrSchedule& actor_sched, const optim::AdamWConfig& critic_adam,
                 const optim::LrSchedule* critic_sched);

  KlController& kl_controller() { return kl_; }
  RunningMoments& reward_moments() { return reward_moments_; }
  /// Optimizer steps taken so far (AdamW's t), for checkpoints.
  int64_t actor_steps() const { return actor_steps_; }
  int64_t critic_steps() const { return critic_steps_; }
  void set_steps(int64_t actor, int64_t critic) {
    actor_steps_ = actor;
    critic_steps_ = critic;
  }

 private:
  struct Batch {
    std::vector<int32_t> tokens, targets;
    std::vector<int64_t> resp_pos;  ///< per sample in the batch: position of response token 0
    int64_t B = 0, T = 0;
  };
  Batch make_batch(const std::vector<const Sample*>& s) const;
  std::vector<float> allgather_rows(const std::vector<float>& local, int64_t row_floats);

  PpoModels m_;
  PpoOptions opt_;
  parallel::Comm& comm_;
  KlController kl_;
  RunningMoments reward_moments_;
  int64_t actor_steps_ = 0, critic_steps_ = 0;
};

}  // namespace rlhf::rollout
