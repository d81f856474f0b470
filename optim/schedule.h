// Learning-rate schedules, computed as Hugging Face transformers' get_scheduler computes them
// (OpenRLHF calls it), in the LambdaLR convention: optimizer step k (0-based) uses
// lr · factor(k).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace rlhf::optim {

/// The schedule names we implement (HF `SchedulerType` values; OpenRLHF's `--lr_scheduler`).
inline constexpr std::array<std::string_view, 4> kScheduleNames = {
    "cosine_with_min_lr", "constant", "constant_with_warmup", "linear"};

/// A learning-rate schedule. With W = warmup_steps, S = max_steps (HF's num_training_steps) and
/// step k >= 0, factor(k) is, exactly as in transformers/optimization.py:
/// - "constant":             1
/// - "constant_with_warmup": k < W ? k / max(1, W) : 1
/// - "linear":               k < W ? k / max(1, W) : max(0, (S − k) / max(1, S − W))
/// - "cosine_with_min_lr":   k < W ? k / max(1, W)
///                           : max(0, r + (1 − r) · ½(1 + cos(π · (k − W) / max(1, S − W))))
///                           with r = min_lr / lr (HF's min_lr_rate).
/// Like HF, nothing is clamped at S: past max_steps "linear" stays at 0 while the cosine rises
/// again (k = S + (S − W) gives factor 1); with S < W the post-warmup denominator is 1.
class LrSchedule {
 public:
  /// name: one of kScheduleNames, else rlhf::Error listing them. lr: the base learning rate
  /// (>= 0, finite). warmup_steps, max_steps: >= 0. min_lr: the absolute floor of
  /// "cosine_with_min_lr" (HF's `min_lr` kwarg; ignored by the other schedules; >= 0).
  LrSchedule(std::string name, double lr, int64_t warmup_steps, int64_t max_steps,
             double min_lr = 0.0);

  /// OpenRLHF's call: warmup_steps = ceil(max_steps · warmup_ratio), the product in double as
  /// Python's math.ceil(max_steps * ratio) (so 100 · 0.07 = 7.000000000000001 gives 8, as in
  /// OpenRLHF), min_lr = 0.1 · lr.
  /// warmup_ratio must be in [0, 1].
  static LrSchedule openrlhf(std::string name, double lr, int64_t max_steps, double warmup_ratio);

  /// The LambdaLR factor for 0-based optimizer step `step` (>= 0, else rlhf::Error).
  double factor(int64_t step) const;
  /// The learning rate used by 0-based optimizer step `step`: lr · factor(step).
  double lr_at(int64_t step) const { return lr_ * factor(step); }

  const std::string& name() const { return name_; }
  double lr() const { return lr_; }
  int64_t warmup_steps() const { return warmup_steps_; }
  int64_t max_steps() const { return max_steps_; }
  double min_lr_rate() const { return min_lr_rate_; }

 private:
  enum class Kind { kCosineWithMinLr, kConstant, kConstantWithWarmup, kLinear };
  std::string name_;
  Kind kind_;
  double lr_;
  int64_t warmup_steps_;
  int64_t max_steps_;
  double min_lr_rate_;  ///< min_lr / lr, computed as HF does (0 when lr = 0)
};

}  // namespace rlhf::optim
