// Learning-rate schedules at their corners. The expected numbers were printed by Hugging Face
// transformers 4.44.2 itself: get_scheduler(name, torch.optim.AdamW(lr=...), num_warmup_steps=W,
// num_training_steps=S, scheduler_specific_kwargs={"min_lr": ...}), reading
// optimizer.param_groups[0]["lr"] before optimizer step k (LambdaLR convention), repr() digits.
#include "optim/schedule.h"

#include <cmath>

#include "core/error.h"
#include "tests/test_util.h"

using namespace rlhf;
using optim::LrSchedule;

namespace {

// HF and we evaluate the same double expressions with the same libm; allow a few ulps anyway.
void check_lr(const LrSchedule& s, int64_t step, double expected) {
  INFO(fmt::format("{}(lr={}, W={}, S={}) step {}", s.name(), s.lr(), s.warmup_steps(),
                   s.max_steps(), step));
  const double got = s.lr_at(step);
  INFO(fmt::format("got {:.17g}, expected {:.17g}", got, expected));
  CHECK(std::fabs(got - expected) <= 1e-14 * std::fabs(expected));  // exact when expected = 0
}

}  // namespace

TEST_CASE("schedule cosine_with_min_lr, OpenRLHF defaults (ratio 0.07 of 100 steps -> W = 8)") {
  // OpenRLHF: W = ceil(100 * 0.07) = ceil(7.000000000000001) = 8; min_lr = 0.1 lr.
  auto s = LrSchedule::openrlhf("cosine_with_min_lr", 1e-6, 100, 0.07);
  CHECK(s.warmup_steps() == 8);
  CHECK(s.max_steps() == 100);
  check_lr(s, 0, 0.0);                       // warmup starts at 0
  check_lr(s, 1, 1.25e-07);                  // 1/8
  check_lr(s, 7, 8.75e-07);                  // last warmup step: 7/8
  check_lr(s, 8, 1e-06);                     // first post-warmup step: the full lr
  check_lr(s, 9, 9.997376600647783e-07);     // cos(pi/92)
  check_lr(s, 54, 5.5e-07);                  // halfway: 0.1 + 0.9 * 0.5
  check_lr(s, 99, 1.0026233993522169e-07);   // the last step of a 100-step run
  check_lr(s, 100, 1e-07);                   // step = max_steps: exactly min_lr
  check_lr(s, 101, 1.0026233993522169e-07);  // past the end HF does not clamp: the cosine rises
  check_lr(s, 150, 6.112749920933105e-07);
  check_lr(s, 192, 1e-06);  // a full period after warmup: back to lr
  check_lr(s, 250, 3.7071950956919094e-07);
  // Another ceil corner: 100 * 0.03 is exactly 3.
  CHECK(LrSchedule::openrlhf("cosine_with_min_lr", 1e-6, 100, 0.03).warmup_steps() == 3);
  CHECK(LrSchedule::openrlhf("constant", 1e-6, 0, 0.5).warmup_steps() == 0);
}

TEST_CASE("schedule cosine_with_min_lr without warmup, and max_steps < warmup") {
  LrSchedule s("cosine_with_min_lr", 1e-4, 0, 10, 1e-5);
  check_lr(s, 0, 1e-4);  // no warmup: step 0 already uses the full lr
  check_lr(s, 1, 9.779754323328192e-05);
  check_lr(s, 5, 5.500000000000001e-05);
  check_lr(s, 9, 1.2202456766718093e-05);
  check_lr(s, 10, 1e-05);
  check_lr(s, 11, 1.2202456766718093e-05);

  // S < W: HF's post-warmup denominator max(1, S - W) is 1, so the factor alternates.
  LrSchedule short_run("cosine_with_min_lr", 1e-3, 10, 4, 1e-4);
  check_lr(short_run, 0, 0.0);
  check_lr(short_run, 9, 0.0009000000000000001);
  check_lr(short_run, 10, 0.001);
  check_lr(short_run, 11, 0.0001);
  check_lr(short_run, 12, 0.001);
  check_lr(short_run, 13, 0.0001);

  LrSchedule empty("cosine_with_min_lr", 1e-4, 0, 0, 1e-5);
  check_lr(empty, 0, 1e-4);
  check_lr(empty, 1, 1e-5);
  check_lr(empty, 2, 1e-4);
}

TEST_CASE("schedule linear") {
  LrSchedule s("linear", 1e-4, 4, 100);
  check_lr(s, 0, 0.0);
  check_lr(s, 2, 5e-05);
  check_lr(s, 3, 7.500000000000001e-05);  // last warmup step
  check_lr(s, 4, 1e-4);                   // first post-warmup step
  check_lr(s, 5, 9.895833333333334e-05);  // 95/96
  check_lr(s, 52, 5e-05);
  check_lr(s, 99, 1.0416666666666667e-06);  // last step: 1/96
  check_lr(s, 100, 0.0);
  check_lr(s, 120, 0.0);  // clamped at 0 past the end

  LrSchedule short_run("linear", 1e-3, 10, 4);  // S < W: 0 right after warmup
  check_lr(short_run, 9, 0.0009000000000000001);
  check_lr(short_run, 10, 0.0);
  check_lr(short_run, 11, 0.0);
  check_lr(LrSchedule("linear", 1e-4, 0, 0), 0, 0.0);
  check_lr(LrSchedule("linear", 1e-4, 0, 0), 1, 0.0);
}

TEST_CASE("schedule constant and constant_with_warmup") {
  LrSchedule c("constant", 2e-5, 7, 3);  // warmup and max_steps are ignored
  check_lr(c, 0, 2e-5);
  check_lr(c, 1, 2e-5);
  check_lr(c, 1000, 2e-5);

  LrSchedule w("constant_with_warmup", 2e-5, 4, 100);
  check_lr(w, 0, 0.0);
  check_lr(w, 1, 5e-06);
  check_lr(w, 3, 1.5000000000000002e-05);  // last warmup step
  check_lr(w, 4, 2e-05);                   // first post-warmup step
  check_lr(w, 5, 2e-05);
  check_lr(w, 1000, 2e-05);  // past max_steps: unchanged
}

TEST_CASE("schedule errors") {
  try {
    LrSchedule("cosine", 1e-6, 0, 10);
    FAIL("an unknown schedule name must throw");
  } catch (const Error& e) {
    const std::string msg = e.what();
    INFO(msg);
    CHECK(msg.find("'cosine'") != std::string::npos);
    for (auto n : optim::kScheduleNames) CHECK(msg.find(std::string(n)) != std::string::npos);
  }
  CHECK_THROWS_AS(LrSchedule("linear", -1.0, 0, 10), Error);
  CHECK_THROWS_AS(LrSchedule("linear", 1e-6, -1, 10), Error);
  CHECK_THROWS_AS(LrSchedule("linear", 1e-6, 0, -1), Error);
  CHECK_THROWS_AS(LrSchedule::openrlhf("linear", 1e-6, 10, 1.5), Error);
  CHECK_THROWS_AS(LrSchedule("linear", 1e-6, 0, 10).lr_at(-1), Error);
  // lr = 0 is allowed (a frozen run) and gives 0 everywhere, without 0/0 in min_lr_rate.
  check_lr(LrSchedule("cosine_with_min_lr", 0.0, 2, 10, 0.0), 5, 0.0);
}
