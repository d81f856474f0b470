// The engine's decode linear over packed weights (model/ops/linear_decode.h): outer products of
// 16-output weight vectors with up to 8 input rows held in registers, one FMA per k in k order.
// The weights are fp32 or bfloat16 (widened in registers, exactly: the same FMAs as fp32 weights
// holding the bf16 values).
#include <algorithm>
#include <cmath>
#include <type_traits>

#include "core/error.h"
#include "model/ops/cpu/avx512_util.h"
#include "model/ops/half.h"
#include "model/ops/linear_decode.h"

namespace rlhf::model {

namespace {

// Input rows per register block: 8 rows × 3 panels = 24 accumulators.
constexpr int64_t kMR = 8;
// Panels per task (a thread's unit of work): 3, so a block does 24 FMAs for 11 loads (8
// broadcasts, 3 weight vectors). With 2 panels (16 FMAs for 10 loads) the loop ran at 95–116
// GFLOP/s from L1 on a 2-core Ice Lake Xeon, with 3 at 145–155 (its FMA peak: 160).
constexpr int64_t kTaskPanels = 3;
// More than kMR rows go through k in chunks of kKc (a task's three panels of a chunk: 18 KB of
// fp32, in L1 next to the chunk prefetched after it), in groups of at most kGroupRows rows (the
// size of the accumulators' carry buffer between chunks): panels.
constexpr int64_t kKc = 96;
constexpr int64_t kGroupRows = 64;
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

// Rows [0, MR) of x (row i's input k at x[i·ldx + k]) against NP (1 to 3) consecutive panels
// starting at wp (stride IC·16 between panels), over k in [k0, k1): at k0 = 0 the product alone
// (fma(x0, w0, 0) rounds the same as x0·w0), else the accumulators carried from the chunk before;
// at k1 = IC the result plus the bias goes to y[i·ldy + 16·p + l] for l < valid[p], else the
// accumulators to carry (MR·NP·16 floats, 64-byte aligned). W: float or bfloat16 weights. pf, or
// nullptr: NP panels (stride IC·16) of which this block prefetches k1 − k0 lines each, pf's
// lines 0.. at k0.., with hint Hint (_MM_HINT_T1: the next task's panels into L2, so that its first
// block does not wait on memory; _MM_HINT_T0: the next chunk into L1).
template <int MR, int NP, _mm_hint Hint, typename W>
inline void block(float* y, int64_t ldy, const float* x, int64_t ldx, const W* wp, const float* b,
                  int64_t IC, int64_t k0, int64_t k1, float* carry, const int64_t* valid,
                  const W* pf) {
  __m512 acc[MR][NP];
  const int64_t pstride = IC * kDecodePanel;
  int64_t k = k0;
  if (k0 == 0) {
    __m512 wv[NP];
#pragma GCC unroll 3
    for (int p = 0; p < NP; ++p) wv[p] = load16(wp + p * pstride);
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
      const __m512 xb = _mm512_set1_ps(x[i * ldx]);
#pragma GCC unroll 3
      for (int p = 0; p < NP; ++p) acc[i][p] = _mm512_mul_ps(xb, wv[p]);
    }
    k = 1;
  } else {
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i)
#pragma GCC unroll 3
      for (int p = 0; p < NP; ++p) acc[i][p] = _mm512_load_ps(carry + (i * NP + p) * kDecodePanel);
  }
  for (; k < k1; ++k) {
    if (pf != nullptr) {
#pragma GCC unroll 3
      for (int p = 0; p < NP; ++p)
        _mm_prefetch(reinterpret_cast<const char*>(pf + p * pstride + (k - k0) * kDecodePanel),
                     Hint);
    }
    __m512 wv[NP];
#pragma GCC unroll 3
    for (int p = 0; p < NP; ++p) wv[p] = load16(wp + p * pstride + k * kDecodePanel);
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
      const __m512 xb = _mm512_set1_ps(x[i * ldx + k]);
#pragma GCC unroll 3
      for (int p = 0; p < NP; ++p) acc[i][p] = _mm512_fmadd_ps(xb, wv[p], acc[i][p]);
    }
  }
  if (k1 < IC) {
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i)
#pragma GCC unroll 3
      for (int p = 0; p < NP; ++p) _mm512_store_ps(carry + (i * NP + p) * kDecodePanel, acc[i][p]);
    return;
  }
#pragma GCC unroll 3
  for (int p = 0; p < NP; ++p) {
    const __mmask16 m = first_lanes(valid[p]);
    const __m512 bv =
        b != nullptr ? _mm512_maskz_loadu_ps(m, b + p * kDecodePanel) : _mm512_setzero_ps();
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i)
      _mm512_mask_storeu_ps(y + i * ldy + p * kDecodePanel, m, _mm512_add_ps(acc[i][p], bv));
  }
}

// block for rows = 1..kMR (a run-time count) over k in [k0, k1).
template <int NP, _mm_hint Hint, typename W>
inline void rows_block(int64_t rows, float* y, int64_t ldy, const float* x, int64_t ldx,
                       const W* wp, const float* b, int64_t IC, int64_t k0, int64_t k1,
                       float* carry, const int64_t* valid, const W* pf) {
  switch (rows) {
    case 8:
      return block<8, NP, Hint>(y, ldy, x, ldx, wp, b, IC, k0, k1, carry, valid, pf);
    case 7:
      return block<7, NP, Hint>(y, ldy, x, ldx, wp, b, IC, k0, k1, carry, valid, pf);
    case 6:
      return block<6, NP, Hint>(y, ldy, x, ldx, wp, b, IC, k0, k1, carry, valid, pf);
    case 5:
      return block<5, NP, Hint>(y, ldy, x, ldx, wp, b, IC, k0, k1, carry, valid, pf);
    case 4:
      return block<4, NP, Hint>(y, ldy, x, ldx, wp, b, IC, k0, k1, carry, valid, pf);
    case 3:
      return block<3, NP, Hint>(y, ldy, x, ldx, wp, b, IC, k0, k1, carry, valid, pf);
    case 2:
      return block<2, NP, Hint>(y, ldy, x, ldx, wp, b, IC, k0, k1, carry, valid, pf);
    default:
      return block<1, NP, Hint>(y, ldy, x, ldx, wp, b, IC, k0, k1, carry, valid, pf);
  }
}

// Every row of x (M, IC) against NP panels. Up to kMR rows: one block over the whole k range,
// prefetching pf (the next task's panels, or nullptr) into L2. More rows: groups of up to
// kGroupRows rows, each through k in chunks of kKc, all of the group's row blocks (8 rows, then
// the 1–7 left) over a chunk before the next. The first row block of a chunk finds it in L1: the
// other row blocks of the chunk before prefetched it (and those of a task's last chunk the next
// task's first one, pf). Each 8-row block against 3 panels does 24 FMAs for 11 loads (8
// broadcasts, 3 weight vectors), and the memory streams while the FMAs run. It replaces one block
// of 9–16 rows against one panel (16 broadcasts and 1 weight vector for 16 FMAs) and 8-row blocks
// over the whole k range for more rows, which hit the load ports and left memory idle between
// panels: the 135M shape's linears of one decode step (30 layers and the head, cold) 40.7 → 33.2 ms
// at 16 rows, 70 → 54 ms at 32 (2-core Ice Lake Xeon, AVX-512, fp32 weights; then with 2-panel
// tasks and chunks of 128); the same FMAs per output in the same order.
template <int NP, typename W>
inline void panels(float* y, int64_t ldy, const float* x, const W* wp, const float* b, int64_t M,
                   int64_t IC, const int64_t* valid, const W* pf) {
  if (M <= kMR)
    return rows_block<NP, _MM_HINT_T1>(M, y, ldy, x, IC, wp, b, IC, 0, IC, nullptr, valid, pf);
  alignas(64) float carry[kGroupRows / kMR][kMR * NP * kDecodePanel];
  for (int64_t g = 0; g < M; g += kGroupRows) {
    const int64_t rows = std::min(kGroupRows, M - g);
    for (int64_t k0 = 0; k0 < IC; k0 += kKc) {
      const int64_t k1 = std::min(IC, k0 + kKc);
      // The next chunk; after the last, the next group's first (the same panels) or the next
      // task's.
      const W* next = k1 < IC ? wp + k1 * kDecodePanel : (g + kGroupRows < M ? wp : pf);
      for (int64_t m = 0; m < rows; m += kMR)
        rows_block<NP, _MM_HINT_T0>(std::min(kMR, rows - m), y + (g + m) * ldy, ldy,
                                    x + (g + m) * IC, IC, wp, b, IC, k0, k1, carry[m / kMR], valid,
                                    m == 0 ? nullptr : next);
    }
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
  // Tasks of kTaskPanels panels (16·kTaskPanels outputs); threads take them one at a time (dynamic:
  // on a shared machine a descheduled thread does not hold back half of the matrix). The result
  // does not depend on which thread computes a task.
  const int64_t np = (OC + kDecodePanel - 1) / kDecodePanel,
                ntasks = (np + kTaskPanels - 1) / kTaskPanels;
#pragma omp parallel for schedule(dynamic, 4) if (M * IC * OC >= kParallelMacs)
  for (int64_t t = 0; t < ntasks; ++t) {
    const int64_t p0 = kTaskPanels * t, n = std::min<int64_t>(kTaskPanels, np - p0);
    int64_t valid[kTaskPanels];
    for (int64_t p = 0; p < n; ++p)
      valid[p] = std::min<int64_t>(kDecodePanel, OC - (p0 + p) * kDecodePanel);
    float* yt = y + p0 * kDecodePanel;
    const W* wt = wp + p0 * IC * kDecodePanel;
    const float* bt = b != nullptr ? b + p0 * kDecodePanel : nullptr;
#if defined(__AVX512F__)
    // The next task's panels (the last task prefetches nothing), from 2 rows on, and always
    // for bf16 weights. fp32 weights at batch 1 are a pure stream, which the hardware prefetcher
    // serves better (135M shape: 27.0 ms a step without, 30.1 with; 2-core Xeon, Cascade Lake).
    // From 2 rows the FMAs slow the stream and the hint keeps lines in flight: batch 4 / 8 at the
    // 135M shape 27.1-29.4 / 31.5-33.3 → 24.9-26.8 / 28.9-33.3 ms a step (2-core Emerald Rapids
    // VM). bf16 weights stream at half the bytes a k step, too slowly for the hardware
    // prefetcher to keep enough lines in flight: batch 1 at the 135M shape 12.2-13.6 → 9.9-10.8
    // ms a step (same VM, AVX512-BF16; fp32 unchanged there with the hint).
    const bool hint = M >= 2 || std::is_same_v<W, bfloat16>;
    const W* pf = hint && p0 + n < np ? wt + n * IC * kDecodePanel : nullptr;
    static_assert(kTaskPanels == 3, "the dispatch below covers tasks of 1 to 3 panels");
    if (n == 3)
      panels<3>(yt, OC, x, wt, bt, M, IC, valid, pf);
    else if (n == 2)
      panels<2>(yt, OC, x, wt, bt, M, IC, valid, pf);
    else
      panels<1>(yt, OC, x, wt, bt, M, IC, valid, pf);
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
