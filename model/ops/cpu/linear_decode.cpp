// The engine's decode linear over packed weights (model/ops/linear_decode.h): outer products of
// 16-output weight vectors with up to 8 input rows held in registers, one FMA per k in k order.
// The weights are fp32 or bfloat16 (widened in registers, exactly: the same FMAs as fp32 weights
// holding the bf16 values).
#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "core/error.h"
#include "model/ops/cpu/avx512_util.h"
#include "model/ops/half.h"
#include "model/ops/linear_decode.h"

namespace rlhf::model {

namespace {

// Input rows per register block: 8 rows × 2 panels = 16 accumulators.
constexpr int64_t kMR = 8;
// 9–16 rows go against each panel in one block (one_panel_all_rows), with x k-major
// (rows_for_panels); other row counts in blocks of kMR.
inline bool rows_in_one_block(int64_t M) {
  return M > kMR && M <= 2 * kMR;
}
// Below this many multiply-adds the call stays on one thread (a fork costs a few µs).
constexpr int64_t kParallelMacs = 1 << 16;

// One packed weight element as fp32 (exact for bfloat16).
inline float widen(float w) {
  return w;
}
inline float widen(bfloat16 w) {
  return bf16_to_float(w);
}

#if defined(__AVX512F__)
RLHF_AVX512_DIAGNOSTICS_PUSH

// 16 consecutive packed weights as fp32 lanes (bfloat16: zero-extended and shifted into the upper
// half, the exact widening).
inline __m512 load16(const float* w) {
  return _mm512_loadu_ps(w);
}
inline __m512 load16(const bfloat16* w) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// Rows [0, MR) of x against NP (1 or 2) consecutive panels starting at wp (stride IC·16 between
// panels): y[i·ldy + 16·p + l] for l < valid[p]. Row i's input k is x[i·ldx + k], or with KMajor
// x[k·ldx + i] (k_major: a k step's MR broadcasts from one pointer at fixed offsets). W: float or
// bfloat16 weights. pf: NP panels to prefetch into L2 while this block computes (the next task's,
// so that its first block does not wait on memory), or nullptr.
template <int MR, int NP, bool KMajor = false, typename W>
inline void block(float* y, int64_t ldy, const float* x, int64_t ldx, const W* wp, const float* b,
                  int64_t IC, const int64_t* valid, const W* pf) {
  const int64_t row_step = KMajor ? 1 : ldx, k_step = KMajor ? ldx : 1;
  __m512 acc[MR][NP];
  const int64_t pstride = IC * kDecodePanel;
  // k = 0: the product alone (fma(x0, w0, 0) rounds the same as x0·w0).
  {
    __m512 wv[NP];
#pragma GCC unroll 2
    for (int p = 0; p < NP; ++p) wv[p] = load16(wp + p * pstride);
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
      const __m512 xb = _mm512_set1_ps(x[i * row_step]);
#pragma GCC unroll 2
      for (int p = 0; p < NP; ++p) acc[i][p] = _mm512_mul_ps(xb, wv[p]);
    }
  }
  const float* xk = x;  // row 0's input k
  for (int64_t k = 1; k < IC; ++k) {
    xk += k_step;
    if (pf != nullptr) {
#pragma GCC unroll 2
      for (int p = 0; p < NP; ++p)
        _mm_prefetch(reinterpret_cast<const char*>(pf + p * pstride + k * kDecodePanel),
                     _MM_HINT_T1);
    }
    __m512 wv[NP];
#pragma GCC unroll 2
    for (int p = 0; p < NP; ++p) wv[p] = load16(wp + p * pstride + k * kDecodePanel);
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
      const __m512 xb = _mm512_set1_ps(xk[i * row_step]);
#pragma GCC unroll 2
      for (int p = 0; p < NP; ++p) acc[i][p] = _mm512_fmadd_ps(xb, wv[p], acc[i][p]);
    }
  }
#pragma GCC unroll 2
  for (int p = 0; p < NP; ++p) {
    const __mmask16 m = first_lanes(valid[p]);
    const __m512 bv =
        b != nullptr ? _mm512_maskz_loadu_ps(m, b + p * kDecodePanel) : _mm512_setzero_ps();
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i)
      _mm512_mask_storeu_ps(y + i * ldy + p * kDecodePanel, m, _mm512_add_ps(acc[i][p], bv));
  }
}

// 9–16 rows against one panel in one block (16 accumulators): the panel is read once, from
// memory, for all the rows. In blocks of 8 rows × 2 panels the second block re-read the panels
// from L2 after the first had streamed them, so memory time and FMA time added up: 135M shape,
// batch 16, 51.4–52.1 → 48.2 ms a decode step (2-core Xeon, Cascade Lake). Warm in cache, where
// FMAs rather than memory bound, the 16 broadcasts a k make it slower than 8 × 2. xt: the M rows
// k-major (rows_for_panels).
template <typename W>
inline void one_panel_all_rows(float* y, int64_t ldy, const float* xt, const W* wp, const float* b,
                               int64_t M, int64_t IC, const int64_t* valid, const W* pf) {
  switch (M) {
    case 16:
      return block<16, 1, true>(y, ldy, xt, M, wp, b, IC, valid, pf);
    case 15:
      return block<15, 1, true>(y, ldy, xt, M, wp, b, IC, valid, pf);
    case 14:
      return block<14, 1, true>(y, ldy, xt, M, wp, b, IC, valid, pf);
    case 13:
      return block<13, 1, true>(y, ldy, xt, M, wp, b, IC, valid, pf);
    case 12:
      return block<12, 1, true>(y, ldy, xt, M, wp, b, IC, valid, pf);
    case 11:
      return block<11, 1, true>(y, ldy, xt, M, wp, b, IC, valid, pf);
    case 10:
      return block<10, 1, true>(y, ldy, xt, M, wp, b, IC, valid, pf);
    default:
      return block<9, 1, true>(y, ldy, xt, M, wp, b, IC, valid, pf);
  }
}

// Every row of x against NP panels: blocks of 8 rows, then the 1–7 left; 9–16 rows one panel at a
// time in one block (one_panel_all_rows; x then k-major: rows_for_panels). pf: the panels the first
// block prefetches (block's pf).
template <int NP, typename W>
inline void panels(float* y, int64_t ldy, const float* x, const W* wp, const float* b, int64_t M,
                   int64_t IC, const int64_t* valid, const W* pf) {
  if (rows_in_one_block(M)) {
    const int64_t pstride = IC * kDecodePanel;
    for (int p = 0; p < NP; ++p)
      one_panel_all_rows(y + p * kDecodePanel, ldy, x, wp + p * pstride,
                         b != nullptr ? b + p * kDecodePanel : nullptr, M, IC, valid + p,
                         p + 1 < NP ? wp + (p + 1) * pstride : pf);
    return;
  }
  int64_t m = 0;
  for (; m + kMR <= M; m += kMR, pf = nullptr)
    block<8, NP>(y + m * ldy, ldy, x + m * IC, IC, wp, b, IC, valid, pf);
  float* ym = y + m * ldy;
  const float* xm = x + m * IC;
  switch (M - m) {
    case 7:
      return block<7, NP>(ym, ldy, xm, IC, wp, b, IC, valid, pf);
    case 6:
      return block<6, NP>(ym, ldy, xm, IC, wp, b, IC, valid, pf);
    case 5:
      return block<5, NP>(ym, ldy, xm, IC, wp, b, IC, valid, pf);
    case 4:
      return block<4, NP>(ym, ldy, xm, IC, wp, b, IC, valid, pf);
    case 3:
      return block<3, NP>(ym, ldy, xm, IC, wp, b, IC, valid, pf);
    case 2:
      return block<2, NP>(ym, ldy, xm, IC, wp, b, IC, valid, pf);
    case 1:
      return block<1, NP>(ym, ldy, xm, IC, wp, b, IC, valid, pf);
    default:
      return;
  }
}

RLHF_AVX512_DIAGNOSTICS_POP
#endif

// Portable path: the same fused multiply-adds in the same order, one output at a time.
template <typename W>
[[maybe_unused]] void panels_portable(float* y, int64_t ldy, const float* x, const W* wp,
                                      const float* b, int64_t M, int64_t IC, int64_t np,
                                      const int64_t* valid) {
  for (int64_t p = 0; p < np; ++p)
    for (int64_t l = 0; l < valid[p]; ++l) {
      const W* w = wp + p * IC * kDecodePanel + l;
      for (int64_t m = 0; m < M; ++m) {
        const float* xr = x + m * IC;
        float acc = xr[0] * widen(w[0]);
        for (int64_t k = 1; k < IC; ++k) acc = std::fma(xr[k], widen(w[k * kDecodePanel]), acc);
        y[m * ldy + p * kDecodePanel + l] = acc + (b != nullptr ? b[p * kDecodePanel + l] : 0.0f);
      }
    }
}

#if defined(__AVX512F__)
// 16 packed weights (one k of a panel) from fp32 lanes: stored as they are, or rounded to bf16 as
// float_to_bf16 rounds (float_to_bf16_row).
inline void store_packed(float* dst, __m512 v) {
  _mm512_storeu_ps(dst, v);
}
inline void store_packed(bfloat16* dst, __m512 v) {
  alignas(64) float lanes[kDecodePanel];
  _mm512_store_ps(lanes, v);
  float_to_bf16_row(dst, lanes, kDecodePanel);
}
#endif

// wp = the panels of w (see linear_decode_pack), each element through cvt (float_to_bf16 for
// bfloat16 panels). A full panel goes 16 k at a time through a register transpose of its 16 rows'
// loads (the scalar loop, one element at a time, took 57 ms for the 135M shape's linears in fp32
// and 110 in bf16 on 2 threads; 2-core Emerald Rapids VM); the k tail and a last, partial panel
// element by element. The same values either way.
template <typename W, typename Cvt>
void pack(W* wp, const float* w, int64_t IC, int64_t OC, const Cvt& cvt) {
  const int64_t np = (OC + kDecodePanel - 1) / kDecodePanel;
#pragma omp parallel for schedule(static) if (IC * OC >= kParallelMacs)
  for (int64_t p = 0; p < np; ++p) {
    int64_t k0 = 0;
#if defined(__AVX512F__)
    if ((p + 1) * kDecodePanel <= OC)
      for (; k0 + kDecodePanel <= IC; k0 += kDecodePanel) {
        __m512 r[kDecodePanel];
        for (int64_t l = 0; l < kDecodePanel; ++l)
          r[l] = _mm512_loadu_ps(w + (p * kDecodePanel + l) * IC + k0);
        transpose16_f32(r);  // r[j]: the panel's 16 weights at k0 + j
        for (int64_t j = 0; j < kDecodePanel; ++j)
          store_packed(wp + (p * IC + k0 + j) * kDecodePanel, r[j]);
      }
#endif
    for (int64_t k = k0; k < IC; ++k)
      for (int64_t l = 0; l < kDecodePanel; ++l) {
        const int64_t o = p * kDecodePanel + l;
        wp[(p * IC + k) * kDecodePanel + l] = cvt(o < OC ? w[o * IC + k] : 0.0f);
      }
  }
}

#if defined(__AVX512F__)
// x (M, IC) for panels: 9–16 rows k-major (xt[k·M + i] = x[i·IC + k], in a buffer of the calling
// thread that the call's OpenMP team reads), others x itself. With one pointer per row, 16 rows
// spilled the row pointers to vector registers and each k step moved them back on an FMA port
// (16 rows warm in L2 at the 135M shape, one thread: 90 GFLOP/s, 120 k-major, against the core's
// 175 of FMAs; 2-core Emerald Rapids VM). 8-row blocks keep their pointers in registers.
const float* rows_for_panels(const float* x, int64_t M, int64_t IC) {
  if (!rows_in_one_block(M)) return x;
  thread_local std::vector<float> xt;
  if (xt.size() < size_t(M * IC)) xt.resize(size_t(M * IC));
  for (int64_t k = 0; k < IC; ++k)
    for (int64_t i = 0; i < M; ++i) xt[size_t(k * M + i)] = x[i * IC + k];
  return xt.data();
}
#endif

// linear_decode_packed_cpu for W = float or bfloat16 weights.
template <typename W>
void packed(const char* what, float* y, const float* x, const W* wp, const float* b, int64_t M,
            int64_t IC, int64_t OC) {
  RLHF_CHECK(M >= 0 && IC >= 0 && OC >= 0, "{}: negative dimension M={} IC={} OC={}", what, M, IC,
             OC);
  if (M == 0 || OC == 0) return;
  if (IC == 0) {  // an empty sum: the bias alone
    for (int64_t m = 0; m < M; ++m)
      for (int64_t o = 0; o < OC; ++o) y[m * OC + o] = b != nullptr ? b[o] : 0.0f;
    return;
  }
  // Tasks of two panels (32 outputs); threads take them one at a time (dynamic: on a shared
  // machine a descheduled thread does not hold back half of the matrix). The result does not
  // depend on which thread computes a task.
  const int64_t np = (OC + kDecodePanel - 1) / kDecodePanel, ntasks = (np + 1) / 2;
#if defined(__AVX512F__)
  const float* xp = rows_for_panels(x, M, IC);
#endif
#pragma omp parallel for schedule(dynamic, 4) if (M * IC * OC >= kParallelMacs)
  for (int64_t t = 0; t < ntasks; ++t) {
    const int64_t p0 = 2 * t, n = std::min<int64_t>(2, np - p0);
    int64_t valid[2];
    for (int64_t p = 0; p < n; ++p)
      valid[p] = std::min<int64_t>(kDecodePanel, OC - (p0 + p) * kDecodePanel);
    float* yt = y + p0 * kDecodePanel;
    const W* wt = wp + p0 * IC * kDecodePanel;
    const float* bt = b != nullptr ? b + p0 * kDecodePanel : nullptr;
#if defined(__AVX512F__)
    // The next task's two panels (the last task prefetches nothing), from 2 rows on, and always
    // for bf16 weights. fp32 weights at batch 1 are a pure stream, which the hardware prefetcher
    // serves better (135M shape: 27.0 ms a step without, 30.1 with; 2-core Xeon, Cascade Lake).
    // From 2 rows the FMAs slow the stream and the hint keeps lines in flight: batch 4 / 8 at the
    // 135M shape 27.1-29.4 / 31.5-33.3 → 24.9-26.8 / 28.9-33.3 ms a step (2-core Emerald Rapids
    // VM). bf16 weights stream at half the bytes a k step, too slowly for the hardware
    // prefetcher to keep enough lines in flight: batch 1 at the 135M shape 12.2-13.6 → 9.9-10.8
    // ms a step (same VM, AVX512-BF16; fp32 unchanged there with the hint).
    const bool hint = M >= 2 || std::is_same_v<W, bfloat16>;
    const W* pf = hint && p0 + 2 < np ? wt + 2 * IC * kDecodePanel : nullptr;
    if (n == 2)
      panels<2>(yt, OC, xp, wt, bt, M, IC, valid, pf);
    else
      panels<1>(yt, OC, xp, wt, bt, M, IC, valid, pf);
#else
    panels_portable(yt, OC, x, wt, bt, M, IC, n, valid);
#endif
  }
}

}  // namespace

void linear_decode_pack(float* wp, const float* w, int64_t IC, int64_t OC) {
  RLHF_CHECK(IC >= 0 && OC >= 0, "linear_decode_pack: negative dimension IC={} OC={}", IC, OC);
  pack(wp, w, IC, OC, [](float v) { return v; });
}

void linear_decode_pack_bf16(bfloat16* wp, const float* w, int64_t IC, int64_t OC) {
  RLHF_CHECK(IC >= 0 && OC >= 0, "linear_decode_pack_bf16: negative dimension IC={} OC={}", IC, OC);
  pack(wp, w, IC, OC, [](float v) { return float_to_bf16(v); });
}

void linear_decode_packed_cpu(float* y, const float* x, const float* wp, const float* b, int64_t M,
                              int64_t IC, int64_t OC) {
  packed("linear_decode_packed_cpu", y, x, wp, b, M, IC, OC);
}

void linear_decode_packed_bf16_cpu(float* y, const float* x, const bfloat16* wp, const float* b,
                                   int64_t M, int64_t IC, int64_t OC) {
  packed("linear_decode_packed_bf16_cpu", y, x, wp, b, M, IC, OC);
}

}  // namespace rlhf::model
