// exp_fast (model/ops/cpu/vec_math.h) against std::exp in double, rounded to float: ulp error
// over the whole normal range, the edges, special values, and vectorised = scalar.
#include "model/ops/cpu/vec_math.h"

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "tests/test_util.h"

using rlhf::model::exp_fast;

namespace {

// Distance in units in the last place between two positive finite floats (their bit patterns are
// ordered like the values).
int64_t ulp_distance(float a, float b) {
  return std::llabs(static_cast<int64_t>(std::bit_cast<int32_t>(a)) -
                    static_cast<int64_t>(std::bit_cast<int32_t>(b)));
}

struct UlpStats {
  int64_t max_ulp = 0;
  float worst_x = 0;
  double sum_ulp = 0;
  int64_t n = 0;
  void add(float x) {
    const float ref = static_cast<float>(std::exp(static_cast<double>(x)));
    const int64_t u = ulp_distance(exp_fast(x), ref);
    if (u > max_ulp) max_ulp = u, worst_x = x;
    sum_ulp += static_cast<double>(u);
    ++n;
  }
};

}  // namespace

TEST_CASE("exp_fast: accuracy over [-87, 88] against std::exp") {
  UlpStats st;
  // A dense even sweep (step ≈ 1.75e-5, so every reduced argument r is visited many times) ...
  const int64_t kSteps = 10'000'000;
  for (int64_t i = 0; i <= kSteps; ++i)
    st.add(static_cast<float>(-87.0 + 175.0 * static_cast<double>(i) / kSteps));
  // ... plus every float around the points where the range reduction switches n, and near 0.
  for (int n = -126; n <= 127; ++n) {
    float x = static_cast<float>((n + 0.5) * std::log(2.0));
    for (int i = 0; i < 200; ++i) x = std::nextafter(x, -1e9f);
    for (int i = 0; i < 400; ++i, x = std::nextafter(x, 1e9f))
      if (x >= rlhf::model::kExpFastLo && x <= rlhf::model::kExpFastHi) st.add(x);
  }
  for (float x = -1e-3f; x <= 1e-3f; x += 1e-7f) st.add(x);
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> d(-87.0f, 88.0f);
  for (int i = 0; i < 1'000'000; ++i) st.add(d(rng));
  INFO("checked ", st.n, " points, max ", st.max_ulp, " ulp at x = ", st.worst_x, ", mean ",
       st.sum_ulp / static_cast<double>(st.n), " ulp");
  MESSAGE("exp_fast: max ", st.max_ulp, " ulp at x = ", st.worst_x, ", mean ",
          st.sum_ulp / static_cast<double>(st.n), " ulp over ", st.n, " points");
  CHECK(st.max_ulp <= 2);
}

TEST_CASE("exp_fast: exact points and the edges of the range") {
  using rlhf::model::kExpFastHi;
  using rlhf::model::kExpFastLo;
  constexpr float kInf = std::numeric_limits<float>::infinity();
  CHECK(exp_fast(0.0f) == 1.0f);
  CHECK(exp_fast(-0.0f) == 1.0f);
  // The bounds are the last floats whose exp is a normal float: one step further it is
  // subnormal (flushed to 0 here) or overflows.
  CHECK(std::exp(static_cast<double>(kExpFastLo)) >= std::numeric_limits<float>::min());
  CHECK(std::exp(static_cast<double>(std::nextafter(kExpFastLo, -kInf))) <
        std::numeric_limits<float>::min());
  CHECK(static_cast<float>(std::exp(static_cast<double>(kExpFastHi))) < kInf);
  CHECK(static_cast<float>(std::exp(static_cast<double>(std::nextafter(kExpFastHi, kInf)))) ==
        kInf);
  // The 20000 floats inward from each bound: finite, normal, within 2 ulp.
  UlpStats st;
  float lo = kExpFastLo, hi = kExpFastHi;
  for (int i = 0; i < 20000; ++i, lo = std::nextafter(lo, 0.0f), hi = std::nextafter(hi, 0.0f)) {
    st.add(lo);
    st.add(hi);
    CHECK(std::isnormal(exp_fast(lo)));
    CHECK(std::isnormal(exp_fast(hi)));
  }
  INFO("max ", st.max_ulp, " ulp at x = ", st.worst_x);
  CHECK(st.max_ulp <= 2);
  // Beyond: 0 below (no subnormals), +inf above, NaN propagates.
  CHECK(exp_fast(std::nextafter(kExpFastLo, -kInf)) == 0.0f);
  CHECK(exp_fast(-87.5f) == 0.0f);
  CHECK(exp_fast(-1e30f) == 0.0f);
  CHECK(exp_fast(-kInf) == 0.0f);
  CHECK(exp_fast(std::nextafter(kExpFastHi, kInf)) == kInf);
  CHECK(exp_fast(1e30f) == kInf);
  CHECK(exp_fast(kInf) == kInf);
  CHECK(std::isnan(exp_fast(std::numeric_limits<float>::quiet_NaN())));
  CHECK(std::isnan(exp_fast(-std::numeric_limits<float>::quiet_NaN())));
}

TEST_CASE("exp_fast: the vectorised loop gives the same values as scalar calls") {
  auto x = rlhf::test::random_vec<float>(1003, 11, -90.0, 90.0);
  x[5] = std::numeric_limits<float>::quiet_NaN();
  x[6] = -std::numeric_limits<float>::infinity();
  std::vector<float> y(x.size());
  const int64_t n = static_cast<int64_t>(x.size());
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] = exp_fast(x[i]);
  for (int64_t i = 0; i < n; ++i) {
    volatile float xi = x[i];  // defeat vectorisation of the reference
    const float s = exp_fast(xi);
    INFO("i = ", i, " x = ", x[i]);
    if (std::isnan(s))
      CHECK(std::isnan(y[i]));
    else
      CHECK(y[i] == s);
  }
}
