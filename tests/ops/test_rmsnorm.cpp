// RMSNorm: CPU backward vs central finite differences in double, realistic and odd shapes.
#include "model/ops/rmsnorm.h"

#include "tests/test_util.h"

using namespace rlhf;

namespace {

void check_rmsnorm(int64_t N, int64_t C) {
  const std::string name = fmt::format("rmsnorm(N={},C={})", N, C);
  const double eps = 1e-5;
  auto x = test::random_vec<double>(N * C, 1);
  auto w = test::random_vec<double>(C, 2, 0.5, 1.5);
  auto r = test::random_vec<double>(N * C, 3);  // loss = Σ y ⊙ r, so dy = r
  std::vector<double> y(N * C), rstd(N);
  auto loss = [&]() {
    model::rmsnorm_forward_cpu(y.data(), rstd.data(), x.data(), w.data(), N, C, eps);
    return test::dot(y.data(), r.data(), N * C);
  };
  loss();
  // dx accumulates (residual stream): start from a known non-zero value and subtract it after.
  std::vector<double> dx(N * C, 0.25), dw(C, 0.5);
  model::rmsnorm_backward_cpu(dx.data(), dw.data(), r.data(), x.data(), w.data(), rstd.data(), N,
                              C);
  for (auto& v : dx) v -= 0.25;
  for (auto& v : dw) v -= 0.5;
  auto gx = test::fd_check(loss, x.data(), dx.data(), N * C);
  auto gw = test::fd_check(loss, w.data(), dw.data(), C);
  RLHF_CHECK_GRAD(gx, name + " dx");
  RLHF_CHECK_GRAD(gw, name + " dw");
}

}  // namespace

TEST_CASE("rmsnorm backward vs finite differences") {
  check_rmsnorm(64, 288);  // stories15M hidden size
  check_rmsnorm(7, 13);    // odd
  check_rmsnorm(1, 5);     // one row
}

TEST_CASE("rmsnorm forward: unit rms output for unit weight") {
  const int64_t N = 3, C = 11;
  auto x = test::random_vec<float>(N * C, 9, -3, 3);
  std::vector<float> w(C, 1.0f), y(N * C), rstd(N);
  model::rmsnorm_forward_cpu(y.data(), rstd.data(), x.data(), w.data(), N, C, 1e-6);
  for (int64_t n = 0; n < N; ++n) {
    double ss = 0;
    for (int64_t c = 0; c < C; ++c) ss += double(y[n * C + c]) * y[n * C + c];
    CHECK(std::sqrt(ss / C) == doctest::Approx(1.0).epsilon(1e-5));
  }
}
