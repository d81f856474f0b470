// Sum of squares in double (hand-computed cases, independence from the thread count) and the
// clip coefficient of torch.nn.utils.clip_grad_norm_.
#include "optim/clip.h"

#include <omp.h>

#include <cmath>
#include <vector>

#include "core/error.h"
#include "tests/test_util.h"

using namespace rlhf;

TEST_CASE("sum_of_squares: hand-computed vectors") {
  const std::vector<float> v34 = {3.0f, -4.0f};
  CHECK(optim::sum_of_squares(v34.data(), 2) == 25.0);
  CHECK(optim::sum_of_squares(v34.data(), 0) == 0.0);

  const std::vector<float> v = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11};  // a tail after 8 lanes
  CHECK(optim::sum_of_squares(v.data(), 11) == 506.0);               // n(n+1)(2n+1)/6

  // Many blocks (4096 elements each) plus a partial one: 0.5² summed exactly in double.
  const int64_t n = 3 * optim::kSumSquaresBlockElems + 123;
  std::vector<float> half(n, 0.5f);
  CHECK(optim::sum_of_squares(half.data(), n) == 0.25 * static_cast<double>(n));

  // Double accumulation: 1e4² + 1000 · 0.001² keeps the small terms (fp32 would return 1e8).
  std::vector<float> mix(1001, 1e-3f);
  mix[0] = 1e4f;
  const double small = static_cast<double>(1e-3f);
  const double expected = 1e8 + 1000.0 * small * small;  // 100000000.001 (to ~1e-16 relative)
  // Double keeps the 1e-3 of small terms to a few ulps of 1e8 (1.5e-8 each).
  CHECK(std::fabs(optim::sum_of_squares(mix.data(), 1001) - expected) < 1e-6);

  const std::vector<float> bad = {1.0f, NAN, 2.0f};
  CHECK(std::isnan(optim::sum_of_squares(bad.data(), 3)));
  CHECK_THROWS_AS(optim::sum_of_squares(bad.data(), -1), Error);
}

TEST_CASE("sum_of_squares: the same bits for 1, 2 and 3 threads") {
  const int64_t n = 37 * optim::kSumSquaresBlockElems + 4095;  // > the threading threshold
  auto x = test::random_vec<float>(n, 11, -3.0, 3.0);
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  const double s1 = optim::sum_of_squares(x.data(), n);
  omp_set_num_threads(2);
  const double s2 = optim::sum_of_squares(x.data(), n);
  omp_set_num_threads(3);
  const double s3 = optim::sum_of_squares(x.data(), n);
  omp_set_num_threads(saved);
  CHECK(s1 == s2);
  CHECK(s1 == s3);
  // And it is the sum of squares: against a long-double sequential reference.
  long double ref = 0;
  for (float xi : x) ref += static_cast<long double>(xi) * xi;
  CHECK(s1 == doctest::Approx(static_cast<double>(ref)).epsilon(1e-13));
}

TEST_CASE("clip_coefficient as torch.nn.utils.clip_grad_norm_") {
  // Norm 5 with max_norm 1: 1 / (5 + 1e-6).
  CHECK(optim::clip_coefficient(5.0, 1.0) == 1.0 / (5.0 + 1e-6));
  CHECK(optim::clip_coefficient(5.0, 1.0) == doctest::Approx(0.19999996000000800));
  // Below max_norm: clamped to 1 (torch multiplies by 1.0).
  CHECK(optim::clip_coefficient(0.5, 1.0) == 1.0);
  // At max_norm exactly the + 1e-6 makes it just below 1 (torch's behaviour).
  CHECK(optim::clip_coefficient(1.0, 1.0) == 1.0 / (1.0 + 1e-6));
  CHECK(optim::clip_coefficient(1.0, 1.0) < 1.0);
  // Zero gradient: max_norm / 1e-6 clamped to 1.
  CHECK(optim::clip_coefficient(0.0, 1.0) == 1.0);
  // Disabled.
  CHECK(optim::clip_coefficient(1e9, 0.0) == 1.0);
  CHECK(optim::clip_coefficient(1e9, -1.0) == 1.0);
  // Non-finite norms surface.
  CHECK(std::isnan(optim::clip_coefficient(NAN, 1.0)));
  CHECK(optim::clip_coefficient(INFINITY, 1.0) == 0.0);

  // End to end on a hand-computed gradient: g = (3, 4, 0, 12) has norm 13; max_norm 6.5.
  const std::vector<float> g = {3.0f, 4.0f, 0.0f, 12.0f};
  const double norm = std::sqrt(optim::sum_of_squares(g.data(), 4));
  CHECK(norm == 13.0);
  CHECK(optim::clip_coefficient(norm, 6.5) == doctest::Approx(0.5).epsilon(1e-7));
}
