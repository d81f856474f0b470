#include "rl/optimizer.h"

namespace rlhf::rl {

Optimizer::Optimizer(parallel::ParamStore& store, const optim::AdamWConfig& adam,
                     const optim::LrSchedule& schedule, double max_norm)
    : store_(store), adam_(adam), schedule_(schedule), max_norm_(max_norm) {}

Optimizer::StepResult Optimizer::step() {
  StepResult r;
  r.lr = schedule_.lr_at(steps_);
  r.step = ++steps_;
  r.grad_norm = parallel::clip_and_step(store_, adam_, r.lr, r.step, max_norm_);
  return r;
}

}  // namespace rlhf::rl
