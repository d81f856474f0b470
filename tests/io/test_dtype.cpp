// Element-type conversions: F16 and BF16 against exhaustive and closed-form references.
#include "io/dtype.h"

#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "tests/io/io_test_util.h"

using namespace rlhf;

namespace {

// IEEE binary16 → double by the definition (sign, 5-bit exponent bias 15, 10-bit fraction).
double f16_reference(uint16_t h) {
  const int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
  const double sign = s ? -1.0 : 1.0;
  if (e == 0) return sign * std::ldexp(double(m), -24);
  if (e == 31) return m ? std::nan("") : sign * INFINITY;
  return sign * std::ldexp(1.0 + double(m) / 1024.0, e - 15);
}

}  // namespace

TEST_CASE("dtype: every F16 value converts exactly and round-trips") {
  int checked = 0;
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = io::f16_to_float(uint16_t(h));
    const double r = f16_reference(uint16_t(h));
    if (std::isnan(r)) {
      CHECK(std::isnan(f));
      CHECK(std::isnan(io::f16_to_float(io::float_to_f16(f))));
      continue;
    }
    if (double(f) != r) FAIL_CHECK("f16 " << h << ": " << f << " != " << r);
    if (io::float_to_f16(f) != h) FAIL_CHECK("f16 round trip of " << h);
    ++checked;
  }
  CHECK(checked == 65536 - 2046);  // all but the NaNs
}

TEST_CASE("dtype: float -> F16 rounds to nearest even, overflows to Inf") {
  // Halfway between 1 and the next f16 (1 + 2^-10): ties to even (1); just above rounds up.
  CHECK(io::float_to_f16(1.0f + std::ldexp(1.0f, -11)) == 0x3C00);
  CHECK(io::float_to_f16(1.0f + 3 * std::ldexp(1.0f, -11)) == 0x3C02);
  CHECK(io::float_to_f16(1.0f + std::ldexp(1.0f, -11) + std::ldexp(1.0f, -20)) == 0x3C01);
  CHECK(io::float_to_f16(65504.0f) == 0x7BFF);
  CHECK(io::float_to_f16(65519.0f) == 0x7BFF);
  CHECK(io::float_to_f16(65520.0f) == 0x7C00);
  CHECK(io::float_to_f16(-1e9f) == 0xFC00);
  CHECK(io::float_to_f16(std::ldexp(1.0f, -24)) == 0x0001);  // smallest subnormal
  CHECK(io::float_to_f16(std::ldexp(1.0f, -25)) == 0x0000);  // tie → even (0)
  CHECK(io::float_to_f16(std::ldexp(1.5f, -25)) == 0x0001);
  CHECK(io::float_to_f16(std::ldexp(1023.5f, -24)) == 0x0400);  // rounds up into the normals
  CHECK(io::float_to_f16(-0.0f) == 0x8000);
}

TEST_CASE("dtype: BF16 truncates the fp32 exponent range, rounds to nearest even") {
  for (float x : {0.0f, 1.0f, -2.5f, 3.0e38f, 1e-38f, 0.15625f}) {
    const float y = io::bf16_to_float(io::float_to_bf16(x));
    CHECK(std::abs(y - x) <= std::abs(x) * std::ldexp(1.0f, -8));
  }
  uint32_t u = 0x3F808000;  // 1 + 2^-8: halfway between bf16 1.0 and 1 + 2^-7 → even (1.0)
  float f;
  std::memcpy(&f, &u, 4);
  CHECK(io::float_to_bf16(f) == 0x3F80);
  u = 0x3F818000;  // halfway between 1 + 2^-7 (odd) and 1 + 2^-6 → even (up)
  std::memcpy(&f, &u, 4);
  CHECK(io::float_to_bf16(f) == 0x3F82);
  CHECK(std::isnan(io::bf16_to_float(io::float_to_bf16(std::nanf("")))));
  CHECK(io::bf16_to_float(0x7F80) == INFINITY);
}

TEST_CASE("dtype: sizes of quantised tensors") {
  CHECK(io::dtype_bytes(io::DType::kQ8_0, 64, "t") == 68);
  CHECK(io::dtype_bytes(io::DType::kQ4_0, 64, "t") == 36);
  CHECK(io::dtype_bytes(io::DType::kQ4_1, 32, "t") == 20);
  CHECK(io::dtype_bytes(io::DType::kBF16, 3, "t") == 6);
  RLHF_CHECK_CONTAINS(test::error_of([] { io::dtype_bytes(io::DType::kQ4_0, 33, "w"); }),
                      "not a whole number of 32-element blocks");
  RLHF_CHECK_CONTAINS(test::error_of([] {
                        io::dtype_bytes(io::DType::kF32, std::numeric_limits<int64_t>::max(), "w");
                      }),
                      "overflows");
}
