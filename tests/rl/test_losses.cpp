// PPO clipped surrogate, KL estimators and value loss: hand-computed cases (the numbers written
// here) and finite differences in double away from the kinks.
#include "rl/losses.h"

#include <cmath>

#include "core/error.h"
#include "tests/test_util.h"

using namespace rlhf;
using rl::KlEstimator;

namespace {
struct PpoCase {
  double dlogp, adv, eps_low, eps_high, dual;
  double loss;
  int clipped;
  double dlp;  // with weight 1
};
}  // namespace

TEST_CASE("ppo_clip_loss: hand-computed cases") {
  const double l15 = std::log(1.5), l11 = std::log(1.1), l05 = std::log(0.5), l5 = std::log(5.0);
  const PpoCase cases[] = {
      {l15, 2.0, 0.2, 0.2, 0, -2.4, 1, 0.0},   // ρ = 1.5, A > 0: clipped at 1.2
      {l11, 2.0, 0.2, 0.2, 0, -2.2, 0, -2.2},  // inside the trust region
      {l05, -1.0, 0.2, 0.2, 0, 0.8, 1, 0.0},   // ρ = 0.5, A < 0: clipped at 0.8
      {l15, -1.0, 0.2, 0.2, 0, 1.5, 0, 1.5},   // ρ = 1.5, A < 0: the unclipped term is smaller
      {l5, -1.0, 0.2, 0.2, 3.0, 3.0, 1, 0.0},  // dual clip: −max(−5, 3·(−1)) = 3
      {l5, -1.0, 0.2, 0.2, 0, 5.0, 0, 5.0},    // no dual clip: 5
      {std::log(1.25), 1.0, 0.2, 0.28, 0, -1.25, 0, -1.25},  // asymmetric: 1.25 < 1.28
      {std::log(1.3), 1.0, 0.2, 0.28, 0, -1.28, 1, 0.0},     // clipped at 1 + eps_high
      {25.0, -1.0, 0.2, 0.2, 0, std::exp(20.0), 0, 0.0},     // log-ratio clamped at 20: no grad
  };
  for (const PpoCase& c : cases) {
    CAPTURE(c.dlogp);
    CAPTURE(c.adv);
    const double lp = -1.0 + c.dlogp, lp_old = -1.0, w = 1.0;
    double loss = 0, ratio = 0, dlp = 0;
    uint8_t clipped = 9;
    rl::ppo_clip_loss_forward_cpu(&loss, &clipped, &ratio, &lp, &lp_old, &c.adv, 1, c.eps_low,
                                  c.eps_high, c.dual);
    CHECK(loss == doctest::Approx(c.loss).epsilon(1e-12));
    CHECK(int(clipped) == c.clipped);
    rl::ppo_clip_loss_backward_cpu(&dlp, &w, &lp, &lp_old, &c.adv, 1, c.eps_low, c.eps_high,
                                   c.dual);
    CHECK(dlp == doctest::Approx(c.dlp).epsilon(1e-12));
  }
}

TEST_CASE("kl estimators: hand-computed values, gradients and the clamp") {
  const double lp = -0.5, lp_ref = -1.0;  // δ = 0.5
  const double w = 2.0;
  struct {
    KlEstimator e;
    double k, g;
  } cases[] = {{KlEstimator::kK1, 0.5, 1.0},
               {KlEstimator::kK2, 0.125, 0.5},
               {KlEstimator::kK3, std::exp(-0.5) - 0.5, 1.0 - std::exp(-0.5)}};
  for (auto& c : cases) {
    CAPTURE(rl::to_string(c.e));
    double k = 0, d = 0;
    rl::kl_forward_cpu(&k, &lp, &lp_ref, 1, c.e);
    rl::kl_backward_cpu(&d, &w, &lp, &lp_ref, 1, c.e);
    CHECK(k == doctest::Approx(c.k).epsilon(1e-14));
    CHECK(d == doctest::Approx(w * c.g).epsilon(1e-14));
  }
  // Clamped to [−10, 10], and then no gradient.
  const double far = 29.0, ref = -1.0, near = -13.0;  // δ = 30 and δ = −12
  double k = 0, d = 1;
  rl::kl_forward_cpu(&k, &far, &ref, 1, KlEstimator::kK2);
  CHECK(k == 10.0);
  rl::kl_backward_cpu(&d, &w, &far, &ref, 1, KlEstimator::kK2);
  CHECK(d == 0.0);
  rl::kl_forward_cpu(&k, &near, &ref, 1, KlEstimator::kK1);
  CHECK(k == -10.0);
  CHECK(rl::kl_estimator_from_string("k3") == KlEstimator::kK3);
  CHECK_THROWS_AS(rl::kl_estimator_from_string("k4"), rlhf::Error);
}

TEST_CASE("value loss: hand-computed cases") {
  struct {
    double v, v_old, ret, clip, loss;
    int clipped;
    double dv;
  } cases[] = {
      {2.0, 1.0, 0.0, 0.5, 2.0, 0, 2.0},  // unclipped term larger: ½·2²
      {2.0, 1.0, 3.0, 0.5, 1.125, 1, 0.0},  // V_c = 1.5: ½·1.5² wins, |V − V_old| > c → no grad
      {1.2, 1.0, 3.0, 0.5, 1.62, 0, -1.8},  // inside the clip range: both terms equal
      {2.0, 1.0, 3.0, 0.0, 0.5, 0, -1.0},   // clipping off
  };
  for (auto& c : cases) {
    double loss = 0, dv = 0, w = 1.0;
    uint8_t clipped = 9;
    rl::value_loss_forward_cpu(&loss, &clipped, &c.v, &c.v_old, &c.ret, 1, c.clip);
    rl::value_loss_backward_cpu(&dv, &w, &c.v, &c.v_old, &c.ret, 1, c.clip);
    CHECK(loss == doctest::Approx(c.loss).epsilon(1e-12));
    CHECK(int(clipped) == c.clipped);
    CHECK(dv == doctest::Approx(c.dv).epsilon(1e-12));
  }
}

TEST_CASE("rl losses: backward vs finite differences (double, away from kinks)") {
  const int64_t N = 200;
  auto lp = test::random_vec<double>(N, 1, -3.0, -0.5);
  auto off = test::random_vec<double>(N, 2, -0.6, 0.6);
  std::vector<double> lp_old(N);
  for (int64_t i = 0; i < N; ++i) lp_old[i] = lp[i] + off[i];
  auto adv = test::random_vec<double>(N, 3, -2, 2);
  auto w = test::random_vec<double>(N, 4, 0.1, 1.0);
  std::vector<double> tmp(N), g(N);
  // Keep each token at least 1e-3 (in log-ratio) away from the clip boundaries so that FD does not
  // straddle a kink.
  for (int64_t i = 0; i < N; ++i) {
    const double r = std::exp(lp[i] - lp_old[i]);
    if (std::fabs(r - 0.8) < 2e-3 || std::fabs(r - 1.2) < 2e-3) lp_old[i] += 0.01;
  }
  auto ppo = [&]() {
    rl::ppo_clip_loss_forward_cpu(tmp.data(), (uint8_t*)nullptr, (double*)nullptr, lp.data(),
                                  lp_old.data(), adv.data(), N, 0.2, 0.2, 3.0);
    return test::dot(tmp.data(), w.data(), N);
  };
  rl::ppo_clip_loss_backward_cpu(g.data(), w.data(), lp.data(), lp_old.data(), adv.data(), N, 0.2,
                                 0.2, 3.0);
  auto c1 = test::fd_check(ppo, lp.data(), g.data(), N, 1e-6);
  RLHF_CHECK_GRAD(c1, "ppo_clip_loss dlp");

  auto ref = test::random_vec<double>(N, 5, -3.0, -0.5);
  for (KlEstimator e : {KlEstimator::kK1, KlEstimator::kK2, KlEstimator::kK3}) {
    auto kl = [&]() {
      rl::kl_forward_cpu(tmp.data(), lp.data(), ref.data(), N, e);
      return test::dot(tmp.data(), w.data(), N);
    };
    rl::kl_backward_cpu(g.data(), w.data(), lp.data(), ref.data(), N, e);
    auto c2 = test::fd_check(kl, lp.data(), g.data(), N, 1e-6);
    RLHF_CHECK_GRAD(c2, std::string("kl ") + rl::to_string(e));
  }

  auto v = test::random_vec<double>(N, 6, -1, 1);
  auto vold = test::random_vec<double>(N, 7, -1, 1);
  auto ret = test::random_vec<double>(N, 8, -1, 1);
  for (int64_t i = 0; i < N; ++i)
    if (std::fabs(std::fabs(v[i] - vold[i]) - 0.2) < 1e-3) v[i] += 0.01;
  auto vl = [&]() {
    rl::value_loss_forward_cpu(tmp.data(), (uint8_t*)nullptr, v.data(), vold.data(), ret.data(), N,
                               0.2);
    return test::dot(tmp.data(), w.data(), N);
  };
  rl::value_loss_backward_cpu(g.data(), w.data(), v.data(), vold.data(), ret.data(), N, 0.2);
  auto c3 = test::fd_check(vl, v.data(), g.data(), N, 1e-6);
  RLHF_CHECK_GRAD(c3, "value_loss dv");
}

TEST_CASE("Bradley-Terry loss: closed form, stability, derivative") {
  double d = 0;
  CHECK(rl::bradley_terry_loss(0.0, &d) == doctest::Approx(std::log(2.0)));
  CHECK(d == doctest::Approx(-0.5));
  CHECK(rl::bradley_terry_loss(2.0, &d) == doctest::Approx(std::log1p(std::exp(-2.0))));
  CHECK(d == doctest::Approx(-1.0 / (1.0 + std::exp(2.0))));
  CHECK(rl::bradley_terry_loss(-800.0, &d) == doctest::Approx(800.0));  // no overflow
  CHECK(d == doctest::Approx(-1.0));
  CHECK(rl::bradley_terry_loss(800.0, &d) == doctest::Approx(0.0).epsilon(1e-12));
  const double h = 1e-6;
  for (double x : {-3.0, -0.3, 0.7, 4.0}) {
    rl::bradley_terry_loss(x, &d);
    const double fd =
        (rl::bradley_terry_loss(x + h, nullptr) - rl::bradley_terry_loss(x - h, nullptr)) / (2 * h);
    CHECK(d == doctest::Approx(fd).epsilon(1e-7));
  }
}
