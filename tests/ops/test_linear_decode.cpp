// The packed decode linear: the packing against its documented layout; the result bit for bit
// equal to an independent scalar std::fma loop in k order (the contract) on odd and realistic
// shapes, with and without bias; against a naive double loop within fp32 rounding; batch and
// thread-count invariance; sentinels around the output; empty and invalid dimensions.
#include <omp.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/error.h"
#include "model/ops/linear_decode.h"
#include "tests/test_util.h"

using namespace rlhf;

namespace {

using test::ScopedThreads;

std::vector<float> pack(const std::vector<float>& w, int64_t IC, int64_t OC) {
  std::vector<float> wp(size_t(model::linear_decode_packed_size(IC, OC)), -7.0f);
  model::linear_decode_pack(wp.data(), w.data(), IC, OC);
  return wp;
}

// The contract, written independently: acc = x0·w0, then fma(x_k, w_k, acc) for k = 1.., + b.
float fma_chain(const float* x, const float* w_row, const float* b, int64_t o, int64_t IC) {
  float acc = IC > 0 ? x[0] * w_row[0] : 0.0f;
  for (int64_t k = 1; k < IC; ++k) acc = std::fma(x[k], w_row[k], acc);
  return acc + (b != nullptr ? b[o] : 0.0f);
}

}  // namespace

TEST_CASE("linear_decode_pack: panels of 16 output rows, k-major, zeros past OC") {
  // IC 5: k elementwise only; 37: two 16-k blocks (the AVX-512 transpose) and a tail of 5; the
  // OCs end in a partial panel (5 and 2 rows) or not (48).
  const int64_t shapes[][2] = {{5, 21}, {37, 50}, {32, 48}};
  for (const auto& [IC, OC] : shapes) {
    CAPTURE(IC);
    CAPTURE(OC);
    auto w = test::random_vec<float>(OC * IC, 3);
    const auto wp = pack(w, IC, OC);
    const int64_t np = (OC + 15) / 16;
    REQUIRE(int64_t(wp.size()) == np * 16 * IC);
    int64_t wrong = 0;
    for (int64_t p = 0; p < np; ++p)
      for (int64_t k = 0; k < IC; ++k)
        for (int64_t l = 0; l < 16; ++l) {
          const int64_t o = 16 * p + l;
          wrong += wp[size_t((p * IC + k) * 16 + l)] != (o < OC ? w[size_t(o * IC + k)] : 0.0f);
        }
    CHECK(wrong == 0);
  }
}

TEST_CASE("linear_decode_packed equals the fma chain in k order, bit for bit, on every shape") {
  // (IC, OC): odd around the 16-output panels and 3-panel tasks (60: a last task of one panel, 75:
  // of two), SmolLM2's and stories15M's; 300: k chunks of 96, 96, 96 and 12.
  const int64_t shapes[][2] = {{1, 1},      {5, 7},   {13, 17}, {16, 32},   {33, 47},
                               {77, 45},    {33, 60}, {77, 75}, {288, 768}, {576, 192},
                               {1536, 576}, {100, 1}, {300, 40}};
  for (const auto& s : shapes) {
    const int64_t IC = s[0], OC = s[1];
    auto w = test::random_vec<float>(OC * IC, 2 + OC, -1, 1);
    auto b = test::random_vec<float>(OC, 3, -1, 1);
    const auto wp = pack(w, IC, OC);
    // Beyond 8 rows, k in chunks of 128 (IC 288, 576 and 1536: several, the last one partial or
    // not) and groups of 64 rows (65 and 130: a second and a third group, the last short).
    for (int64_t M : {1, 2, 3, 7, 8, 9, 12, 16, 17, 64, 65, 130}) {
      if (IC * OC > 100000 && M != 1 && M != 9 && M != 64 && !(M == 130 && IC == 288)) continue;
      auto x = test::random_vec<float>(M * IC, 1 + M, -1, 1);
      for (bool bias : {false, true}) {
        INFO("IC=", IC, " OC=", OC, " M=", M, " bias=", bias);
        const int64_t guard = 19;
        const float sentinel = -12345.5f;
        std::vector<float> buf(size_t(M * OC + 2 * guard), sentinel);
        float* y = buf.data() + guard;
        for (int64_t i = 0; i < M * OC; ++i) y[i] = std::numeric_limits<float>::quiet_NaN();
        model::linear_decode_packed_cpu(y, x.data(), wp.data(), bias ? b.data() : nullptr, M, IC,
                                        OC);
        int64_t mismatches = 0;
        double worst = 0;
        for (int64_t m = 0; m < M; ++m)
          for (int64_t o = 0; o < OC; ++o) {
            const float want =
                fma_chain(x.data() + m * IC, w.data() + o * IC, bias ? b.data() : nullptr, o, IC);
            const float got = y[m * OC + o];
            mismatches += std::memcmp(&want, &got, 4) != 0;
            // And the value: within fp32 rounding of the double dot product.
            double ref = bias ? double(b[size_t(o)]) : 0.0, mag = std::fabs(ref);
            for (int64_t k = 0; k < IC; ++k) {
              const double p = double(x[size_t(m * IC + k)]) * double(w[size_t(o * IC + k)]);
              ref += p;
              mag += std::fabs(p);
            }
            worst = std::max(worst, std::fabs(double(got) - ref) / std::max(mag, 1e-30));
          }
        CHECK(mismatches == 0);
        CHECK(worst <= 1e-6 * std::max<double>(1.0, double(IC) / 64));
        for (int64_t i = 0; i < guard; ++i) {
          CHECK(buf[size_t(i)] == sentinel);
          CHECK(buf[size_t(guard + M * OC + i)] == sentinel);
        }
      }
    }
  }
}

TEST_CASE("linear_decode_packed is batch- and thread-invariant") {
  const int64_t IC = 288, OC = 1000, M = 23;
  auto x = test::random_vec<float>(M * IC, 5);
  auto w = test::random_vec<float>(OC * IC, 6);
  auto b = test::random_vec<float>(OC, 7);
  const auto wp = pack(w, IC, OC);
  std::vector<float> all(size_t(M * OC)), one(static_cast<size_t>(OC));
  model::linear_decode_packed_cpu(all.data(), x.data(), wp.data(), b.data(), M, IC, OC);
  for (int64_t m = 0; m < M; ++m) {
    model::linear_decode_packed_cpu(one.data(), x.data() + m * IC, wp.data(), b.data(), 1, IC, OC);
    CHECK_MESSAGE(std::memcmp(one.data(), all.data() + m * OC, sizeof(float) * OC) == 0, "row ", m);
  }
  std::vector<float> y1(size_t(M * OC));
  {
    const ScopedThreads one_thread(1);
    model::linear_decode_packed_cpu(y1.data(), x.data(), wp.data(), b.data(), M, IC, OC);
  }
  CHECK(std::memcmp(y1.data(), all.data(), sizeof(float) * M * OC) == 0);
}

TEST_CASE("linear_decode_packed: empty and invalid dimensions") {
  std::vector<float> y(4, 1.0f), x(4), wp(32);
  model::linear_decode_packed_cpu(y.data(), x.data(), wp.data(), nullptr, 0, 2, 2);
  CHECK(y[0] == 1.0f);  // M = 0: nothing written
  const float bias[2] = {0.5f, -2.0f};
  model::linear_decode_packed_cpu(y.data(), x.data(), wp.data(), bias, 2, 0, 2);
  CHECK(y[0] == 0.5f);
  CHECK(y[3] == -2.0f);
  CHECK_THROWS_AS(model::linear_decode_packed_cpu(y.data(), x.data(), wp.data(), nullptr, -1, 2, 2),
                  Error);
  CHECK_THROWS_AS(model::linear_decode_pack(wp.data(), x.data(), -1, 2), Error);
}
