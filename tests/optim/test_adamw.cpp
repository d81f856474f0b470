// AdamW: the closed-form first step, a plain double-precision re-implementation over 10 steps
// (weight decay on and off), the segment form against per-range calls, thread-count and
// grad_scale invariance, and argument checks.
#include "optim/adamw.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "core/error.h"
#include "tests/test_util.h"

using namespace rlhf;
using optim::AdamWConfig;
using optim::AdamWSegment;

namespace {

// Loshchilov & Hutter 2019, Alg. 2, in PyTorch's form (torch.optim.AdamW, foreach=False), written
// plainly in double: the reference the fp32 kernel is compared against.
struct RefAdamW {
  std::vector<double> p, m, v;
  void step(const std::vector<float>& g, const AdamWConfig& c, double lr, int64_t t, bool decay,
            double grad_scale) {
    const double wd = decay ? c.weight_decay : 0.0;
    const double bc1 = 1.0 - std::pow(c.beta1, static_cast<double>(t));
    const double bc2 = 1.0 - std::pow(c.beta2, static_cast<double>(t));
    for (size_t i = 0; i < p.size(); ++i) {
      const double gi = static_cast<double>(g[i]) * grad_scale;
      p[i] *= 1.0 - lr * wd;
      m[i] = c.beta1 * m[i] + (1.0 - c.beta1) * gi;
      v[i] = c.beta2 * v[i] + (1.0 - c.beta2) * gi * gi;
      const double denom = std::sqrt(v[i]) / std::sqrt(bc2) + c.eps;
      p[i] -= (lr / bc1) * m[i] / denom;
    }
  }
};

// Gradients whose magnitudes span 1e-6 .. 10 with random signs, and a few exact zeros.
std::vector<float> spread_grads(int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(-1.0, 1.0), e(-6.0, 1.0);
  std::vector<float> g(static_cast<size_t>(n));
  for (auto& x : g) x = static_cast<float>(u(rng) * std::pow(10.0, e(rng)));
  for (size_t i = 0; i < g.size(); i += 97) g[i] = 0.0f;
  return g;
}

bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](float x, float y) {
           return std::memcmp(&x, &y, sizeof(float)) == 0;
         });
}

}  // namespace

TEST_CASE("adamw first step, closed form: |dp| = lr for g != 0 with wd 0 and eps 0") {
  // Step 1: m = (1-b1) g, v = (1-b2) g², m̂ = g, v̂ = g², so dp = -lr g / |g| = -lr sign(g).
  const int64_t n = 1003;
  AdamWConfig cfg;
  cfg.eps = 0.0;
  const double lr = 1e-3;
  auto g = spread_grads(n, 1);
  for (auto& x : g)
    if (x == 0.0f) x = -0.25f;
  std::vector<float> p(n, 0.0f), m(n, 0.0f), v(n, 0.0f);  // p = 0: dp is read without cancellation
  optim::adamw_step_cpu(p.data(), m.data(), v.data(), g.data(), n, cfg, lr, 1, true);
  for (int64_t i = 0; i < n; ++i) {
    INFO("i=" << i << " g=" << g[i] << " p=" << p[i]);
    REQUIRE(p[i] == doctest::Approx(g[i] > 0 ? -lr : lr).epsilon(1e-6));
    REQUIRE(m[i] == doctest::Approx(0.1 * g[i]).epsilon(1e-6));
    REQUIRE(v[i] == doctest::Approx(0.05 * double(g[i]) * g[i]).epsilon(1e-6));
  }

  // eps = 1e-8 and g = 0: nothing moves (m = v = 0, 0 / eps = 0).
  cfg.eps = 1e-8;
  std::vector<float> z(8, 0.0f), pz(8, 0.75f), mz(8, 0.0f), vz(8, 0.0f);
  optim::adamw_step_cpu(pz.data(), mz.data(), vz.data(), z.data(), 8, cfg, lr, 1, true);
  for (int i = 0; i < 8; ++i) CHECK(pz[i] == 0.75f);

  // Decoupled decay on the first step: p = p (1 - lr wd) - lr sign(g).
  cfg.eps = 0.0;
  cfg.weight_decay = 0.1;
  std::vector<float> p1 = {1.0f, -2.0f}, m1(2, 0.0f), v1(2, 0.0f), g1 = {0.5f, 3.0f};
  optim::adamw_step_cpu(p1.data(), m1.data(), v1.data(), g1.data(), 2, cfg, 1e-2, 1, true);
  CHECK(p1[0] == doctest::Approx(1.0 * (1 - 1e-3) - 1e-2).epsilon(1e-7));
  CHECK(p1[1] == doctest::Approx(-2.0 * (1 - 1e-3) - 1e-2).epsilon(1e-7));
  // The same with the decay switch off: the weight decay is not applied.
  std::vector<float> p2 = {1.0f, -2.0f}, m2(2, 0.0f), v2(2, 0.0f);
  optim::adamw_step_cpu(p2.data(), m2.data(), v2.data(), g1.data(), 2, cfg, 1e-2, 1, false);
  CHECK(p2[0] == doctest::Approx(1.0 - 1e-2).epsilon(1e-7));
  CHECK(p2[1] == doctest::Approx(-2.0 - 1e-2).epsilon(1e-7));
}

TEST_CASE("adamw 10 steps vs a double-precision re-implementation") {
  for (bool decay : {false, true}) {
    for (double grad_scale : {1.0, 0.37}) {
      const int64_t n = 4099;
      AdamWConfig cfg;  // OpenRLHF betas (0.9, 0.95), eps 1e-8
      cfg.weight_decay = 0.1;
      auto p = test::random_vec<float>(n, 2, -1.0, 1.0);
      std::vector<float> m(n, 0.0f), v(n, 0.0f);
      RefAdamW ref{std::vector<double>(p.begin(), p.end()), std::vector<double>(n, 0.0),
                   std::vector<double>(n, 0.0)};
      for (int64_t t = 1; t <= 10; ++t) {
        const double lr = 1e-2 * (1.0 - 0.05 * static_cast<double>(t));  // a changing lr
        auto g = spread_grads(n, 100 + static_cast<uint64_t>(t));
        optim::adamw_step_cpu(p.data(), m.data(), v.data(), g.data(), n, cfg, lr, t, decay,
                              static_cast<float>(grad_scale));
        ref.step(g, cfg, lr, t, decay, static_cast<double>(static_cast<float>(grad_scale)));
      }
      const std::string name = fmt::format("adamw(decay={}, grad_scale={})", decay, grad_scale);
      auto cp = test::compare_arrays(p.data(), ref.p.data(), n);
      auto cm = test::compare_arrays(m.data(), ref.m.data(), n, 1e-12);
      auto cv = test::compare_arrays(v.data(), ref.v.data(), n, 1e-24);
      INFO(cp.summary(name + " p"));
      INFO(cm.summary(name + " m"));
      INFO(cv.summary(name + " v"));
      CHECK(cp.finite);
      // p ~ 1 moves by ~0.1 over 10 steps; fp32 rounding of p is ~6e-8 per step.
      CHECK(cp.max_abs_err <= 1e-6);
      // m averages gradients of both signs (|g| <= 10): absolute error, a few ulps of 10.
      // v averages squares (no cancellation): a few ulps relative.
      CHECK(cm.max_abs_err <= 2e-6);
      CHECK(cv.max_rel_err <= 1e-5);
      // The reference itself must have moved p by far more than the tolerance.
      double moved = 0;
      auto p0 = test::random_vec<float>(n, 2, -1.0, 1.0);
      for (int64_t i = 0; i < n; ++i) moved = std::max(moved, std::fabs(ref.p[i] - p0[i]));
      CHECK(moved > 0.05);
    }
  }
}

TEST_CASE("adamw segment form equals one call per range; gaps untouched") {
  const int64_t n = 100000;  // above the threading threshold
  const std::vector<AdamWSegment> segs = {{35200, 64000, true},
                                          {0, 30000, true},
                                          {30064, 5000, false},
                                          {99300, 0, false},
                                          {99500, 500, false}};  // any order; one empty
  AdamWConfig cfg;
  cfg.weight_decay = 0.1;
  auto p0 = test::random_vec<float>(n, 3);
  auto g = test::random_vec<float>(n, 4);
  std::vector<float> pa = p0, ma(n, 0.5f), va(n, 0.25f);
  std::vector<float> pb = p0, mb(n, 0.5f), vb(n, 0.25f);
  for (int64_t t = 1; t <= 3; ++t) {
    optim::adamw_step_segments_cpu(pa.data(), ma.data(), va.data(), g.data(), n, segs, cfg, 1e-3, t,
                                   0.5f);
    for (const auto& s : segs)
      optim::adamw_step_cpu(pb.data() + s.offset, mb.data() + s.offset, vb.data() + s.offset,
                            g.data() + s.offset, s.length, cfg, 1e-3, t, s.decay, 0.5f);
  }
  CHECK(bitwise_equal(pa, pb));
  CHECK(bitwise_equal(ma, mb));
  CHECK(bitwise_equal(va, vb));
  // Gaps (30000..30064, 35064..35200, 99364..99500) keep their values.
  for (int64_t i : {30000, 30063, 35064, 35199, 99400, 99499}) {
    CHECK(pa[i] == p0[i]);
    CHECK(ma[i] == 0.5f);
    CHECK(va[i] == 0.25f);
  }
  // And something did move inside every non-empty segment, with the right decay switch.
  CHECK(pa[10] != p0[10]);
  CHECK(pa[99999] != p0[99999]);
}

TEST_CASE("adamw: same bits for 1 and 2 threads; grad_scale equals pre-scaled gradients") {
  const int64_t n = 70001;
  AdamWConfig cfg;
  cfg.weight_decay = 0.01;
  auto p0 = test::random_vec<float>(n, 5);
  auto g = test::random_vec<float>(n, 6);
  const int saved = omp_get_max_threads();
  std::vector<float> p1 = p0, m1(n, 0.0f), v1(n, 0.0f), p2 = p0, m2(n, 0.0f), v2(n, 0.0f);
  omp_set_num_threads(1);
  optim::adamw_step_cpu(p1.data(), m1.data(), v1.data(), g.data(), n, cfg, 1e-3, 1, true, 0.3f);
  omp_set_num_threads(2);
  optim::adamw_step_cpu(p2.data(), m2.data(), v2.data(), g.data(), n, cfg, 1e-3, 1, true, 0.3f);
  omp_set_num_threads(saved);
  CHECK(bitwise_equal(p1, p2));
  CHECK(bitwise_equal(v1, v2));

  std::vector<float> gs = g;
  for (auto& x : gs) x *= 0.3f;  // what clip_grad_norm_ does in place
  std::vector<float> p3 = p0, m3(n, 0.0f), v3(n, 0.0f);
  optim::adamw_step_cpu(p3.data(), m3.data(), v3.data(), gs.data(), n, cfg, 1e-3, 1, true);
  CHECK(bitwise_equal(p1, p3));
  CHECK(bitwise_equal(m1, m3));
}

TEST_CASE("adamw argument checks") {
  AdamWConfig cfg;
  CHECK_NOTHROW(cfg.validate());
  cfg.beta2 = 1.0;
  CHECK_THROWS_AS(cfg.validate(), Error);
  cfg = AdamWConfig{};
  cfg.lr = -1e-3;
  CHECK_THROWS_AS(cfg.validate(), Error);
  cfg = AdamWConfig{};
  cfg.eps = NAN;
  CHECK_THROWS_AS(cfg.validate(), Error);

  cfg = AdamWConfig{};
  std::vector<float> p(16, 1.0f), m(16), v(16), g(16, 1.0f);
  CHECK_THROWS_AS(
      optim::adamw_step_cpu(p.data(), m.data(), v.data(), g.data(), 16, cfg, 1e-3, 0, true),
      Error);  // step is 1-based
  CHECK_THROWS_AS(
      optim::adamw_step_cpu(p.data(), m.data(), v.data(), g.data(), 16, cfg, NAN, 1, true), Error);
  const std::vector<AdamWSegment> outside = {{10, 7, true}};
  CHECK_THROWS_AS(optim::adamw_step_segments_cpu(p.data(), m.data(), v.data(), g.data(), 16,
                                                 outside, cfg, 1e-3, 1),
                  Error);
  const std::vector<AdamWSegment> overlap = {{8, 8, true}, {0, 9, false}};
  CHECK_THROWS_AS(optim::adamw_step_segments_cpu(p.data(), m.data(), v.data(), g.data(), 16,
                                                 overlap, cfg, 1e-3, 1),
                  Error);
  for (float x : p) CHECK(x == 1.0f);  // a rejected call changes nothing
}
