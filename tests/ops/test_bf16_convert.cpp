// bfloat16 conversions (model/ops/half.h) against an independent reference: rounding chooses the
// nearer of the two bf16 neighbours of x, computed in double (ties to the even mantissa, past the
// largest finite value to inf); widening against sign·(1 + m/128)·2^(e−127) (or m·2^−133 for a
// subnormal). Edge cases (ties, subnormals, ±0, ±inf, NaNs with payloads only in the low bits, the
// overflow threshold), every bf16 pattern for widening, and a million random fp32 patterns through
// the vectorised (AVX-512 where built) and threaded array kernels, at lengths that leave tails.
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "model/ops/half.h"
#include "tests/test_util.h"

using namespace rlhf;
using model::bfloat16;

namespace {

float from_bits(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}
uint32_t to_bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

// The value of the bf16 pattern h (finite or inf; not NaN) as a double, by the format's formula;
// 0x7F80 (inf) counts as 2^128, the next value past the largest finite, so that the rounding
// reference can compare distances to it.
double bf16_value(uint16_t h) {
  const double sign = (h & 0x8000u) ? -1.0 : 1.0;
  const int e = (h >> 7) & 0xFF, m = h & 0x7F;
  if (e == 0) return sign * std::ldexp(double(m), -133);
  return sign * std::ldexp(1.0 + m / 128.0, e - 127);
}

// Reference rounding of a non-NaN float: the two bf16 patterns around x (truncation and its
// successor in magnitude), the nearer one, the even one on a tie.
uint16_t ref_round(float x) {
  const uint32_t b = to_bits(x);
  if ((b & 0x7FFFFFFFu) >= 0x7F800000u) return uint16_t(b >> 16);  // ±inf (NaN is not asked)
  const uint16_t lo = uint16_t(b >> 16), hi = uint16_t(lo + 1);
  const double dl = std::fabs(double(x) - bf16_value(lo)),
               dh = std::fabs(bf16_value(hi) - double(x));
  if (dl < dh) return lo;
  if (dh < dl) return hi;
  return (lo & 1u) ? hi : lo;
}

bool is_nan16(uint16_t h) {
  return (h & 0x7F80u) == 0x7F80u && (h & 0x7Fu) != 0;
}

}  // namespace

TEST_CASE("bf16 rounding: edge cases against the nearest-neighbour reference") {
  struct Case {
    uint32_t in;
    uint16_t want;
    const char* what;
  };
  const Case cases[] = {
      {0x00000000u, 0x0000, "+0"},
      {0x80000000u, 0x8000, "-0"},
      {0x3F800000u, 0x3F80, "1"},
      {0x3F808000u, 0x3F80, "1 + 2^-8: a tie, down to the even 1"},
      {0x3F818000u, 0x3F82, "1 + 3·2^-8: a tie, up to the even mantissa"},
      {0x3F808001u, 0x3F81, "just past the tie: up"},
      {0x3F807FFFu, 0x3F80, "just below the tie: down"},
      {0xBF818000u, 0xBF82, "negative tie, magnitude up to even"},
      {0x00000001u, 0x0000, "smallest subnormal: to +0"},
      {0x00008000u, 0x0000, "subnormal tie: to the even 0"},
      {0x00018000u, 0x0002, "subnormal tie: to the even 2"},
      {0x00010001u, 0x0001, "subnormal, not flushed"},
      {0x007FFFFFu, 0x0080, "largest subnormal: up to the smallest normal"},
      {0x807FFFFFu, 0x8080, "negative largest subnormal"},
      {0x7F7F0000u, 0x7F7F, "largest finite bf16"},
      {0x7F7F7FFFu, 0x7F7F, "just below the overflow tie: stays finite"},
      {0x7F7F8000u, 0x7F80, "overflow tie: to inf (the even side)"},
      {0x7F7FFFFFu, 0x7F80, "FLT_MAX: to inf"},
      {0xFF7FFFFFu, 0xFF80, "-FLT_MAX: to -inf"},
      {0x7F800000u, 0x7F80, "+inf"},
      {0xFF800000u, 0xFF80, "-inf"},
      {0x4B800000u, 0x4B80, "2^24, exact"},
      {0x4B808000u, 0x4B80, "large tie"},
      {0x4B818000u, 0x4B82, "large tie up"},
  };
  for (const Case& c : cases) {
    INFO(c.what);
    const float x = from_bits(c.in);
    CHECK(ref_round(x) == c.want);  // the reference itself
    CHECK(model::float_to_bf16(x).bits == c.want);
    float arr[1] = {x};
    model::round_to_bf16_n(arr, 1);
    CHECK(to_bits(arr[0]) == uint32_t(c.want) << 16);
  }
  // NaNs: stay NaN (payload only in the low 16 bits included), sign kept, quiet.
  for (uint32_t nan : {0x7FC00000u, 0xFFC00000u, 0x7F800001u, 0xFF800001u, 0x7FA00000u, 0x7F80FFFFu,
                       0x7FFFFFFFu}) {
    INFO("NaN 0x" << std::hex << nan);
    const uint16_t h = model::float_to_bf16(from_bits(nan)).bits;
    CHECK(is_nan16(h));
    CHECK((h & 0x8000u) == ((nan >> 16) & 0x8000u));
    CHECK((h & 0x40u) != 0);
    CHECK(std::isnan(model::round_to_bf16(from_bits(nan))));
  }
}

TEST_CASE("bf16 widening: every pattern against the format's formula") {
  std::vector<bfloat16> all(65536);
  for (uint32_t i = 0; i < 65536; ++i) all[i].bits = uint16_t(i);
  // 65536 + 5 elements so the vector loop leaves a tail, threaded (n > 4 chunks).
  all.resize(65541, bfloat16{0x3F80});
  std::vector<float> out(all.size());
  model::bf16_to_float_n(out.data(), all.data(), int64_t(all.size()));
  int64_t bad = 0;
  for (size_t i = 0; i < all.size(); ++i) {
    const uint16_t h = all[i].bits;
    const float scalar = model::bf16_to_float(all[i]);
    if (to_bits(scalar) != to_bits(out[i])) ++bad;  // vector == scalar, bit for bit
    if (is_nan16(h)) {
      if (!std::isnan(out[i])) ++bad;
    } else if ((h & 0x7F80u) == 0x7F80u) {
      if (!(std::isinf(out[i]) && std::signbit(out[i]) == bool(h & 0x8000u))) ++bad;
    } else if (double(out[i]) != bf16_value(h) || std::signbit(out[i]) != bool(h & 0x8000u)) {
      ++bad;
    }
  }
  CHECK(bad == 0);
}

TEST_CASE(
    "bf16 array kernels: random fp32 patterns, vectorised and threaded, against the reference") {
  std::mt19937 rng(7);
  for (int64_t n : {int64_t(1), int64_t(15), int64_t(17), int64_t(1000003)}) {
    INFO("n = " << n);
    std::vector<float> x(static_cast<size_t>(n));
    for (auto& v : x) v = from_bits(rng());
    std::vector<bfloat16> h(static_cast<size_t>(n));
    model::float_to_bf16_n(h.data(), x.data(), n);
    std::vector<float> r = x;
    model::round_to_bf16_n(r.data(), n);
    std::vector<float> back(static_cast<size_t>(n));
    model::bf16_to_float_n(back.data(), h.data(), n);
    int64_t bad = 0, nans = 0;
    for (int64_t i = 0; i < n; ++i) {
      const uint16_t got = h[i].bits;
      if (std::isnan(x[i])) {
        ++nans;
        if (got != model::float_to_bf16(x[i]).bits || !is_nan16(got)) ++bad;
      } else if (got != ref_round(x[i])) {
        ++bad;
      }
      if (to_bits(r[i]) != uint32_t(got) << 16) ++bad;     // in place == convert
      if (to_bits(back[i]) != uint32_t(got) << 16) ++bad;  // widening is exact
    }
    CHECK(bad == 0);
    if (n > 1000) CHECK(nans > 0);  // random patterns do include NaNs (~0.4%)
  }
}
