#include "optim/schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "core/error.h"

namespace rlhf::optim {

LrSchedule::LrSchedule(std::string name, double lr, int64_t warmup_steps, int64_t max_steps,
                       double min_lr)
    : name_(std::move(name)),
      kind_(Kind::kConstant),
      lr_(lr),
      warmup_steps_(warmup_steps),
      max_steps_(max_steps),
      min_lr_rate_(0.0) {
  if (name_ == "cosine_with_min_lr") {
    kind_ = Kind::kCosineWithMinLr;
  } else if (name_ == "constant") {
    kind_ = Kind::kConstant;
  } else if (name_ == "constant_with_warmup") {
    kind_ = Kind::kConstantWithWarmup;
  } else if (name_ == "linear") {
    kind_ = Kind::kLinear;
  } else {
    std::string valid;
    for (std::string_view n : kScheduleNames) valid += (valid.empty() ? "" : ", ") + std::string(n);
    RLHF_FAIL("unknown learning-rate schedule '{}'\nhint: --lr_scheduler must be one of: {}", name_,
              valid);
  }
  RLHF_CHECK(std::isfinite(lr) && lr >= 0, "learning rate must be finite and >= 0, got {}", lr);
  RLHF_CHECK(warmup_steps >= 0, "lr schedule: warmup steps must be >= 0, got {}", warmup_steps);
  RLHF_CHECK(max_steps >= 0, "lr schedule: max_steps must be >= 0, got {}", max_steps);
  RLHF_CHECK(std::isfinite(min_lr) && min_lr >= 0, "lr schedule: min_lr must be >= 0, got {}",
             min_lr);
  // HF: min_lr_rate = min_lr / optimizer.defaults["lr"].
  if (lr > 0) min_lr_rate_ = min_lr / lr;
}

LrSchedule LrSchedule::openrlhf(std::string name, double lr, int64_t max_steps,
                                double warmup_ratio) {
  RLHF_CHECK(std::isfinite(warmup_ratio) && warmup_ratio >= 0 && warmup_ratio <= 1,
             "--lr_warmup_ratio must be in [0, 1], got {}", warmup_ratio);
  RLHF_CHECK(max_steps >= 0, "lr schedule: max_steps must be >= 0, got {}", max_steps);
  const auto warmup =
      static_cast<int64_t>(std::ceil(static_cast<double>(max_steps) * warmup_ratio));
  return LrSchedule(std::move(name), lr, warmup, max_steps, lr * 0.1);
}

double LrSchedule::factor(int64_t step) const {
  RLHF_CHECK(step >= 0, "lr schedule: step must be >= 0, got {}", step);
  const double k = static_cast<double>(step);
  const double warmup = static_cast<double>(std::max<int64_t>(1, warmup_steps_));
  switch (kind_) {
    case Kind::kConstant:
      return 1.0;
    case Kind::kConstantWithWarmup:
      return step < warmup_steps_ ? k / warmup : 1.0;
    case Kind::kLinear: {
      if (step < warmup_steps_) return k / warmup;
      const double den = static_cast<double>(std::max<int64_t>(1, max_steps_ - warmup_steps_));
      return std::max(0.0, static_cast<double>(max_steps_ - step) / den);
    }
    case Kind::kCosineWithMinLr: {
      if (step < warmup_steps_) return k / warmup;
      const double den = static_cast<double>(std::max<int64_t>(1, max_steps_ - warmup_steps_));
      const double progress = static_cast<double>(step - warmup_steps_) / den;
      // HF: 0.5 * (1 + cos(pi * num_cycles * 2 * progress)) with num_cycles = 0.5.
      double f = 0.5 * (1.0 + std::cos(std::numbers::pi * 0.5 * 2.0 * progress));
      f = f * (1.0 - min_lr_rate_) + min_lr_rate_;
      return std::max(0.0, f);
    }
  }
  RLHF_ASSERT(false);
  return 0.0;
}

}  // namespace rlhf::optim
