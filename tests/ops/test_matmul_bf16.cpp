// bf16 GEMMs through oneDNN (model/ops/matmul_bf16.h) against a double-precision reference on the
// same bf16-rounded operands: the three GEMMs of a linear layer (forward with and without bias,
// dx assigned and accumulated, dw accumulated, dw = nullptr for a frozen weight), transposed
// operands with padded leading dimensions, odd shapes (one row, OC not a multiple of 16, K = 0),
// the fp32-signature adapters (which must round their inputs to bf16: their distance from the
// unrounded fp32 product is the bf16 input rounding, not zero), bit-identical repeats at a fixed
// thread count, the primitive cache (one per shape and thread count), and the errors. Bounds (the
// CUDA op tests' kNmseF32Out, tests/ops/cuda_test_util.h): fp32 outputs on exactly-representable
// bf16 products differ from the double reference only by fp32 summation order, nmse ~1e-13 for K <=
// 1536, so 1e-8; one bf16 rounding of each input gives nmse ~2·(2^-9)²/3 ≈ 2.5e-6, bounded by
// kNmseBf16Out = 2e-5.
#include "model/ops/matmul_bf16.h"

#include <omp.h>

#include <limits>
#include <vector>

#include "core/error.h"
#include "model/ops/linear.h"
#include "tests/test_util.h"

using namespace rlhf;
using model::bfloat16;

namespace {

constexpr double kNmseF32Out = 1e-8;
constexpr double kNmseBf16Out = 2e-5;

std::vector<float> rounded(std::vector<float> v) {
  for (auto& x : v) x = model::round_to_bf16(x);
  return v;
}
std::vector<bfloat16> to_bf16(const std::vector<float>& v) {
  std::vector<bfloat16> r(v.size());
  model::float_to_bf16_n(r.data(), v.data(), int64_t(v.size()));
  return r;
}

// Double reference of the three GEMMs of a linear layer (y = x·wᵀ + b; dx = dy·w (+ dx0);
// dw = dw0 + dyᵀ·x; db = db0 + Σ dy).
struct LinearRef {
  std::vector<double> y, dx, dw, db;
};
LinearRef linear_ref(const std::vector<float>& x, const std::vector<float>& w, const float* b,
                     const std::vector<float>& dy, const std::vector<float>* dx0,
                     const std::vector<float>& dw0, const std::vector<float>& db0, int64_t N,
                     int64_t IC, int64_t OC) {
  LinearRef r;
  r.y.resize(N * OC);
  r.dx.resize(N * IC);
  r.dw.resize(OC * IC);
  r.db.resize(OC);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < OC; ++o) {
      double s = b ? b[o] : 0.0;
      for (int64_t i = 0; i < IC; ++i) s += double(x[n * IC + i]) * w[o * IC + i];
      r.y[n * OC + o] = s;
    }
  for (int64_t n = 0; n < N; ++n)
    for (int64_t i = 0; i < IC; ++i) {
      double s = dx0 ? (*dx0)[n * IC + i] : 0.0;
      for (int64_t o = 0; o < OC; ++o) s += double(dy[n * OC + o]) * w[o * IC + i];
      r.dx[n * IC + i] = s;
    }
  for (int64_t o = 0; o < OC; ++o) {
    for (int64_t i = 0; i < IC; ++i) {
      double s = dw0[o * IC + i];
      for (int64_t n = 0; n < N; ++n) s += double(dy[n * OC + o]) * x[n * IC + i];
      r.dw[o * IC + i] = s;
    }
    double s = db0[o];
    for (int64_t n = 0; n < N; ++n) s += dy[n * OC + o];
    r.db[o] = s;
  }
  return r;
}

void check_close(const std::string& what, const std::vector<float>& got,
                 const std::vector<double>& ref, double bound) {
  REQUIRE(got.size() == ref.size());
  const auto c = test::compare_arrays(got.data(), ref.data(), int64_t(ref.size()));
  MESSAGE(c.summary(what) << fmt::format(" (bound {:.1e})", bound));
  CHECK_MESSAGE(c.finite, what << ": non-finite values");
  CHECK_MESSAGE(c.nmse <= bound, what << ": nmse " << c.nmse << " above " << bound);
}

// Both entry points (bf16 operands; fp32 adapters) on one shape against the reference.
void check_linear_bf16(int64_t N, int64_t IC, int64_t OC, bool bias, bool accumulate_dx) {
  const std::string name = fmt::format("linear_bf16(N={},IC={},OC={},bias={},acc_dx={})", N, IC, OC,
                                       bias, accumulate_dx);
  const auto x = rounded(test::random_vec<float>(N * IC, 1));
  const auto w = rounded(test::random_vec<float>(OC * IC, 2, -0.2, 0.2));
  const auto b = test::random_vec<float>(OC, 3);
  const auto dy = rounded(test::random_vec<float>(N * OC, 4));
  const auto dx0 = test::random_vec<float>(N * IC, 5);
  const auto dw0 = test::random_vec<float>(OC * IC, 6);
  const auto db0 = test::random_vec<float>(OC, 7);
  const float* bp = bias ? b.data() : nullptr;
  const LinearRef ref =
      linear_ref(x, w, bp, dy, accumulate_dx ? &dx0 : nullptr, dw0, db0, N, IC, OC);
  const auto x16 = to_bf16(x), w16 = to_bf16(w), dy16 = to_bf16(dy);

  // bf16 operands. y and an assigned dx start as NaN, which must not be read.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> y(N * OC, nan), dx = accumulate_dx ? dx0 : std::vector<float>(N * IC, nan),
                                     dw = dw0, db = db0;
  model::linear_forward_bf16(y.data(), x16.data(), w16.data(), bp, N, IC, OC);
  model::linear_backward_bf16(dx.data(), dw.data(), db.data(), dy16.data(), x16.data(), w16.data(),
                              N, IC, OC, accumulate_dx);
  check_close(name + " y", y, ref.y, kNmseF32Out);
  check_close(name + " dx", dx, ref.dx, kNmseF32Out);
  check_close(name + " dw", dw, ref.dw, kNmseF32Out);
  check_close(name + " db", db, ref.db, kNmseF32Out);

  // The fp32 adapters on the same (already bf16-exact) values: the same results, bit for bit.
  std::vector<float> y2(N * OC, nan), dx2 = accumulate_dx ? dx0 : std::vector<float>(N * IC, nan),
                                      dw2 = dw0, db2 = db0;
  model::linear_forward_bf16_cpu(y2.data(), x.data(), w.data(), bp, N, IC, OC);
  model::linear_backward_bf16_cpu(dx2.data(), dw2.data(), db2.data(), dy.data(), x.data(), w.data(),
                                  N, IC, OC, accumulate_dx);
  CHECK(y2 == y);
  CHECK(dx2 == dx);
  CHECK(dw2 == dw);
  CHECK(db2 == db);
}

}  // namespace

TEST_CASE("matmul bf16: without oneDNN the GEMMs refuse clearly") {
  if (model::onednn_available()) {
    MESSAGE("built with " << model::onednn_version_string());
    return;
  }
  std::vector<bfloat16> a(4), b(4);
  std::vector<float> c(4);
  CHECK_THROWS_WITH_AS(model::matmul_bf16_cpu(false, false, 2, 2, 2, a.data(), 2, b.data(), 2,
                                              nullptr, c.data(), 2, false),
                       doctest::Contains("no oneDNN"), rlhf::Error);
}

TEST_CASE("matmul bf16: linear GEMMs against a double reference on bf16 operands") {
  if (!model::onednn_available()) return;
  MESSAGE(model::onednn_version_string()
          << ": bf16 impl " << model::onednn_matmul_impl(true, 64, 768, 288) << ", fp32 impl "
          << model::onednn_matmul_impl(false, 64, 768, 288));
  check_linear_bf16(64, 288, 768, false, false);  // stories15M gate/up
  check_linear_bf16(64, 768, 288, true, true);    // stories15M down, bias, dx +=
  check_linear_bf16(96, 576, 1536, true, false);  // SmolLM-135M gate/up
  check_linear_bf16(33, 1536, 576, false, true);  // SmolLM-135M down (K = 1536)
  check_linear_bf16(40, 576, 192, true, true);    // SmolLM k/v projection
  check_linear_bf16(7, 13, 11, true, false);      // odd everything
  check_linear_bf16(1, 5, 7, false, true);        // one row
  check_linear_bf16(1, 64, 49, true, false);      // one row, OC not a multiple of 16
  check_linear_bf16(5, 7, 1, true, false);        // one output (a scalar head)
  check_linear_bf16(17, 32, 33, true, true);      // OC = 33
}

TEST_CASE("matmul bf16: frozen weights (dw = nullptr), dx = nullptr, N = 0, K = 0") {
  if (!model::onednn_available()) return;
  const int64_t N = 9, IC = 16, OC = 24;
  const auto x = rounded(test::random_vec<float>(N * IC, 41));
  const auto w = rounded(test::random_vec<float>(OC * IC, 42));
  const auto dy = rounded(test::random_vec<float>(N * OC, 43));
  const std::vector<float> zeros_w(OC * IC, 0.0f), zeros_b(OC, 0.0f);
  const LinearRef ref = linear_ref(x, w, nullptr, dy, nullptr, zeros_w, zeros_b, N, IC, OC);
  std::vector<float> dx(N * IC), db(OC, 0.0f);
  model::linear_backward_bf16_cpu(dx.data(), nullptr, db.data(), dy.data(), x.data(), w.data(), N,
                                  IC, OC, false);
  check_close("frozen dx", dx, ref.dx, kNmseF32Out);
  check_close("frozen db", db, ref.db, kNmseF32Out);
  std::vector<float> dw(OC * IC, 0.0f);
  model::linear_backward_bf16_cpu(nullptr, dw.data(), nullptr, dy.data(), x.data(), w.data(), N, IC,
                                  OC, false);
  check_close("dx skipped: dw", dw, ref.dw, kNmseF32Out);
  // N = 0: nothing written; the weight gradient of no rows adds nothing.
  std::vector<float> y0(1, 5.0f), dw0(OC * IC, 1.0f);
  model::linear_forward_bf16_cpu(y0.data(), x.data(), w.data(), nullptr, 0, IC, OC);
  model::linear_backward_bf16_cpu(nullptr, dw0.data(), nullptr, dy.data(), x.data(), w.data(), 0,
                                  IC, OC, false);
  CHECK(y0[0] == 5.0f);
  CHECK(dw0 == std::vector<float>(OC * IC, 1.0f));
  // K = 0: C = bias (assigned), or kept when accumulating.
  std::vector<bfloat16> none(1);
  const std::vector<float> bias = {1.5f, -2.0f, 0.25f};
  std::vector<float> c(2 * 3, std::numeric_limits<float>::quiet_NaN());
  model::matmul_bf16_cpu(false, true, 2, 3, 0, none.data(), 1, none.data(), 1, bias.data(),
                         c.data(), 3, false);
  CHECK(c == std::vector<float>{1.5f, -2.0f, 0.25f, 1.5f, -2.0f, 0.25f});
}

TEST_CASE("matmul bf16: transposed operands with padded leading dimensions") {
  if (!model::onednn_available()) return;
  const int64_t M = 13, N = 19, K = 37, pad = 3;
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (bool acc : {false, true}) {
        INFO("trans_a " << ta << " trans_b " << tb << " accumulate " << acc);
        const int64_t lda = (ta ? M : K) + pad, ldb = (tb ? K : N) + pad, ldc = N + pad;
        const auto A = rounded(test::random_vec<float>((ta ? K : M) * lda, 51));
        const auto B = rounded(test::random_vec<float>((tb ? N : K) * ldb, 52));
        const auto C0 = test::random_vec<float>(M * ldc, 53);
        const auto bias = test::random_vec<float>(N, 54);
        std::vector<float> C = C0;
        const auto A16 = to_bf16(A), B16 = to_bf16(B);
        model::matmul_bf16_cpu(ta, tb, M, N, K, A16.data(), lda, B16.data(), ldb, bias.data(),
                               C.data(), ldc, acc);
        std::vector<float> got(M * N);
        std::vector<double> ref(M * N);
        for (int64_t i = 0; i < M; ++i)
          for (int64_t j = 0; j < N; ++j) {
            double s = bias[j] + (acc ? C0[i * ldc + j] : 0.0);
            for (int64_t k = 0; k < K; ++k)
              s += double(ta ? A[k * lda + i] : A[i * lda + k]) *
                   double(tb ? B[j * ldb + k] : B[k * ldb + j]);
            ref[i * N + j] = s;
            got[i * N + j] = C[i * ldc + j];
          }
        check_close("strided", got, ref, kNmseF32Out);
        for (int64_t i = 0; i < M; ++i)  // the padding columns of C are untouched
          for (int64_t j = N; j < ldc; ++j) CHECK(C[i * ldc + j] == C0[i * ldc + j]);
      }
}

TEST_CASE("matmul bf16: the adapters round fp32 inputs to bf16") {
  if (!model::onednn_available()) return;
  const int64_t N = 32, IC = 256, OC = 48;
  const auto x = test::random_vec<float>(N * IC, 61);  // not bf16-exact
  const auto w = test::random_vec<float>(OC * IC, 62);
  std::vector<float> y(N * OC);
  model::linear_forward_bf16_cpu(y.data(), x.data(), w.data(), nullptr, N, IC, OC);
  const std::vector<float> zw(OC * IC), zb(OC), dy(N * OC);
  const LinearRef on_rounded =
      linear_ref(rounded(x), rounded(w), nullptr, dy, nullptr, zw, zb, N, IC, OC);
  const LinearRef on_fp32 = linear_ref(x, w, nullptr, dy, nullptr, zw, zb, N, IC, OC);
  check_close("adapter y vs rounded inputs", y, on_rounded.y, kNmseF32Out);
  check_close("adapter y vs fp32 inputs", y, on_fp32.y, kNmseBf16Out);
  const auto c = test::compare_arrays(y.data(), on_fp32.y.data(), N * OC);
  CHECK_MESSAGE(c.nmse > 1e-7, "the adapter did not round its inputs (nmse " << c.nmse << ")");
}

TEST_CASE("matmul bf16: bit-identical repeats at a fixed shape and thread count") {
  if (!model::onednn_available()) return;
  const int64_t N = 256, IC = 576, OC = 1536;
  const auto x = test::random_vec<float>(N * IC, 71);
  const auto w = test::random_vec<float>(OC * IC, 72);
  const auto dy = test::random_vec<float>(N * OC, 73);
  auto run = [&](int threads) {
    test::ScopedThreads t(threads);
    std::vector<float> y(N * OC), dx(N * IC), dw(OC * IC, 0.0f);
    model::linear_forward_bf16_cpu(y.data(), x.data(), w.data(), nullptr, N, IC, OC);
    model::linear_backward_bf16_cpu(dx.data(), dw.data(), nullptr, dy.data(), x.data(), w.data(), N,
                                    IC, OC, false);
    y.insert(y.end(), dx.begin(), dx.end());
    y.insert(y.end(), dw.begin(), dw.end());
    return y;
  };
  const int threads = omp_get_max_threads();
  const auto a = run(threads), b = run(threads);
  CHECK(a == b);
  const auto one = run(1);
  const std::string same = one == a ? "bit-identical" : "different in the last bits";
  MESSAGE("1 thread vs " << threads << ": " << same);
}

TEST_CASE("matmul bf16: one primitive per shape and thread count, reused on every repeat") {
  if (!model::onednn_available()) {
    CHECK(model::onednn_matmul_cache_stats().entries == 0);
    return;
  }
  // Shapes no other test uses, so the first call of each creates its primitive.
  const int64_t N = 37, IC = 53, OC = 29;
  const auto x = to_bf16(test::random_vec<float>(N * IC, 81));
  const auto w = to_bf16(test::random_vec<float>(OC * IC, 82));
  std::vector<float> y(size_t(N * OC));
  auto forward = [&](int64_t rows) {
    model::linear_forward_bf16(y.data(), x.data(), w.data(), nullptr, rows, IC, OC);
  };
  test::ScopedThreads t2(2);
  const auto s0 = model::onednn_matmul_cache_stats();
  forward(N);  // a new shape: created
  const auto s1 = model::onednn_matmul_cache_stats();
  CHECK(s1.entries == s0.entries + 1);
  CHECK(s1.misses == s0.misses + 1);
  for (int i = 0; i < 5; ++i) forward(N);  // the same shape: found every time
  const auto s2 = model::onednn_matmul_cache_stats();
  CHECK(s2.entries == s1.entries);
  CHECK(s2.hits == s1.hits + 5);
  forward(N - 1);  // another M: another primitive
  CHECK(model::onednn_matmul_cache_stats().entries == s2.entries + 1);
  {
    // Another thread count (--threads sets omp_set_num_threads): a primitive sized for it.
    test::ScopedThreads t1(1);
    forward(N);
    CHECK(model::onednn_matmul_cache_stats().entries == s2.entries + 2);
  }
  forward(N);  // back at 2 threads: the first primitive again
  const auto s3 = model::onednn_matmul_cache_stats();
  CHECK(s3.entries == s2.entries + 2);
  CHECK(s3.misses == s2.misses + 2);
}

TEST_CASE("matmul bf16: the primitive cache stays within its capacity, least recently used out") {
  if (!model::onednn_available()) return;
  // Shapes no other test uses; a capacity of 3 for the test, restored after it.
  const int64_t IC = 41, OC = 23, rows_max = 12;
  const auto x = to_bf16(test::random_vec<float>(rows_max * IC, 83));
  const auto w = to_bf16(test::random_vec<float>(OC * IC, 84));
  std::vector<float> y(size_t(rows_max * OC));
  auto forward = [&](int64_t rows) {
    model::linear_forward_bf16(y.data(), x.data(), w.data(), nullptr, rows, IC, OC);
    return std::vector<float>(y.begin(), y.begin() + rows * OC);
  };
  const auto first = forward(rows_max);  // computed before the bound: the reference
  const int64_t old = model::set_onednn_matmul_cache_capacity(3);
  CHECK(model::onednn_matmul_cache_stats().entries <= 3);
  const auto s0 = model::onednn_matmul_cache_stats();
  CHECK(s0.capacity == 3);
  for (int64_t rows = 1; rows <= 6; ++rows) forward(rows);  // six new shapes through three places
  const auto s1 = model::onednn_matmul_cache_stats();
  CHECK(s1.entries == 3);
  CHECK(s1.misses == s0.misses + 6);
  CHECK(s1.evictions >= s0.evictions + 6);  // rows_max's entry and rows 1..3 went out
  forward(6);                               // the most recent: still held
  CHECK(model::onednn_matmul_cache_stats().misses == s1.misses);
  forward(4);  // third most recent: held, and now the most recent
  CHECK(model::onednn_matmul_cache_stats().misses == s1.misses);
  forward(1);  // evicted long ago: created again, evicting the least recent (5)
  CHECK(model::onednn_matmul_cache_stats().misses == s1.misses + 1);
  forward(5);
  CHECK(model::onednn_matmul_cache_stats().misses == s1.misses + 2);
  CHECK(forward(rows_max) == first);  // a re-created primitive computes the same
  CHECK(model::onednn_matmul_cache_stats().entries == 3);
  model::set_onednn_matmul_cache_capacity(old);
  CHECK_THROWS_AS(model::set_onednn_matmul_cache_capacity(0), rlhf::Error);
}

TEST_CASE("matmul bf16: bad arguments throw") {
  std::vector<bfloat16> a(64), b(64);
  std::vector<float> c(64);
  CHECK_THROWS_AS(model::matmul_bf16_cpu(false, false, -1, 2, 2, a.data(), 2, b.data(), 2, nullptr,
                                         c.data(), 2, false),
                  rlhf::Error);
  CHECK_THROWS_WITH_AS(model::matmul_bf16_cpu(false, false, 4, 4, 8, a.data(), 4, b.data(), 4,
                                              nullptr, c.data(), 4, false),
                       doctest::Contains("lda=4 needs >= 8"), rlhf::Error);
}
