// AVX-512 helpers shared by the decode kernels (linear_decode, attention_decode). Only defined
// under __AVX512F__; include after <immintrin.h> is available (this header includes it).
#pragma once

#if defined(__AVX512F__)
#include <immintrin.h>

// GCC 12's AVX-512 headers initialise "undefined" vectors from themselves (GCC PR 105593, fixed in
// 13), which -Wuninitialized reports at every inlined call site of a shuffle intrinsic. The files
// that use these helpers wrap their AVX-512 code in RLHF_AVX512_DIAGNOSTICS_PUSH / _POP.
#define RLHF_AVX512_DIAGNOSTICS_PUSH                                                   \
  _Pragma("GCC diagnostic push") _Pragma("GCC diagnostic ignored \"-Wuninitialized\"") \
      _Pragma("GCC diagnostic ignored \"-Wmaybe-uninitialized\"")
#define RLHF_AVX512_DIAGNOSTICS_POP _Pragma("GCC diagnostic pop")

RLHF_AVX512_DIAGNOSTICS_PUSH

namespace rlhf::model {

/// Sixteen horizontal sums at once: lane j of the result is Σ of the 16 lanes of a[j]. The tree is
/// the same for every input vector — within each 128-bit block (l0 + l2) + (l1 + l3), then blocks
/// (b0 + b1) + (b2 + b3) — so a[j]'s sum does not depend on the other 15 inputs or on j (zero
/// vectors stand in for absent ones). 45 shuffles/adds instead of 16 separate reductions.
inline __m512 hsum16_f32(const __m512* a) {
  __m512 p[8], q[4], r[2];
#pragma GCC unroll 16
  for (int i = 0; i < 8; ++i)  // per block: [a0 l0+l2, a1 l0+l2, a0 l1+l3, a1 l1+l3]
    p[i] = _mm512_add_ps(_mm512_unpacklo_ps(a[2 * i], a[2 * i + 1]),
                         _mm512_unpackhi_ps(a[2 * i], a[2 * i + 1]));
#pragma GCC unroll 16
  for (int i = 0; i < 4; ++i) {  // per block: [Σ a0, Σ a1, Σ a2, Σ a3] of that block
    const __m512d x = _mm512_castps_pd(p[2 * i]), y = _mm512_castps_pd(p[2 * i + 1]);
    q[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)),
                         _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
  }
#pragma GCC unroll 16
  for (int i = 0; i < 2; ++i)  // blocks [q0 b0+b1, q0 b2+b3, q1 b0+b1, q1 b2+b3]
    r[i] = _mm512_add_ps(_mm512_shuffle_f32x4(q[2 * i], q[2 * i + 1], 0x88),
                         _mm512_shuffle_f32x4(q[2 * i], q[2 * i + 1], 0xDD));
  return _mm512_add_ps(_mm512_shuffle_f32x4(r[0], r[1], 0x88),
                       _mm512_shuffle_f32x4(r[0], r[1], 0xDD));
}

/// In-place 16 × 16 transpose: on entry r[i] holds row i, on return r[j] holds column j (lane i
/// of r[j] = lane j of the old r[i]). Pairs of rows interleave by 32 bits, then by 64 bits within
/// each 128-bit block, then the blocks move across vectors in two shuffles (64 shuffles in all).
inline void transpose16_f32(__m512* r) {
  __m512 t[16];
#pragma GCC unroll 16
  for (int i = 0; i < 16; i += 2) {  // block b: [r_i(4b), r_i+1(4b), r_i(4b+1), r_i+1(4b+1)], ...
    t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
  }
#pragma GCC unroll 16
  for (int i = 0; i < 16; i += 4)  // r[i + m], block b: column 4b + m of rows i .. i + 3
    for (int h = 0; h < 2; ++h) {
      const __m512d x = _mm512_castps_pd(t[i + h]), y = _mm512_castps_pd(t[i + 2 + h]);
      r[i + 2 * h] = _mm512_castpd_ps(_mm512_unpacklo_pd(x, y));
      r[i + 2 * h + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(x, y));
    }
  __m512 u[16];
#pragma GCC unroll 4
  for (int m = 0; m < 4; ++m) {  // blocks 0, 1 (0x44) and 2, 3 (0xEE) of row groups 0|1 and 2|3
    u[4 * m] = _mm512_shuffle_f32x4(r[m], r[4 + m], 0x44);
    u[4 * m + 1] = _mm512_shuffle_f32x4(r[m], r[4 + m], 0xEE);
    u[4 * m + 2] = _mm512_shuffle_f32x4(r[8 + m], r[12 + m], 0x44);
    u[4 * m + 3] = _mm512_shuffle_f32x4(r[8 + m], r[12 + m], 0xEE);
  }
#pragma GCC unroll 4
  for (int m = 0; m < 4; ++m) {  // column 4b + m: block b of each row group
    r[m] = _mm512_shuffle_f32x4(u[4 * m], u[4 * m + 2], 0x88);
    r[4 + m] = _mm512_shuffle_f32x4(u[4 * m], u[4 * m + 2], 0xDD);
    r[8 + m] = _mm512_shuffle_f32x4(u[4 * m + 1], u[4 * m + 3], 0x88);
    r[12 + m] = _mm512_shuffle_f32x4(u[4 * m + 1], u[4 * m + 3], 0xDD);
  }
}

/// Mask of the first n lanes (n in [0, 16]).
inline __mmask16 first_lanes(int64_t n) {
  return n >= 16 ? __mmask16(0xFFFF) : static_cast<__mmask16>((1u << n) - 1u);
}

}  // namespace rlhf::model

RLHF_AVX512_DIAGNOSTICS_POP

#endif
