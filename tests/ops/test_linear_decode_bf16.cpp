// The packed decode linear over bfloat16 weights: the packing is linear_decode_pack's layout with
// every weight rounded to nearest-even bf16; the result is bit for bit the fp32 kernel's on fp32
// weights holding the same bf16 values (widening is exact and the FMA order is the contract's), on
// odd and realistic shapes and batches, with and without bias, at 1 and 2 threads; and against a
// naive double loop on the rounded weights within fp32 summation error.
#include <cmath>
#include <limits>
#include <vector>

#include "core/error.h"
#include "model/ops/half.h"
#include "model/ops/linear_decode.h"
#include "tests/test_util.h"

using namespace rlhf;

TEST_CASE("linear_decode bf16: the packing rounds linear_decode_pack's layout to bf16") {
  const int64_t shapes[][2] = {{7, 21}, {37, 50}};  // 37: 16-k blocks (transposed) and a tail
  for (const auto& [IC, OC] : shapes) {
    CAPTURE(IC);
    auto w = test::random_vec<float>(OC * IC, 5);
    w[0] = std::numeric_limits<float>::quiet_NaN();  // rounded as float_to_bf16 rounds them
    w[1] = std::numeric_limits<float>::infinity();
    w[2] = 1e-40f;  // subnormal
    const int64_t n = model::linear_decode_packed_size(IC, OC);
    std::vector<float> wp(static_cast<size_t>(n));
    std::vector<model::bfloat16> wp16(size_t(n), model::bfloat16{0xFFFF});
    model::linear_decode_pack(wp.data(), w.data(), IC, OC);
    model::linear_decode_pack_bf16(wp16.data(), w.data(), IC, OC);
    int64_t wrong = 0;
    for (int64_t i = 0; i < n; ++i)
      wrong += wp16[size_t(i)].bits != model::float_to_bf16(wp[size_t(i)]).bits;
    CHECK(wrong == 0);
  }
}

TEST_CASE("linear_decode bf16 equals the fp32 kernel on the rounded weights, bit for bit") {
  const int64_t shapes[][2] = {{1, 1},     {5, 7},     {13, 17},   {33, 47},
                               {288, 768}, {576, 192}, {1536, 576}};
  for (const auto& s : shapes) {
    const int64_t IC = s[0], OC = s[1];
    auto w = test::random_vec<float>(OC * IC, 2 + OC);
    const auto b = test::random_vec<float>(OC, 3);
    const int64_t n = model::linear_decode_packed_size(IC, OC);
    std::vector<model::bfloat16> wp16(static_cast<size_t>(n));
    model::linear_decode_pack_bf16(wp16.data(), w.data(), IC, OC);
    for (auto& v : w) v = model::round_to_bf16(v);
    std::vector<float> wp(static_cast<size_t>(n));
    model::linear_decode_pack(wp.data(), w.data(), IC, OC);
    for (int64_t M : {1, 3, 8, 9, 17}) {
      CAPTURE(IC);
      CAPTURE(OC);
      CAPTURE(M);
      const auto x = test::random_vec<float>(M * IC, 7 + M);
      for (bool bias : {false, true})
        for (int threads : {1, 2}) {
          test::ScopedThreads t(threads);
          const float* bp = bias ? b.data() : nullptr;
          std::vector<float> y32(M * OC), y16(M * OC, std::numeric_limits<float>::quiet_NaN());
          model::linear_decode_packed_cpu(y32.data(), x.data(), wp.data(), bp, M, IC, OC);
          model::linear_decode_packed_bf16_cpu(y16.data(), x.data(), wp16.data(), bp, M, IC, OC);
          CHECK(y16 == y32);
          if (!bias && threads == 1 && M == 3) {  // and against an independent double loop
            std::vector<double> ref(M * OC);
            for (int64_t m = 0; m < M; ++m)
              for (int64_t o = 0; o < OC; ++o) {
                double acc = 0;
                for (int64_t k = 0; k < IC; ++k) acc += double(x[m * IC + k]) * w[o * IC + k];
                ref[m * OC + o] = acc;
              }
            const auto c = test::compare_arrays(y16.data(), ref.data(), M * OC);
            INFO(c.summary("bf16 decode vs double"));
            CHECK(c.nmse <= 1e-10);
          }
        }
    }
  }
  std::vector<float> y(1);
  std::vector<model::bfloat16> wp(16);
  CHECK_THROWS_AS(
      model::linear_decode_packed_bf16_cpu(y.data(), y.data(), wp.data(), nullptr, -1, 1, 1),
      rlhf::Error);
}
