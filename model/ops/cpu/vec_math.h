// Inline, branch-free math for the CPU ops' inner loops: written so that GCC vectorises a loop
// that calls them under `#pragma omp simd` (plain float/int arithmetic and selects, no calls).
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

namespace rlhf::model {

/// exp(x) in float, accurate to ≤ 2 ulp against the correctly rounded result on the whole range
/// where exp(x) is a finite normal float, x ∈ [kExpFastLo, kExpFastHi] ≈ [−87.3365, 88.7228]
/// (tests/ops/test_vec_math.cpp measures it). Below that range it returns 0 (results that would be
/// subnormal are flushed, so no denormal arithmetic ever follows in a softmax), above it +inf;
/// NaN gives NaN.
///
/// Method (Cody & Waite range reduction, as in Cephes' expf): x = n·ln2 + r with n = round(x/ln2)
/// and |r| ≤ ln2/2, ln2 split into a 9-bit high part (n·ln2_hi is exact) and a correction;
/// exp(r) by its degree-7 Taylor polynomial (truncation error r⁸/8! < 6e-9, below half an ulp);
/// then 2ⁿ by adding n to the exponent field of p = exp(r) ∈ [0.70, 1.42]. That addition stays in
/// the normal range because the clamp bounds are chosen so that n = −126 only with r > 0 (p ≥ 1)
/// and n = 128 only with r < 0 (p < 1). About 24 vector instructions for 16 floats (AVX-512).
inline constexpr float kExpFastLo = -87.33654022f;  // smallest float with exp(x) ≥ FLT_MIN
inline constexpr float kExpFastHi = 88.72283173f;   // largest float with exp(x) ≤ FLT_MAX

inline float exp_fast(float x) {
  constexpr float kLog2e = 1.44269504089f;
  constexpr float kLn2Hi = 0.693359375f;     // 9 significant bits: n·kLn2Hi is exact
  constexpr float kLn2Lo = -2.12194440e-4f;  // ln2 − kLn2Hi
  constexpr float kRound = 12582912.0f;      // 1.5·2^23: adding it rounds to an integer
  constexpr float kInf = std::numeric_limits<float>::infinity();
  const float xc = std::min(std::max(x, kExpFastLo), kExpFastHi);
  // t = kRound + n exactly, n = round(xc·log2e); the low mantissa bits of t hold n.
  const float t = std::fma(xc, kLog2e, kRound);
  const float n = t - kRound;
  float r = std::fma(-n, kLn2Hi, xc);  // exact
  r = std::fma(-n, kLn2Lo, r);
  // Taylor series of exp(r) to degree 7, Horner form (1/k! rounded to float).
  float p = 1.98412698e-4f;            // 1/7!
  p = std::fma(p, r, 1.38888889e-3f);  // 1/6!
  p = std::fma(p, r, 8.33333333e-3f);  // 1/5!
  p = std::fma(p, r, 4.16666667e-2f);  // 1/4!
  p = std::fma(p, r, 1.66666667e-1f);  // 1/3!
  p = std::fma(p, r, 0.5f);
  p = std::fma(p, r, 1.0f);
  p = std::fma(p, r, 1.0f);
  // bits(t) << 23 == n << 23 (mod 2^32): the bits of kRound vanish in the shift.
  float y = std::bit_cast<float>(std::bit_cast<uint32_t>(p) + (std::bit_cast<uint32_t>(t) << 23));
  y = x < kExpFastLo ? 0.0f : y;
  return x <= kExpFastHi ? y : x + kInf;  // +inf above the range; NaN + inf = NaN
}

/// exp for the templated CPU kernels: exp_fast for float, std::exp for double (the double
/// instantiation is the finite-difference reference and must stay exact).
template <typename T>
inline T exp_vec(T x) {
  if constexpr (std::is_same_v<T, float>)
    return exp_fast(x);
  else
    return std::exp(x);
}

}  // namespace rlhf::model
