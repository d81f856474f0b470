// Decode linear: the own kernel against a naive loop in double (float and double instantiations,
// odd shapes, bias or not), batch invariance (a row's result is bit-identical alone, at any
// position of any batch, on any thread count), sentinels around the output, and the per-M
// selection of linear_rows_cpu.
#include "model/ops/linear_decode.h"

#include <omp.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/error.h"
#include "tests/test_util.h"

using namespace rlhf;

namespace {

using test::ScopedThreads;

// ref[m, o] = Σ_k x[m, k]·w[o, k] (+ b[o]) in double, and the bound Σ_k |x·w| (+ |b|) that scales
// the rounding error of a float dot product of length IC.
template <typename T>
void naive(std::vector<double>& ref, std::vector<double>& mag, const std::vector<T>& x,
           const std::vector<T>& w, const T* b, int64_t M, int64_t IC, int64_t OC) {
  ref.assign(size_t(M * OC), 0.0);
  mag.assign(size_t(M * OC), 0.0);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t o = 0; o < OC; ++o) {
      double s = b ? double(b[o]) : 0.0, a = b ? std::fabs(double(b[o])) : 0.0;
      for (int64_t k = 0; k < IC; ++k) {
        const double p = double(x[size_t(m * IC + k)]) * double(w[size_t(o * IC + k)]);
        s += p;
        a += std::fabs(p);
      }
      ref[size_t(m * OC + o)] = s;
      mag[size_t(m * OC + o)] = a;
    }
}

// Runs linear_decode_cpu<T> with sentinels around y and checks it against the naive loop:
// |y − ref| ≤ tol · Σ|x·w| element by element (tol: a few units of T's rounding times log IC).
template <typename T>
void check_shape(int64_t M, int64_t IC, int64_t OC, bool bias, double tol) {
  const std::string name = fmt::format("linear_decode<{}>(M={},IC={},OC={},bias={})",
                                       sizeof(T) == 4 ? "float" : "double", M, IC, OC, bias);
  auto x = test::random_vec<T>(M * IC, 1 + M, -1, 1);
  auto w = test::random_vec<T>(OC * IC, 2 + OC, -1, 1);
  auto b = test::random_vec<T>(OC, 3, -1, 1);
  const int64_t guard = 37;
  const T sentinel = T(-12345.5);
  std::vector<T> buf(size_t(M * OC + 2 * guard), sentinel);
  T* y = buf.data() + guard;
  for (int64_t i = 0; i < M * OC; ++i) y[i] = std::numeric_limits<T>::quiet_NaN();  // assigned
  model::linear_decode_cpu(y, x.data(), w.data(), bias ? b.data() : nullptr, M, IC, OC);
  std::vector<double> ref, mag;
  naive(ref, mag, x, w, bias ? b.data() : nullptr, M, IC, OC);
  double worst = 0;
  int64_t worst_i = 0;
  for (int64_t i = 0; i < M * OC; ++i) {
    const double e = std::fabs(double(y[i]) - ref[size_t(i)]) / std::max(mag[size_t(i)], 1e-30);
    if (!(e <= worst)) worst = e, worst_i = i;  // NaN counts as worst
  }
  INFO(name, ": worst scaled error ", worst, " at ", worst_i, " calc=", double(y[worst_i]),
       " ref=", ref[size_t(worst_i)]);
  CHECK(worst <= tol);
  for (int64_t i = 0; i < guard; ++i) {
    CHECK(buf[size_t(i)] == sentinel);
    CHECK(buf[size_t(guard + M * OC + i)] == sentinel);
  }
}

}  // namespace

TEST_CASE("linear_decode vs a naive loop: float and double, odd and realistic shapes") {
  // (IC, OC): odd primes around the 16-lane chunk and the 4-row blocks, the stories15M shapes.
  const int64_t shapes[][2] = {{5, 7},     {13, 11},   {17, 3},    {16, 4}, {33, 37},
                               {288, 288}, {288, 768}, {768, 288}, {1, 1},  {100, 1}};
  for (const auto& s : shapes) {
    const bool big = s[0] * s[1] > 10000;  // the stories15M shapes: fewer batch sizes
    for (int64_t M : {1, 2, 3, 4, 5, 7, 8, 13, 64, 65}) {
      if (big && M != 1 && M != 5 && M != 64) continue;
      for (bool bias : {false, true}) {
        // float: each product and partial sum rounds at 2^-24 relative; 1e-6 of Σ|x·w| allows
        // for log2(IC) levels of the reduction tree with margin. A wrong index gives O(1) errors.
        check_shape<float>(M, s[0], s[1], bias, 1e-6);
        check_shape<double>(M, s[0], s[1], bias, 1e-14);
      }
    }
  }
}

TEST_CASE("linear_decode is batch-invariant: a row's result does not depend on the batch") {
  const int64_t IC = 77, OC = 45, M = 23;  // odd: masked tail, 1-3 leftover rows in both blocks
  auto x = test::random_vec<float>(M * IC, 5);
  auto w = test::random_vec<float>(OC * IC, 6);
  auto b = test::random_vec<float>(OC, 7);
  std::vector<float> all(size_t(M * OC)), one(static_cast<size_t>(OC));
  model::linear_decode_cpu(all.data(), x.data(), w.data(), b.data(), M, IC, OC);
  for (int64_t m = 0; m < M; ++m) {
    model::linear_decode_cpu(one.data(), x.data() + m * IC, w.data(), b.data(), 1, IC, OC);
    CHECK_MESSAGE(std::memcmp(one.data(), all.data() + m * OC, sizeof(float) * OC) == 0, "row ", m,
                  " differs between M=1 and M=", M);
  }
  // A sub-batch starting at an odd row (rows land in other register blocks).
  std::vector<float> sub(size_t(7 * OC));
  model::linear_decode_cpu(sub.data(), x.data() + 5 * IC, w.data(), b.data(), 7, IC, OC);
  CHECK(std::memcmp(sub.data(), all.data() + 5 * OC, sizeof(float) * 7 * OC) == 0);
  // Thread count: 1 vs the default, on a shape large enough to run in parallel.
  const int64_t IC2 = 288, OC2 = 1000, M2 = 9;
  auto x2 = test::random_vec<float>(M2 * IC2, 8);
  auto w2 = test::random_vec<float>(OC2 * IC2, 9);
  std::vector<float> y1(size_t(M2 * OC2)), y2(size_t(M2 * OC2));
  {
    const ScopedThreads one_thread(1);
    model::linear_decode_cpu(y1.data(), x2.data(), w2.data(), (const float*)nullptr, M2, IC2, OC2);
  }
  {
    const ScopedThreads two_threads(2);
    model::linear_decode_cpu(y2.data(), x2.data(), w2.data(), (const float*)nullptr, M2, IC2, OC2);
  }
  CHECK(std::memcmp(y1.data(), y2.data(), sizeof(float) * M2 * OC2) == 0);
}

TEST_CASE("linear_rows_cpu: own kernel up to kDecodeKernelMaxRows, BLAS above, same results") {
  const int64_t IC = 40, OC = 19;
  for (int64_t M :
       {int64_t(1), model::kDecodeKernelMaxRows, model::kDecodeKernelMaxRows + 1, int64_t(150)}) {
    auto x = test::random_vec<float>(M * IC, 11);
    auto w = test::random_vec<float>(OC * IC, 12);
    auto b = test::random_vec<float>(OC, 13);
    std::vector<float> y(size_t(M * OC));
    model::linear_rows_cpu(y.data(), x.data(), w.data(), b.data(), M, IC, OC);
    std::vector<double> ref, mag;
    naive(ref, mag, x, w, b.data(), M, IC, OC);
    for (int64_t i = 0; i < M * OC; ++i)
      REQUIRE(std::fabs(double(y[size_t(i)]) - ref[size_t(i)]) <= 1e-6 * mag[size_t(i)]);
    if (M <= model::kDecodeKernelMaxRows) {  // the decode kernel itself: bitwise the same
      std::vector<float> y2(size_t(M * OC));
      model::linear_decode_cpu(y2.data(), x.data(), w.data(), b.data(), M, IC, OC);
      CHECK(std::memcmp(y.data(), y2.data(), sizeof(float) * M * OC) == 0);
    }
  }
}

TEST_CASE("linear_decode: empty and invalid dimensions") {
  std::vector<float> y(4, 1.0f), x(4), w(4);
  model::linear_decode_cpu(y.data(), x.data(), w.data(), (const float*)nullptr, 0, 2, 2);
  CHECK(y[0] == 1.0f);  // M = 0: nothing written
  // IC = 0: the empty sum, plus the bias.
  const float bias[2] = {0.5f, -2.0f};
  model::linear_decode_cpu(y.data(), x.data(), w.data(), bias, 2, 0, 2);
  CHECK(y[0] == 0.5f);
  CHECK(y[3] == -2.0f);
  CHECK_THROWS_AS(
      model::linear_decode_cpu(y.data(), x.data(), w.data(), (const float*)nullptr, -1, 2, 2),
      Error);
}
