#include "model/ops/linear_decode.h"

#include <algorithm>
#include <type_traits>

#include "core/error.h"
#include "model/ops/cpu/avx512_util.h"
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
RLHF_AVX512_DIAGNOSTICS_PUSH

// y[i·ldy + j] = x_i · w_j + b_j for i < MR, j < NR (MR·NR ≤ 16); x and w rows have stride IC.
// Every accumulator sees the same FMA sequence (16-lane chunks in order, the tail through a zero-
// filling masked load) and the same reduction tree, whatever MR/NR: batch-invariant.
template <int MR, int NR>
inline void block_f32(float* y, int64_t ldy, const float* x, const float* w, const float* b,
                      int64_t IC) {
  static_assert(MR * NR <= 16);
  __m512 acc[16];
#pragma GCC unroll 16
  for (int i = 0; i < 16; ++i) acc[i] = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + 16 <= IC; k += 16) {
    __m512 wv[NR];
#pragma GCC unroll 16
    for (int j = 0; j < NR; ++j) wv[j] = _mm512_loadu_ps(w + j * IC + k);
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
      const __m512 xv = _mm512_loadu_ps(x + i * IC + k);
#pragma GCC unroll 16
      for (int j = 0; j < NR; ++j) acc[i * NR + j] = _mm512_fmadd_ps(xv, wv[j], acc[i * NR + j]);
    }
  }
  if (k < IC) {
    const __mmask16 m = static_cast<__mmask16>((1u << (IC - k)) - 1u);
    __m512 wv[NR];
#pragma GCC unroll 16
    for (int j = 0; j < NR; ++j) wv[j] = _mm512_maskz_loadu_ps(m, w + j * IC + k);
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
      const __m512 xv = _mm512_maskz_loadu_ps(m, x + i * IC + k);
#pragma GCC unroll 16
      for (int j = 0; j < NR; ++j) acc[i * NR + j] = _mm512_fmadd_ps(xv, wv[j], acc[i * NR + j]);
    }
  }
  alignas(64) float sums[16];
  _mm512_store_ps(sums, hsum16_f32(acc));
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 16
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
      if (m == 0) {  // first pass over the panel: fetch the weight block after the next one
        const char* ahead = reinterpret_cast<const char*>(w + (j + 8) * IC);
        const char* end = reinterpret_cast<const char*>(w + n * IC);
        for (int64_t off = 0; off < 4 * IC * int64_t(sizeof(float)) && ahead + off < end; off += 64)
          _mm_prefetch(ahead + off, _MM_HINT_T0);
      }
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
  // 4 input rows). Threads take panels one at a time (dynamic schedule): on a machine shared with
  // other processes a thread that is descheduled does not hold back half of the matrix; the result
  // does not depend on which thread computes a panel.
  const int64_t panel = std::max<int64_t>(
      kNR, (kPanelBytes / std::max<int64_t>(1, IC * int64_t(sizeof(T)))) / kNR * kNR);
  const int64_t npanels = (OC + panel - 1) / panel;
#pragma omp parallel for schedule(dynamic, 1) if (M * IC * OC >= kParallelMacs)
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
RLHF_AVX512_DIAGNOSTICS_POP
#endif
