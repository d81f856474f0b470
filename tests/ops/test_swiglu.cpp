// SwiGLU: CPU backward vs central finite differences in double, closed-form values of silu and
// silu' at a few points, and finite, correctly-limited results at |gate| = 100 and beyond.
#include "model/ops/swiglu.h"

#include <cmath>
#include <limits>

#include "tests/test_util.h"

using namespace rlhf;

namespace {

void check_swiglu_fd(int64_t N, int64_t F, int64_t max_points = 600) {
  const std::string name = fmt::format("swiglu(N={},F={})", N, F);
  auto gate = test::random_vec<double>(N * F, 1, -6, 6);  // covers both tails of the sigmoid
  auto up = test::random_vec<double>(N * F, 2, -2, 2);
  auto r = test::random_vec<double>(N * F, 3);  // loss = Σ h ⊙ r, so dh = r
  std::vector<double> h(N * F);
  auto loss = [&]() {
    model::swiglu_forward_cpu(h.data(), gate.data(), up.data(), N, F);
    return test::dot(h.data(), r.data(), N * F);
  };
  loss();
  std::vector<double> dgate(N * F, 9.0), dup(N * F, 9.0);  // assigned: prior content irrelevant
  model::swiglu_backward_cpu(dgate.data(), dup.data(), r.data(), gate.data(), up.data(), N, F);
  auto gg = test::fd_check(loss, gate.data(), dgate.data(), N * F, 1e-5, true, max_points);
  auto gu = test::fd_check(loss, up.data(), dup.data(), N * F, 1e-5, true, max_points);
  RLHF_CHECK_GRAD(gg, name + " dgate");
  RLHF_CHECK_GRAD(gu, name + " dup");
}

// silu(g) = g / (1 + e^−g) and silu'(g) = σ(g)(1 + g(1 − σ(g))), evaluated by hand (Python
// math, 17 digits) at g = 0, 1, −1, 2, −3.
struct Point {
  double g, silu, dsilu;
};
constexpr Point kPoints[] = {
    {0.0, 0.0, 0.5},
    {1.0, 0.7310585786300049, 0.9276705118714869},
    {-1.0, -0.2689414213699951, 0.07232948812851325},
    {2.0, 1.7615941559557646, 1.0907842487848955},
    {-3.0, -0.14227761953270035, -0.08810410601516962},
};

template <typename T>
void check_closed_form() {
  const double eps = std::is_same_v<T, float> ? 1e-6 : 1e-14;
  const int64_t F = std::size(kPoints);
  std::vector<T> gate(F), up(F), dh(F), h(F), dgate(F), dup(F);
  for (int64_t i = 0; i < F; ++i) {
    gate[i] = static_cast<T>(kPoints[i].g);
    up[i] = static_cast<T>(0.5 + i);  // distinct multipliers so a swapped output shows
    dh[i] = static_cast<T>(1.5 - i);
  }
  model::swiglu_forward_cpu(h.data(), gate.data(), up.data(), 1, F);
  model::swiglu_backward_cpu(dgate.data(), dup.data(), dh.data(), gate.data(), up.data(), 1, F);
  for (int64_t i = 0; i < F; ++i) {
    const Point& p = kPoints[i];
    const double u = 0.5 + i, d = 1.5 - i;
    INFO(fmt::format("swiglu<{}> at gate={} up={} dh={}",
                     std::is_same_v<T, float> ? "float" : "double", p.g, u, d));
    CHECK(double(h[i]) == doctest::Approx(p.silu * u).epsilon(eps));
    CHECK(double(dup[i]) == doctest::Approx(p.silu * d).epsilon(eps));
    CHECK(double(dgate[i]) == doctest::Approx(p.dsilu * u * d).epsilon(eps));
  }
}

template <typename T>
void check_large_inputs() {
  // silu(g) → g and silu'(g) → 1 for g → +∞; both → 0 for g → −∞ (silu(−100) ≈ −3.7e−42).
  const std::vector<T> gate = {T(100),
                               T(-100),
                               T(1000),
                               T(-1000),
                               T(88.7),
                               T(-88.7),
                               std::numeric_limits<T>::max(),
                               std::numeric_limits<T>::lowest()};
  const int64_t F = static_cast<int64_t>(gate.size());
  std::vector<T> up(F, T(1)), dh(F, T(1)), h(F), dgate(F), dup(F);
  model::swiglu_forward_cpu(h.data(), gate.data(), up.data(), 1, F);
  model::swiglu_backward_cpu(dgate.data(), dup.data(), dh.data(), gate.data(), up.data(), 1, F);
  for (int64_t i = 0; i < F; ++i) {
    INFO(fmt::format("swiglu<{}> at gate={}", std::is_same_v<T, float> ? "float" : "double",
                     double(gate[i])));
    CHECK(std::isfinite(h[i]));
    CHECK(std::isfinite(dgate[i]));
    CHECK(std::isfinite(dup[i]));
    if (gate[i] > 0) {
      CHECK(h[i] == doctest::Approx(gate[i]).epsilon(1e-6));
      CHECK(dgate[i] == doctest::Approx(1.0).epsilon(1e-6));
    } else {
      CHECK(std::fabs(double(h[i])) <= 1e-30);
      CHECK(std::fabs(double(dgate[i])) <= 1e-30);
    }
  }
}

// The fp32 path evaluates e^x with its own vectorisable polynomial (the fp64 path uses std::exp):
// compare fp32 against fp64 run on the same fp32 inputs, over a dense gate grid in [−100, 100].
void check_float_vs_double() {
  const int64_t F = 20001;  // gate step 0.01
  std::vector<float> gate(F), up(F), dh(F), h(F), dgate(F), dup(F);
  auto u = test::random_vec<float>(F, 41, -2, 2);
  auto d = test::random_vec<float>(F, 42, -2, 2);
  for (int64_t i = 0; i < F; ++i) {
    gate[i] = static_cast<float>(-100.0 + 0.01 * static_cast<double>(i));
    up[i] = u[i];
    dh[i] = d[i];
  }
  std::vector<double> gd(gate.begin(), gate.end()), ud(up.begin(), up.end()),
      dd(dh.begin(), dh.end()), hd(F), dgd(F), dud(F);
  model::swiglu_forward_cpu(h.data(), gate.data(), up.data(), 1, F);
  model::swiglu_backward_cpu(dgate.data(), dup.data(), dh.data(), gate.data(), up.data(), 1, F);
  model::swiglu_forward_cpu(hd.data(), gd.data(), ud.data(), 1, F);
  model::swiglu_backward_cpu(dgd.data(), dud.data(), dd.data(), gd.data(), ud.data(), 1, F);
  // Error relative to max(|ref|, 0.1): a few fp32 roundings (~6e−8 each) of the ~10 operations
  // (measured: ≤ 4.1e−7), with a floor for the zero crossing of silu' near gate = −1.28 where
  // 1 + g(1 − σ) cancels. A wrong reduction step, or a Taylor coefficient off by a few percent,
  // gives 1e−5 or more.
  const double floor = 0.1, bound = 1e-6;
  auto ch = test::compare_arrays(h.data(), hd.data(), F, floor);
  auto cg = test::compare_arrays(dgate.data(), dgd.data(), F, floor);
  auto cu = test::compare_arrays(dup.data(), dud.data(), F, floor);
  INFO("swiglu(N=1,F=20001) fp32 vs fp64 on gate grid [-100, 100]");
  INFO(ch.summary("h"));
  INFO(cg.summary("dgate"));
  INFO(cu.summary("dup"));
  CHECK((ch.finite && cg.finite && cu.finite));
  CHECK(ch.max_rel_err <= bound);
  CHECK(cg.max_rel_err <= bound);
  CHECK(cu.max_rel_err <= bound);
}

}  // namespace

TEST_CASE("swiglu: fp32 (own exp) vs fp64 (std::exp) over gate in [-100, 100]") {
  check_float_vs_double();
}

TEST_CASE("swiglu backward vs finite differences") {
  check_swiglu_fd(24, 768, 150);  // stories15M intermediate size, 150 sampled points
  check_swiglu_fd(7, 13);         // odd
  check_swiglu_fd(1, 5);          // one row
}

TEST_CASE("swiglu: closed-form values") {
  check_closed_form<float>();
  check_closed_form<double>();
}

TEST_CASE("swiglu: no inf or NaN for large |gate|") {
  check_large_inputs<float>();
  check_large_inputs<double>();
}
