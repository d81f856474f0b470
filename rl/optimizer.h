// The optimizer step every trainer takes (SFT, the reward model, the PPO actor and critic): the
// gradients of one optimizer step are accumulated into the store, then clipped by their global
// norm and applied by AdamW at the schedule's learning rate. The step count is AdamW's t and what
// a checkpoint keeps.
#pragma once

#include <cstdint>

#include "optim/adamw.h"
#include "optim/schedule.h"
#include "parallel/param_store.h"

namespace rlhf::rl {

/// One model's optimizer: AdamW (torch.optim.AdamW), the learning-rate schedule (HF get_scheduler)
/// and global-norm clipping (torch.nn.utils.clip_grad_norm_), over a ParamStore.
class Optimizer {
 public:
  /// max_norm <= 0: no clipping.
  Optimizer(parallel::ParamStore& store, const optim::AdamWConfig& adam,
            const optim::LrSchedule& schedule, double max_norm);

  /// What one step did.
  struct StepResult {
    double lr = 0;         ///< the learning rate of this step (schedule at the 0-based step)
    double grad_norm = 0;  ///< global gradient norm before clipping
    int64_t step = 0;      ///< 1-based index of this step (AdamW's t)
  };

  /// Zeroes the gradient accumulators: the start of an optimizer step.
  void zero_grad() { store_.zero_grads(); }
  /// Clips and applies the accumulated gradients; collective over the store's communicator.
  /// Throws rlhf::Error when the gradient norm is not finite, before touching the weights.
  StepResult step();

  /// Optimizer steps taken so far (for checkpoints); set_steps resumes the count.
  int64_t steps() const { return steps_; }
  void set_steps(int64_t steps) { steps_ = steps; }
  /// The learning rate the next step will use.
  double next_lr() const { return schedule_.lr_at(steps_); }
  parallel::ParamStore& store() { return store_; }

 private:
  parallel::ParamStore& store_;
  optim::AdamWConfig adam_;
  optim::LrSchedule schedule_;
  double max_norm_;
  int64_t steps_ = 0;
};

}  // namespace rlhf::rl
