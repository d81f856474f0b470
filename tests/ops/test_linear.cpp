// Linear: CPU backward vs central finite differences in double, forward and backward vs a naive
// triple loop (float and double, with and without bias, dx assigned or accumulated), a db that
// does not depend on the thread count, and a skipped throughput measurement.
#include "model/ops/linear.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <limits>
#include <type_traits>

#include "core/error.h"
#include "tests/test_util.h"

using namespace rlhf;

namespace {

// Restores the OpenMP and OpenBLAS thread counts on scope exit.
struct ThreadCountGuard {
  int saved_omp = omp_get_max_threads();
  int saved_blas = openblas_get_num_threads();
  ~ThreadCountGuard() {
    omp_set_num_threads(saved_omp);
    openblas_set_num_threads(saved_blas);
  }
};

void check_linear_fd(int64_t N, int64_t IC, int64_t OC, bool bias, int64_t max_points) {
  const std::string name = fmt::format("linear(N={},IC={},OC={},bias={})", N, IC, OC, bias);
  auto x = test::random_vec<double>(N * IC, 1);
  auto w = test::random_vec<double>(OC * IC, 2);
  auto b = test::random_vec<double>(OC, 3);
  auto r = test::random_vec<double>(N * OC, 4);  // loss = Σ y ⊙ r, so dy = r
  std::vector<double> y(N * OC);
  const double* bp = bias ? b.data() : nullptr;
  auto loss = [&]() {
    model::linear_forward_cpu(y.data(), x.data(), w.data(), bp, N, IC, OC);
    return test::dot(y.data(), r.data(), N * OC);
  };
  loss();
  // dx assigned; dw, db accumulate: start them from a known value and subtract it afterwards.
  std::vector<double> dx(N * IC, 7.0), dw(OC * IC, 0.5), db(OC, -0.25);
  model::linear_backward_cpu(dx.data(), dw.data(), bias ? db.data() : nullptr, r.data(), x.data(),
                             w.data(), N, IC, OC, /*accumulate_dx=*/false);
  for (auto& v : dw) v -= 0.5;
  for (auto& v : db) v += 0.25;
  auto gx = test::fd_check(loss, x.data(), dx.data(), N * IC, 1e-5, true, max_points);
  auto gw = test::fd_check(loss, w.data(), dw.data(), OC * IC, 1e-5, true, max_points);
  RLHF_CHECK_GRAD(gx, name + " dx");
  RLHF_CHECK_GRAD(gw, name + " dw");
  if (bias) {
    auto gb = test::fd_check(loss, b.data(), db.data(), OC, 1e-5, true, max_points);
    RLHF_CHECK_GRAD(gb, name + " db");
  } else {
    for (auto v : db) CHECK(v == 0.0);  // db == nullptr: untouched (the -0.25 came back off)
  }
}

// Naive references, accumulated in double.
template <typename T>
std::vector<double> naive_forward(const std::vector<T>& x, const std::vector<T>& w, const T* b,
                                  int64_t N, int64_t IC, int64_t OC) {
  std::vector<double> y(N * OC);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < OC; ++o) {
      double s = b ? double(b[o]) : 0.0;
      for (int64_t i = 0; i < IC; ++i) s += double(x[n * IC + i]) * double(w[o * IC + i]);
      y[n * OC + o] = s;
    }
  return y;
}

// Float GEMM with K ≤ 768 terms of |x·w| ≤ 1: relative error per element ~1e-7·sqrt(K), so the
// nmse is ~1e-12; 1e-10 leaves room and still catches any wrong term (nmse ~1e-3 or more).
// Double: ~1e-30 expected, 1e-24 bound.
template <typename T>
double nmse_bound() {
  return std::is_same_v<T, float> ? 1e-10 : 1e-24;
}

template <typename T>
void check_linear_vs_naive(int64_t N, int64_t IC, int64_t OC, bool bias, bool accumulate_dx) {
  const std::string name =
      fmt::format("linear<{}>(N={},IC={},OC={},bias={},accumulate_dx={})",
                  std::is_same_v<T, float> ? "float" : "double", N, IC, OC, bias, accumulate_dx);
  INFO(name);
  auto x = test::random_vec<T>(N * IC, 11);
  auto w = test::random_vec<T>(OC * IC, 12);
  auto b = test::random_vec<T>(OC, 13);
  auto dy = test::random_vec<T>(N * OC, 14);
  const T* bp = bias ? b.data() : nullptr;

  // forward: y starts as NaN, which a beta = 0 GEMM must not read
  std::vector<T> y(N * OC, std::numeric_limits<T>::quiet_NaN());
  model::linear_forward_cpu(y.data(), x.data(), w.data(), bp, N, IC, OC);
  auto y_ref = naive_forward(x, w, bp, N, IC, OC);
  auto cy = test::compare_arrays(y.data(), y_ref.data(), N * OC);
  INFO(cy.summary("y"));
  CHECK(cy.finite);
  CHECK(cy.nmse <= nmse_bound<T>());

  // backward: prior content of dx (when accumulating), dw and db must be kept and added to
  auto dx0 = test::random_vec<T>(N * IC, 15);
  auto dw0 = test::random_vec<T>(OC * IC, 16);
  auto db0 = test::random_vec<T>(OC, 17);
  std::vector<T> dx = dx0, dw = dw0, db = db0;
  if (!accumulate_dx) std::fill(dx.begin(), dx.end(), std::numeric_limits<T>::quiet_NaN());
  model::linear_backward_cpu(dx.data(), dw.data(), bias ? db.data() : nullptr, dy.data(), x.data(),
                             w.data(), N, IC, OC, accumulate_dx);
  std::vector<double> dx_ref(N * IC), dw_ref(OC * IC), db_ref(OC);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t i = 0; i < IC; ++i) {
      double s = accumulate_dx ? double(dx0[n * IC + i]) : 0.0;
      for (int64_t o = 0; o < OC; ++o) s += double(dy[n * OC + o]) * double(w[o * IC + i]);
      dx_ref[n * IC + i] = s;
    }
  for (int64_t o = 0; o < OC; ++o)
    for (int64_t i = 0; i < IC; ++i) {
      double s = dw0[o * IC + i];
      for (int64_t n = 0; n < N; ++n) s += double(dy[n * OC + o]) * double(x[n * IC + i]);
      dw_ref[o * IC + i] = s;
    }
  for (int64_t o = 0; o < OC; ++o) {
    double s = db0[o];
    if (bias)
      for (int64_t n = 0; n < N; ++n) s += dy[n * OC + o];
    db_ref[o] = s;
  }
  auto cdx = test::compare_arrays(dx.data(), dx_ref.data(), N * IC);
  auto cdw = test::compare_arrays(dw.data(), dw_ref.data(), OC * IC);
  auto cdb = test::compare_arrays(db.data(), db_ref.data(), OC);
  INFO(cdx.summary("dx"));
  INFO(cdw.summary("dw"));
  INFO(cdb.summary("db"));
  CHECK(cdx.finite);
  CHECK(cdx.nmse <= nmse_bound<T>());
  CHECK(cdw.nmse <= nmse_bound<T>());
  CHECK(cdb.nmse <= nmse_bound<T>());
  if (!bias) CHECK(cdb.max_abs_err == 0.0);  // db == nullptr: untouched

  // dx == nullptr skips dx and still produces dw, db
  std::vector<T> dw2 = dw0, db2 = db0;
  model::linear_backward_cpu<T>(nullptr, dw2.data(), bias ? db2.data() : nullptr, dy.data(),
                                x.data(), w.data(), N, IC, OC, accumulate_dx);
  CHECK(dw2 == dw);
  CHECK(db2 == db);
}

}  // namespace

TEST_CASE("linear backward vs finite differences") {
  // One thread: FD checks the arithmetic, and its ~800 small GEMMs would each pay a thread
  // hand-off, which on a shared 2-core box under load costs seconds. The threaded paths are
  // covered by the naive-loop and thread-count cases below.
  ThreadCountGuard guard;
  omp_set_num_threads(1);
  openblas_set_num_threads(1);
  check_linear_fd(24, 288, 768, true, 32);   // stories15M up_proj shape, 32 sampled points
  check_linear_fd(24, 768, 288, false, 32);  // stories15M down_proj shape
  check_linear_fd(7, 13, 11, true, 600);     // odd
  check_linear_fd(5, 11, 13, false, 600);    // odd, no bias
  check_linear_fd(1, 5, 7, true, 600);       // one row
}

TEST_CASE("linear forward and backward vs naive triple loop") {
  for (bool bias : {false, true})
    for (bool acc : {false, true}) {
      check_linear_vs_naive<float>(32, 288, 768, bias, acc);
      check_linear_vs_naive<double>(32, 288, 768, bias, acc);
      check_linear_vs_naive<float>(13, 7, 11, bias, acc);
      check_linear_vs_naive<double>(5, 11, 13, bias, acc);
      check_linear_vs_naive<float>(1, 5, 7, bias, acc);
    }
}

TEST_CASE("linear backward: db does not depend on the thread count") {
  // N·OC above the kernel's OpenMP threshold, so several threads really run.
  const int64_t N = 97, IC = 5, OC = 771;
  auto x = test::random_vec<float>(N * IC, 21);
  auto w = test::random_vec<float>(OC * IC, 22);
  auto dy = test::random_vec<float>(N * OC, 23, -100, 100);
  // Reference: rows summed in order in float, the order the contract promises.
  std::vector<float> db_ref(OC, 0.5f);
  for (int64_t o = 0; o < OC; ++o) {
    float s = 0;
    for (int64_t n = 0; n < N; ++n) s += dy[n * OC + o];
    db_ref[o] += s;
  }
  ThreadCountGuard guard;
  for (int threads : {1, 2, 3, 5}) {
    INFO("threads=" << threads);
    omp_set_num_threads(threads);
    std::vector<float> dw(OC * IC, 0.0f), db(OC, 0.5f);
    model::linear_backward_cpu<float>(nullptr, dw.data(), db.data(), dy.data(), x.data(), w.data(),
                                      N, IC, OC, false);
    CHECK(db == db_ref);  // bitwise
  }
}

TEST_CASE(
    "linear backward: a frozen weight (dw = nullptr) skips its gradient, dx and db as usual") {
  const int64_t N = 9, IC = 6, OC = 5;
  auto x = test::random_vec<float>(N * IC, 31);
  auto w = test::random_vec<float>(OC * IC, 32);
  auto dy = test::random_vec<float>(N * OC, 33);
  std::vector<float> dx_ref(N * IC, 0.25f), dw_ref(OC * IC, 0.0f), db_ref(OC, 0.5f);
  model::linear_backward_cpu<float>(dx_ref.data(), dw_ref.data(), db_ref.data(), dy.data(),
                                    x.data(), w.data(), N, IC, OC, true);
  std::vector<float> dx(N * IC, 0.25f), db(OC, 0.5f);
  model::linear_backward_cpu<float>(dx.data(), nullptr, db.data(), dy.data(), x.data(), w.data(), N,
                                    IC, OC, true);
  CHECK(dx == dx_ref);  // bitwise: the same GEMM
  CHECK(db == db_ref);
  // dx against the definition dx[n, i] = 0.25 + Σ_o dy[n, o]·w[o, i] (accumulated).
  for (int64_t n = 0; n < N; ++n)
    for (int64_t i = 0; i < IC; ++i) {
      double ref = 0.25;
      for (int64_t o = 0; o < OC; ++o) ref += double(dy[n * OC + o]) * double(w[o * IC + i]);
      CHECK(dx[n * IC + i] == doctest::Approx(ref).epsilon(1e-5));
    }
  // And a gradient that was really computed is not all zeros (the comparison means something).
  CHECK(std::any_of(dw_ref.begin(), dw_ref.end(), [](float v) { return v != 0.0f; }));
}

TEST_CASE("gemm_cpu: transposes, leading dimensions and K = 0") {
  // C(2,3) = A(2,2)·B(2,3) with A stored transposed and padded rows (lda = 4), into a padded C.
  const std::vector<double> At = {1, 3, 0, 0,        // Aᵀ row 0 = column 0 of A = (1, 3)
                                  2, 4, 0, 0};       // A = [[1, 2], [3, 4]]
  const std::vector<double> B = {1, 0, 2, 0, 1, 3};  // [[1, 0, 2], [0, 1, 3]]
  std::vector<double> C = {1, 1, 1, 9, 1, 1, 1, 9};  // ldc = 4; column 3 must stay 9
  model::gemm_cpu<double>(true, false, 2, 3, 2, 2.0, At.data(), 4, B.data(), 3, 1.0, C.data(), 4);
  // 2·A·B + C = 2·[[1, 2, 8], [3, 4, 18]] + 1
  const std::vector<double> expect = {3, 5, 17, 9, 7, 9, 37, 9};
  CHECK(C == expect);
  // K = 0: C = beta·C, and beta = 0 clears NaN
  std::vector<float> C0 = {std::numeric_limits<float>::quiet_NaN(), 2.0f};
  model::gemm_cpu<float>(false, false, 1, 2, 0, 1.0f, nullptr, 1, nullptr, 2, 0.0f, C0.data(), 2);
  CHECK(C0[0] == 0.0f);
  CHECK(C0[1] == 0.0f);
  // a leading dimension smaller than the row is an error, not a silent BLAS no-op
  CHECK_THROWS_AS(model::gemm_cpu<double>(false, false, 2, 3, 2, 1.0, At.data(), 1, B.data(), 3,
                                          0.0, C.data(), 4),
                  rlhf::Error);
}

// Throughput of the float forward at a stories15M up_proj shape over a 4096-token batch, against
// the bare sgemm it wraps. Not a test (no timed assertions): run with
//   OMP_NUM_THREADS=2 ./build/rlhf_tests -tc="linear forward throughput*" --no-skip -s
TEST_CASE("linear forward throughput (N=4096, IC=288, OC=768, 2 threads)" * doctest::skip()) {
  const int64_t N = 4096, IC = 288, OC = 768;
  ThreadCountGuard guard;
  omp_set_num_threads(2);
  openblas_set_num_threads(2);
  auto x = test::random_vec<float>(N * IC, 31);
  auto w = test::random_vec<float>(OC * IC, 32);
  auto b = test::random_vec<float>(OC, 33);
  std::vector<float> y(N * OC);
  const double flop = 2.0 * N * IC * OC;
  auto best_gflops = [&](auto&& fn) {
    fn();  // warm-up
    double best = 1e30;
    for (int rep = 0; rep < 20; ++rep) {
      auto t0 = std::chrono::steady_clock::now();
      fn();
      best = std::min(best,
                      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    return std::pair{flop / best * 1e-9, best * 1e3};
  };
  auto [g_gemm, ms_gemm] = best_gflops([&] {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, OC, IC, 1.0f, x.data(), IC, w.data(),
                IC, 0.0f, y.data(), OC);
  });
  auto [g_nob, ms_nob] = best_gflops(
      [&] { model::linear_forward_cpu<float>(y.data(), x.data(), w.data(), nullptr, N, IC, OC); });
  auto [g_b, ms_b] = best_gflops(
      [&] { model::linear_forward_cpu<float>(y.data(), x.data(), w.data(), b.data(), N, IC, OC); });
  MESSAGE(
      fmt::format("best of 20, {} OpenBLAS threads: cblas_sgemm {:.1f} GFLOP/s ({:.2f} ms) | "
                  "linear_forward no bias {:.1f} GFLOP/s ({:.2f} ms, {:.2f}x) | with bias {:.1f} "
                  "GFLOP/s ({:.2f} ms, {:.2f}x)",
                  openblas_get_num_threads(), g_gemm, ms_gemm, g_nob, ms_nob, g_nob / g_gemm, g_b,
                  ms_b, g_b / g_gemm));
}
