// 16-bit storage types for the CPU; all math stays fp32.
//  - IEEE 754 binary16 ("fp16"): the KV cache of the CPU generation engine keeps its keys and
//  values
//    in it (half the bytes that decode attention reads).
//  - bfloat16 (the top half of an fp32): the operands of the bf16 GEMMs (model/ops/matmul_bf16.h).
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__F16C__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace rlhf::model {

/// One binary16 value (1 sign, 5 exponent, 10 mantissa bits: relative rounding error ≤ 2^-11,
/// largest finite 65504). Storage only: convert with f16_to_float / float_to_f16.
struct f16 {
  uint16_t bits;
};
static_assert(sizeof(f16) == 2);

/// f16_to_float in portable code (what builds without F16C run; tests hold it against F16C).
inline float f16_to_float_portable(f16 h) {
  const uint32_t sign = uint32_t(h.bits & 0x8000u) << 16;
  const uint32_t exp = (h.bits >> 10) & 0x1Fu, man = h.bits & 0x3FFu;
  uint32_t bits;
  if (exp == 0x1F) {
    bits = sign | 0x7F800000u | (man << 13);  // inf / NaN
  } else if (exp != 0) {
    bits = sign | ((exp + 112u) << 23) | (man << 13);  // normal: rebias 15 -> 127
  } else if (man == 0) {
    bits = sign;  // ±0
  } else {        // subnormal: man · 2^-24, exact in float
    const float f = float(man) * 5.9604644775390625e-8f;
    std::memcpy(&bits, &f, 4);
    bits |= sign;
  }
  float out;
  std::memcpy(&out, &bits, 4);
  return out;
}

/// float_to_f16 in portable code (what builds without F16C run; tests hold it against F16C).
inline f16 float_to_f16_portable(float x) {
  uint32_t b;
  std::memcpy(&b, &x, 4);
  const uint16_t sign = uint16_t((b >> 16) & 0x8000u);
  const uint32_t abs = b & 0x7FFFFFFFu;
  if (abs >= 0x7F800000u)  // inf or NaN (a NaN stays a quiet NaN)
    return f16{
        uint16_t(sign | 0x7C00u | (abs > 0x7F800000u ? 0x200u | ((abs >> 13) & 0x3FFu) : 0u))};
  if (abs >= 0x477FF000u) return f16{uint16_t(sign | 0x7C00u)};  // rounds past 65504: inf
  if (abs < 0x38800000u) {  // below 2^-14: a binary16 subnormal (or 0), step 2^-24
    float a;
    std::memcpy(&a, &abs, 4);
    const float scaled = a * 16777216.0f;  // exact: a power-of-two scaling
    uint32_t m = uint32_t(scaled);
    const float frac = scaled - float(m);                // exact
    if (frac > 0.5f || (frac == 0.5f && (m & 1u))) ++m;  // nearest, ties to even
    return f16{uint16_t(sign | m)};
  }
  // Normal: drop 13 mantissa bits, nearest with ties to even; a carry moves into the exponent.
  const uint32_t rebias = abs - (112u << 23);
  const uint32_t rounded = rebias + 0xFFFu + ((rebias >> 13) & 1u);
  return f16{uint16_t(sign | (rounded >> 13))};
}

/// Exact widening (every binary16 value is a float): subnormals, ±inf and NaN kept.
inline float f16_to_float(f16 h) {
#if defined(__F16C__)
  return _cvtsh_ss(h.bits);
#else
  return f16_to_float_portable(h);
#endif
}

/// Rounds to the nearest binary16, ties to even (as vcvtps2ph and torch's .half()); beyond the
/// range gives ±inf, NaN stays NaN.
inline f16 float_to_f16(float x) {
#if defined(__F16C__)
  return f16{uint16_t(_cvtss_sh(x, _MM_FROUND_TO_NEAREST_INT))};
#else
  return float_to_f16_portable(x);
#endif
}

/// dst[i] = float_to_f16(src[i]) for i < n (AVX-512 16 at a time where the build has it).
inline void float_to_f16_n(f16* dst, const float* src, int64_t n) {
  int64_t i = 0;
#if defined(__AVX512F__)
  // The zero-masked form: GCC 12's _mm512_cvtps_ph starts from an "undefined" vector that
  // -Wmaybe-uninitialized reports (GCC PR 105593).
  for (; i + 16 <= n; i += 16)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i),
                        _mm512_maskz_cvtps_ph(__mmask16(0xFFFF), _mm512_loadu_ps(src + i),
                                              _MM_FROUND_TO_NEAREST_INT));
#endif
  for (; i < n; ++i) dst[i] = float_to_f16(src[i]);
}

// ---------------------------------------------------------------------------------------------
// bfloat16

/// One bfloat16 value: the upper 16 bits of an IEEE fp32 (1 sign, 8 exponent, 7 mantissa bits:
/// relative rounding error <= 2^-9, fp32's range). Host storage only; the CUDA backend's device
/// type is bf16 (= __nv_bfloat16, the same bits). Convert with bf16_to_float / float_to_bf16.
struct bfloat16 {
  uint16_t bits;
};
static_assert(sizeof(bfloat16) == 2);

/// Exact widening: the bits become the upper half of the fp32 (subnormals, ±inf, NaN kept).
inline float bf16_to_float(bfloat16 h) {
  const uint32_t b = uint32_t(h.bits) << 16;
  float out;
  std::memcpy(&out, &b, 4);
  return out;
}

/// Rounds to the nearest bfloat16, ties to even, on the bits (as torch's .bfloat16() and CUDA's
/// __float2bfloat16_rn): subnormals round like any other value (no flush to zero), values past the
/// largest finite bfloat16 (0x7F7F·2^16, about 3.39e38) round to ±inf, ±inf stay. A NaN stays a NaN
/// with its sign and upper payload, made quiet (bit 6 set), so a payload only in the low 16 bits
/// cannot turn it into an inf.
inline bfloat16 float_to_bf16(float x) {
  uint32_t b;
  std::memcpy(&b, &x, 4);
  if ((b & 0x7FFFFFFFu) > 0x7F800000u) return bfloat16{uint16_t((b >> 16) | 0x40u)};
  return bfloat16{uint16_t((b + 0x7FFFu + ((b >> 16) & 1u)) >> 16)};
}

/// float_to_bf16 then back: x rounded to bfloat16 precision, kept in fp32.
inline float round_to_bf16(float x) {
  return bf16_to_float(float_to_bf16(x));
}

/// dst[i] = float_to_bf16(src[i]) for i < n: AVX-512 16 lanes at a time where the build has it
/// (bit-identical to the scalar rounding: integer arithmetic, not vcvtneps2bf16, which flushes
/// subnormal inputs to zero), the rest scalar; OpenMP threads over chunks for large n.
void float_to_bf16_n(bfloat16* dst, const float* src, int64_t n);

/// float_to_bf16_n on the calling thread alone and not clocked (model/op_clock.h): for the short
/// rows a loop inside an OpenMP parallel region converts (same bits as float_to_bf16_n).
void float_to_bf16_row(bfloat16* dst, const float* src, int64_t n);

/// dst[i] = bf16_to_float(src[i]) for i < n (exact; vectorised and threaded like float_to_bf16_n).
void bf16_to_float_n(float* dst, const bfloat16* src, int64_t n);

/// x[i] = round_to_bf16(x[i]) for i < n, in place (vectorised and threaded like float_to_bf16_n):
/// fp32 buffers that hold bf16-precision values, as a bf16 op's outputs are rounded once.
void round_to_bf16_n(float* x, int64_t n);

}  // namespace rlhf::model
