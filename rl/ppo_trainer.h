// The trainer side of one PPO/GRPO step (docs/algorithms.md): experience (old and reference
// log-probs, values, KL, rewards, advantages) from generated samples, then --max_epochs passes of
// clipped policy (+ KL loss, entropy bonus) and value updates in optimizer steps of
// --train_batch_size.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "optim/adamw.h"
#include "optim/schedule.h"
#include "parallel/comm.h"
#include "parallel/param_store.h"
#include "parallel/train_model.h"
#include "rl/advantages.h"
#include "rl/experience.h"
#include "rl/is_correction.h"
#include "rl/losses.h"
#include "rl/optimizer.h"

namespace rlhf::rl {

/// Algorithm options (OpenRLHF's flags and defaults).
struct PpoOptions {
  AdvantageEstimator estimator = AdvantageEstimator::kGae;
  double gamma = 1.0, lambd = 1.0;
  double init_kl_coef = 0.01;
  rl::KlEstimator kl_estimator = rl::KlEstimator::kK1;
  bool use_kl_loss = false;  ///< KL as a loss term (GRPO) instead of in the reward
  double kl_target = 0, kl_horizon = 10000;
  double eps_clip_low = 0.2, eps_clip_high = 0.2, dual_clip = 0, value_clip = 0.5;
  double entropy_loss_coef = 0;
  PolicyLossType policy_loss = PolicyLossType::kPpo;    ///< --policy_loss_type
  LossAggMode loss_agg_mode = LossAggMode::kTokenMean;  ///< --loss_agg_mode
  int64_t generate_max_len = 1024;  ///< L_max of seq-mean-token-sum-norm (--generate_max_len)
  bool advantage_std_norm = true;   ///< false: --no_advantage_std_norm
  int n_samples_per_prompt = 1;
  int64_t micro_rollout_batch_size = 8;  ///< per rank, forward-only passes
  int64_t train_batch_size = 128;        ///< global samples per optimizer step
  int64_t micro_train_batch_size = 4;    ///< per rank per forward/backward
  int64_t max_epochs = 1;
  double temperature = 1.0;  ///< the generation temperature; log-probs use logits / temperature
  int64_t freezing_actor_steps = -1;  ///< RL steps during which only the critic learns
  bool normalize_reward = false;      ///< running mean/std normalisation of the scores
  /// Skip the forward pass that computes lp_old when it provably equals the update's own lp
  /// (old_logprobs_are_current); false computes it always (tests compare the two).
  bool skip_current_old_logprobs = true;
  /// Off-policy correction of the policy loss (docs/algorithms.md, "Off-policy correction"):
  /// --enable_vllm_is_correction with --vllm_is_correction_type, or --use_decoupled_loss.
  IsCorrection is_correction = IsCorrection::kNone;
  /// --vllm_is_truncated_threshold lo hi; with kDecoupled is_hi is --behav_imp_weight_cap (≤ 0:
  /// no cap).
  double is_lo = 0.5, is_hi = 5.0;
  /// --use_dynamic_batch: micro-batches by a token budget (padded tokens B·T per rank, or with
  /// packing the samples' tokens) instead of a sample count: --train_max_tokens_per_gpu for the
  /// forward/backward passes, --rollout_max_tokens_per_gpu for the forward-only passes.
  bool dynamic_batch = false;
  /// --packing_samples: each micro-batch's samples end to end in one row (model::SeqLens), every
  /// forward and backward pass; the per-token and per-sample terms are those of the padded batch.
  bool packing = false;
  int64_t train_max_tokens = 16192, rollout_max_tokens = 16192;
  double max_norm = 1.0;
  int32_t pad_id = 0;
  /// A padded micro-batch's T is its longest sample rounded up to a multiple of this (>= 1;
  /// parallel::training_pad_multiple: 64 while cuDNN attention serves the GPU passes, so that few
  /// (B, T) shapes need a cuDNN plan). Exact: pads are right of every real token and carry no loss.
  int64_t pad_multiple = 1;
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

/// How the trainable models step: AdamW and the learning-rate schedule of the actor and (with a
/// critic) the critic; max_norm is in PpoOptions.
struct PpoOptimizers {
  optim::AdamWConfig actor_adam;
  optim::LrSchedule actor_schedule{"constant", 0.0, 0, 1};
  optim::AdamWConfig critic_adam;
  optim::LrSchedule critic_schedule{"constant", 0.0, 0, 1};
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
  /// Engine-vs-trainer mismatch over the step's action tokens (lp_rol against lp_old) and the
  /// behaviour weights applied (rl/is_correction.h).
  MismatchStats mismatch;
  int64_t train_micro_batches = 0;  ///< forward/backward passes of this rank, all epochs
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
  PpoTrainer(const PpoModels& models, const PpoOptions& options, const PpoOptimizers& optimizers,
             parallel::Comm& train_comm);

  bool has_reward_model() const { return m_.reward != nullptr; }
  const PpoOptions& options() const { return opt_; }
  /// Reward-model scores of the samples (value of the last token). Collective.
  std::vector<double> reward_model_scores(const std::vector<Sample>& samples);

  /// True when lp_old of a batch of B samples equals, bit for bit, the log-probs the update's own
  /// forward pass computes, so that make_experience can skip the old-log-prob pass (as TRL does for
  /// num_iterations = 1; docs/algorithms.md, "Skipping the old-log-prob pass"): --max_epochs 1 and
  /// --train_batch_size = B (one optimizer step, taken on the weights that generated the batch),
  /// the actor never frozen, and no KL in the reward (which needs lp_old before the update: PPO
  /// with --init_kl_coef > 0 and no --use_kl_loss). The reference pass still runs when β > 0.
  bool old_logprobs_are_current(int64_t B) const;

  /// Log-probs (old, ref), values, KL, rewards and advantages of the samples (the global batch,
  /// in canonical order); scores one per sample. Collective. Skips the old-log-prob pass when
  /// old_logprobs_are_current(B) (and options().skip_current_old_logprobs): then
  /// Experience::lp_old_is_current is set and train() derives lp_old and the KL metric itself.
  Experience make_experience(const std::vector<Sample>& samples, std::vector<double> scores);

  /// Trains on the experience of RL step `rl_step` (0-based): --max_epochs passes in optimizer
  /// steps of --train_batch_size, each at its schedule's learning rate (the optimizers count
  /// their steps across RL steps). Collective.
  PpoStats train(const Experience& exp, int64_t rl_step);

  KlController& kl_controller() { return kl_; }
  RunningMoments& reward_moments() { return reward_moments_; }
  /// Optimizer steps taken so far (AdamW's t), for checkpoints.
  int64_t actor_steps() const { return actor_opt_->steps(); }
  int64_t critic_steps() const { return critic_opt_ ? critic_opt_->steps() : 0; }
  void set_steps(int64_t actor, int64_t critic) {
    actor_opt_->set_steps(actor);
    if (critic_opt_) critic_opt_->set_steps(critic);
  }

 private:
  // One micro-batch's tokens: B rows of T, one sample per row right-padded, or with packing one
  // row of every sample's tokens end to end (B = 1, cu their boundaries).
  struct Batch {
    std::vector<int32_t> tokens, targets;
    std::vector<int64_t> resp_pos;  ///< per sample in the batch: position of response token 0
    std::vector<int64_t> start;     ///< per sample: position of its token 0 in the B·T tokens
    std::vector<int32_t> cu;        ///< packed: the samples' boundaries (n + 1); else empty
    int64_t B = 0, T = 0;
    int64_t n = 0;      ///< samples
    int64_t first = 0;  ///< index of the batch's first sample in this rank's slice
    model::SeqLens seqs() const {
      return cu.empty() ? model::SeqLens{} : model::SeqLens{cu.data(), n};
    }
  };
  // The per-token experience of one micro-batch in batch positions (B, T), and its weights.
  struct MicroBatch {
    Batch b;
    std::vector<float> old_lp, ref_lp, rol_lp, adv, ret, vold;  // (B·T)
    // (B·T) per-token weights: of the policy, KL and entropy terms (--loss_agg_mode), and the
    // token mean of the step (the value loss and every reported metric).
    std::vector<float> weight, weight_tok;
    std::vector<int32_t> seq;      // (B·T) the row of each response token, −1 elsewhere (GSPO)
    std::vector<int64_t> tok_pos;  // positions of the response tokens
  };
  // Sums over this rank's tokens of one RL step's training (each weighted by 1/N_tokens of its
  // optimizer step): the loss metrics.
  struct Sums {
    double policy = 0, value = 0, kl_loss = 0, entropy = 0, clip = 0, approx_kl = 0;
    double kl_current = 0;  // Σ KL(π ‖ π_ref) over tokens, unweighted (lp_old_is_current only)
    MismatchSums mismatch;  // over this rank's action tokens (lp_old_is_current only)
    int64_t micro_batches = 0;
  };
  Batch make_batch(const std::vector<const Sample*>& s) const;
  std::vector<float> allgather_rows(const std::vector<float>& local);
  // This rank's slice of `samples` (the global batch) in micro-batches of
  // --micro_rollout_batch_size (or of --rollout_max_tokens_per_gpu tokens), for the forward-only
  // passes.
  std::vector<Batch> rollout_micro_batches(const std::vector<Sample>& samples) const;
  // This rank's micro-batches of `all`: every rank's samples, rank r's the r-th of N equal
  // consecutive slices. Runs of `count` samples, or with --use_dynamic_batch runs within `budget`
  // padded tokens (token_budget_runs), as many on every rank. [begin, end) in this rank's slice.
  std::vector<std::pair<int64_t, int64_t>> rank_micro_batches(const std::vector<const Sample*>& all,
                                                              int64_t count, int64_t budget) const;
  // The behaviour weight applied to the PPO loss (kNone for GSPO, whose correction is its ratio
  // against lp_rol).
  IsCorrection token_correction() const {
    return opt_.policy_loss == PolicyLossType::kGspo ? IsCorrection::kNone : opt_.is_correction;
  }
  // The mismatch metrics of the whole experience (lp_old known); identical on every rank.
  MismatchSums experience_mismatch(const Experience& e) const;
  // The sweep's view of `batches`, writing each batch's (B, T) output into consecutive parts of
  // `out` (resized here).
  static std::vector<parallel::ForwardBatch> forward_batches(const std::vector<Batch>& batches,
                                                             std::vector<float>& out);
  // ids: the samples of the micro-batch; step_tokens: response tokens of the whole optimizer step.
  MicroBatch micro_batch(const Experience& e, const std::vector<int64_t>& ids,
                         int64_t step_tokens) const;
  // current: lp_old is taken from this forward (Experience::lp_old_is_current).
  // mismatch: the micro-batch has lp_rol; with current, its tokens add to sums.mismatch.
  void actor_micro_batch(MicroBatch& mb, bool current, bool mismatch, Sums& sums);
  void critic_micro_batch(const MicroBatch& mb, Sums& sums);

  PpoModels m_;
  PpoOptions opt_;
  parallel::Comm& comm_;
  KlController kl_;
  RunningMoments reward_moments_;
  std::unique_ptr<Optimizer> actor_opt_, critic_opt_;
};

}  // namespace rlhf::rl
