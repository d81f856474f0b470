#include "model/ops/linear_decode.h"

#include <algorithm>
#include <type_traits>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "core/error.h"
#include "model/ops/linear.h"

namespace rlhf::model {

namespace {

// Register block: 4 input rows × kNR = 4 weight rows, one accumulator per (input row, weight row).
constexpr int64_t kNR = 4;
// Weight rows per panel: as many as fit in this many bytes (a multiple of kNR, at least kNR).
constexpr int64_t kPanelBytes = 24 * 1024;
// Below this many multiply-adds the call stays on one thread (a fork costs a few µs).
constexpr int64_t kParallelMacs = 1 << 16;

#if defined(__AVX512F__)
// GCC 12's AVX-512 headers initialise "undefined" vectors from themselves (GCC PR 105593, fixed in
// 13), which -Wuninitialized reports at every inlined call site of a shuffle intrinsic (so the
// suppression runs to the end of this file, popped there).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

// Sixteen horizontal sums at once: lane j of the result is Σ of the 16 lanes of a[j]. The tree is
// the same for every input vector — within each 128-bit block (l0 + l2) + (l1 + l3), then blocks
// (b0 + b1) + (b2 + b3) — so a[j]'s sum does not depend on the other 15 inputs or on j (zero
// vectors stand in for absent ones). 45 shuffles/adds instead of 16 separate reductions.
inline __m512 hsum16_f32(const __m512* a) {
  __m512 p[8], q[4], r[2];
  for (int i = 0; i < 8; ++i)  // per block: [a0 l0+l2, a1 l0+l2, a0 l1+l3, a1 l1+l3]
    p[i] = _mm512_add_ps(_mm512_unpacklo_ps(a[2 * i], a[2 * i + 1]),
                         _mm512_unpackhi_ps(a[2 * i], a[2 * i + 1]));
  for (int i = 0; i < 4; ++i) {  // per block: [Σ a0, Σ a1, Σ a2, Σ a3] of that block
    const __m512d x = _mm512_castps_pd(p[2 * i]), y = _mm512_castps_pd(p[2 * i + 1]);
    q[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)),
                         _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
  }
  for (int i = 0; i < 2; ++i)  // blocks [q0 b0+b1, q0 b2+b3, q1 b0+b1, q1 b2+b3]
    r[i] = _mm512_add_ps(_mm512_shuffle_f32x4(q[2 * i], q[2 * i + 1], 0x88),
                         _mm512_shuffle_f32x4(q[2 * i], q[2 * i + 1], 0xDD));
  return _mm512_add_ps(_mm512_shuffle_f32x4(r[0], r[1], 0x88),
                       _mm512_shuffle_f32x4(r[0], r[1], 0xDD));
}

// y[i·ldy + j] = x_i · w_j + b_j for i < MR, j < NR (MR·NR ≤ 16); x and w rows have stride IC.
// Every accumulator sees the same FMA sequence (16-lane chunks in order, the tail through a zero-
// filling masked load) and the same reduction tree, whatever MR/NR: batch-invariant.
template <int MR, int NR>
inline void block_f32(float* y, int64_t ldy, const float* x, const float* w, const float* b,
                      int64_t IC) {
  static_assert(MR * NR <= 16);
  __m512 acc[16];
  for (int i = 0; i < 16; ++i) acc[i] = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + 16 <= IC; k += 16) {
    __m512 wv[NR];
    for (int j = 0; j < NR; ++j) wv[j] = _mm512_loadu_ps(w + j * IC + k);
    for (int i = 0; i < MR; ++i) {
      const __m512 xv = _mm512_loadu_ps(x + i * IC + k);
      for (int j = 0; j < NR; ++j) acc[i * NR + j] = _mm512_fmadd_ps(xv, wv[j], acc[i * NR + j]);
    }
  }
  if (k < IC) {
    const __mmask16 m = static_cast<__mmask16>((1u << (IC - k)) - 1u);
    __m512 wv[NR];
    for (int j = 0; j < NR; ++j) wv[j] = _mm512_maskz_loadu_ps(m, w + j * IC + k);
    for (int i = 0; i < MR; ++i) {
      const __m512 xv = _mm512_maskz_loadu_ps(m, x + i * IC + k);
      for (int j = 0; j < NR; ++j) acc[i * NR + j] = _mm512_fmadd_ps(xv, wv[j], acc[i * NR + j]);
    }
  }
  alignas(64) float sums[16];
  _mm512_store_ps(sums, hsum16_f32(acc));
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) y[i * ldy + j] = sums[i * NR + j] + (b != nullptr ? b[j] : 0.0f);
}

// All M input rows against NR weight rows: blocks of 4 rows, then the 1–3 left over.
template <int NR>
inline void rows_f32(float* y, int64_t ldy, const float* x, const float* w, const float* b,
                     int64_t M, int64_t IC) {
  int64_t m = 0;
  for (; m + 4 <= M; m += 4) block_f32<4, NR>(y + m * ldy, ldy, x + m * IC, w, b, IC);
  switch (M - m) {
    case 3:
      block_f32<3, NR>(y + m * ldy, ldy, x + m * IC, w, b, IC);
      break;
    case 2:
      block_f32<2, NR>(y + m * ldy, ldy, x + m * IC, w, b, IC);
      break;
    case 1:
      block_f32<1, NR>(y + m * ldy, ldy, x + m * IC, w, b, IC);
      break;
    default:
      break;
  }
}

// A panel of weight rows [o0, o0 + n) against all M input rows. Input rows go in blocks of 4,
// each block against every 4-row weight block of the panel, so both the panel (sized to stay in
// L1) and the 4 input rows are reused from L1.
inline void panel_f32(float* y, int64_t ldy, const float* x, const float* w, const float* b,
                      int64_t M, int64_t IC, int64_t n) {
  const int64_t n4 = n / 4 * 4;
  for (int64_t m = 0; m < M; m += 4) {
    const int64_t mr = std::min<int64_t>(4, M - m);
    for (int64_t j = 0; j < n4; j += 4) {
      float* yb = y + m * ldy + j;
      const float* xb = x + m * IC;
      const float* wb = w + j * IC;
      const float* bb = b != nullptr ? b + j : nullptr;
      switch (mr) {
        case 4:
          block_f32<4, 4>(yb, ldy, xb, wb, bb, IC);
          break;
        case 3:
          block_f32<3, 4>(yb, ldy, xb, wb, bb, IC);
          break;
        case 2:
          block_f32<2, 4>(yb, ldy, xb, wb, bb, IC);
          break;
        default:
          block_f32<1, 4>(yb, ldy, xb, wb, bb, IC);
          break;
      }
    }
  }
  for (int64_t j = n4; j < n; ++j)  // the last 1–3 weight rows of the matrix
    rows_f32<1>(y + j, ldy, x, w + j * IC, b != nullptr ? b + j : nullptr, M, IC);
}
#endif

// Portable path (and the double instantiation): one dot product per (m, o), same order for all.
template <typename T>
inline void rows_generic(T* y, int64_t ldy, const T* x, const T* w, const T* b, int64_t M,
                         int64_t IC, int64_t NR) {
  for (int64_t m = 0; m < M; ++m) {
    const T* xr = x + m * IC;
    for (int64_t j = 0; j < NR; ++j) {
      const T* wr = w + j * IC;
      T s = 0;
#pragma omp simd reduction(+ : s)
      for (int64_t k = 0; k < IC; ++k) s += xr[k] * wr[k];
      y[m * ldy + j] = s + (b != nullptr ? b[j] : T(0));
    }
  }
}

}  // namespace

template <typename T>
void linear_decode_cpu(T* y, const T* x, const T* w, const T* b, int64_t M, int64_t IC,
                       int64_t OC) {
  RLHF_CHECK(M >= 0 && IC >= 0 && OC >= 0, "linear_decode_cpu: negative dimension M={} IC={} OC={}",
             M, IC, OC);
  if (M == 0 || OC == 0) return;
  // Weight rows go in panels of a multiple of 4 rows that fit in ~24 KiB (L1 holds the panel plus
  // 4 input rows). Threads take contiguous ranges of panels (static schedule): each streams its
  // part of w from memory once.
  const int64_t panel = std::max<int64_t>(
      kNR, (kPanelBytes / std::max<int64_t>(1, IC * int64_t(sizeof(T)))) / kNR * kNR);
  const int64_t npanels = (OC + panel - 1) / panel;
#pragma omp parallel for schedule(static) if (M * IC * OC >= kParallelMacs)
  for (int64_t p = 0; p < npanels; ++p) {
    const int64_t o0 = p * panel, n = std::min(panel, OC - o0);
    const T* bb = b != nullptr ? b + o0 : nullptr;
#if defined(__AVX512F__)
    if constexpr (std::is_same_v<T, float>) {
      panel_f32(y + o0, OC, x, w + o0 * IC, bb, M, IC, n);
      continue;
    }
#endif
    rows_generic(y + o0, OC, x, w + o0 * IC, bb, M, IC, n);
  }
}

template <typename T>
void linear_rows_cpu(T* y, const T* x, const T* w, const T* b, int64_t M, int64_t IC, int64_t OC) {
  if (M <= kDecodeKernelMaxRows)
    linear_decode_cpu(y, x, w, b, M, IC, OC);
  else
    linear_forward_cpu(y, x, w, b, M, IC, OC);
}

template void linear_decode_cpu<float>(float*, const float*, const float*, const float*, int64_t,
                                       int64_t, int64_t);
template void linear_decode_cpu<double>(double*, const double*, const double*, const double*,
                                        int64_t, int64_t, int64_t);
template void linear_rows_cpu<float>(float*, const float*, const float*, const float*, int64_t,
                                     int64_t, int64_t);
template void linear_rows_cpu<double>(double*, const double*, const double*, const double*, int64_t,
                                      int64_t, int64_t);

}  // namespace rlhf::model

#if defined(__AVX512F__)
#pragma GCC diagnostic pop
#endif
