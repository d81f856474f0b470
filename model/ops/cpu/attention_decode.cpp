#include "model/ops/attention_decode.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "core/error.h"
#include "model/ops/cpu/avx512_util.h"
#include "model/ops/cpu/vec_math.h"
#include "model/ops/half.h"

namespace rlhf::model {

namespace {

// A cached K/V element in the compute type T (fp16 widens exactly).
template <typename T, typename KV>
inline T kv_value(KV x) {
  if constexpr (std::is_same_v<KV, f16>)
    return T(f16_to_float(x));
  else
    return T(x);
}

// Where one (b, g) task reads and writes: its G query heads, output rows, block list, length.
template <typename T, typename KV>
struct Group {
  T* out;       // (G, D), row stride D
  const T* q;   // (G, D)
  const KV* k;  // k_cache + g·bs·D: position s at k + (table[s / bs]·Hkv·bs + s % bs)·D
  const KV* v;  // likewise
  const int32_t* table;
  int64_t n, G, D, block_stride, bs;  // block_stride = Hkv·bs·D
  T sc;
};

// e = exp(S − max S) in place for each of the G score rows (length n, stride n); inv[j] = 1/Σ e.
template <typename T>
void softmax_rows(T* S, T* inv, int64_t G, int64_t n) {
  for (int64_t j = 0; j < G; ++j) {
    T* row = S + j * n;
    T mx = -std::numeric_limits<T>::infinity();
#pragma omp simd reduction(max : mx)
    for (int64_t s = 0; s < n; ++s) mx = row[s] > mx ? row[s] : mx;
    T z = 0;
#pragma omp simd reduction(+ : z)
    for (int64_t s = 0; s < n; ++s) {
      const T e = exp_vec(row[s] - mx);
      row[s] = e;
      z += e;
    }
    inv[j] = T(1) / z;
  }
}

// Walks positions 0, 1, ... of a block list without a division per position.
struct RowCursor {
  const int32_t* table;
  int64_t bs, block_stride, D, blk = 0, r = 0;
  int64_t offset() const { return int64_t(table[blk]) * block_stride + r * D; }
  void next() {
    if (++r == bs) r = 0, ++blk;
  }
};

// Portable (and double) path: scores by position, softmax, weighted sum of values.
template <typename T, typename KV>
void group_generic(const Group<T, KV>& a, T* S, T* inv) {
  const int64_t n = a.n, G = a.G, D = a.D;
  RowCursor cur{a.table, a.bs, a.block_stride, a.D};
  for (int64_t s = 0; s < n; ++s, cur.next()) {
    const KV* kr = a.k + cur.offset();
    for (int64_t j = 0; j < G; ++j) {
      const T* qr = a.q + j * D;
      T dot = 0;
#pragma omp simd reduction(+ : dot)
      for (int64_t d = 0; d < D; ++d) dot += qr[d] * kv_value<T>(kr[d]);
      S[j * n + s] = dot * a.sc;
    }
  }
  softmax_rows(S, inv, G, n);
  std::fill(a.out, a.out + G * D, T(0));
  cur = RowCursor{a.table, a.bs, a.block_stride, a.D};
  for (int64_t s = 0; s < n; ++s, cur.next()) {
    const KV* vr = a.v + cur.offset();
    for (int64_t j = 0; j < G; ++j) {
      const T p = S[j * n + s];
      T* o = a.out + j * D;
#pragma omp simd
      for (int64_t d = 0; d < D; ++d) o[d] += p * kv_value<T>(vr[d]);
    }
  }
  for (int64_t j = 0; j < G; ++j) {
    T* o = a.out + j * D;
#pragma omp simd
    for (int64_t d = 0; d < D; ++d) o[d] *= inv[j];
  }
}

#if defined(__AVX512F__)
RLHF_AVX512_DIAGNOSTICS_PUSH

// The fp16 cache is read with 16-bit masked loads (AVX-512 BW + VL, which every AVX-512 CPU
// since Skylake-SP has); a build without them takes the portable path for an fp16 cache.
#if defined(__AVX512BW__) && defined(__AVX512VL__)
#define RLHF_ATT_DECODE_F16_AVX512 1
#endif

// Software prefetch of the rows a pass will read kPrefetchRows positions from now, into L1. One
// core here reads ~10 GB/s from memory (the limit of its outstanding misses); the hardware
// prefetcher stops at 4 KiB pages and restarts at every scattered block, so the passes stalled on
// loads. Measured on a 2-core Xeon (Cascade Lake), idle, fp16 cache, batch 16 x 1088 positions:
// 13.0 → 14.1 GB/s at GQA 9:3, D 64; 15.7 → 18.0 GB/s at 6:6, D 48 (the prefetch of a whole block
// at each block start it replaces gained nothing).
constexpr int64_t kPrefetchRows = 32;

// Walks the rows of a sequence kPrefetchRows ahead of a pass, prefetching each row's cache lines.
template <typename KV>
struct RowPrefetcher {
  const KV* base;  // a.k or a.v
  RowCursor ahead;
  int64_t n, D, s = 0;  // s: the next position to prefetch
  RowPrefetcher(const KV* base_, const RowCursor& start, int64_t n_, int64_t D_)
      : base(base_), ahead(start), n(n_), D(D_) {
    for (int64_t i = 0; i < kPrefetchRows; ++i) next();
  }
  // Prefetches the next row (if any) and moves past it: call once per row the pass reads.
  void next() {
    if (s >= n) return;
    const char* p = reinterpret_cast<const char*>(base + ahead.offset());
    for (int64_t off = 0; off < D * int64_t(sizeof(KV)); off += 64)
      _mm_prefetch(p + off, _MM_HINT_T0);
    ahead.next();
    ++s;
  }
};

// Chunk c (16 lanes, the last one masked by `tail`) of a row of D values, widened to fp32.
template <int NV>
inline __m512 load_chunk(const float* p, int c, __mmask16 tail) {
  return c == NV - 1 ? _mm512_maskz_loadu_ps(tail, p + 16 * c) : _mm512_loadu_ps(p + 16 * c);
}
#if defined(RLHF_ATT_DECODE_F16_AVX512)
template <int NV>
inline __m512 load_chunk(const f16* p, int c, __mmask16 tail) {
  const __m256i h = c == NV - 1 ? _mm256_maskz_loadu_epi16(tail, p + 16 * c)
                                : _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 16 * c));
  return _mm512_maskz_cvtph_ps(__mmask16(0xFFFF), h);  // zero-masked: see float_to_f16_n
}
#endif

// Query heads one V pass serves at once: 2·NV·GB accumulators of the chunk stay within 24 of the
// 32 vector registers.
template <int NV>
constexpr int64_t heads_per_pass() {
  return std::max(1, std::min(4, 12 / NV));
}

// out_j = (Σ_s e[j, s] · V[s]) / Z_j for the GB heads j0 .. j0 + GB − 1 of a group, reading each
// cached V row once for all of them. Even and odd positions go to two accumulator sets (two
// independent FMA chains per lane), added at the end: the order is fixed by the position alone.
template <int NV, int GB, typename KV>
void value_pass(const Group<float, KV>& a, const float* S, const float* inv, int64_t j0) {
  const int64_t n = a.n, D = a.D;
  const __mmask16 tail = first_lanes(D - 16 * (NV - 1));
  __m512 acc0[GB][NV], acc1[GB][NV];
  for (int h = 0; h < GB; ++h)
    for (int c = 0; c < NV; ++c) acc0[h][c] = acc1[h][c] = _mm512_setzero_ps();
  RowCursor cur{a.table, a.bs, a.block_stride, a.D};
  RowPrefetcher<KV> pf(a.v, cur, n, D);
  int64_t s = 0;
  for (; s + 1 < n; s += 2) {
    pf.next();
    pf.next();
    const KV* v0 = a.v + cur.offset();
    cur.next();
    const KV* v1 = a.v + cur.offset();
    cur.next();
    for (int c = 0; c < NV; ++c) {
      const __m512 x0 = load_chunk<NV>(v0, c, tail), x1 = load_chunk<NV>(v1, c, tail);
      for (int h = 0; h < GB; ++h) {
        const float* p = S + (j0 + h) * n + s;
        acc0[h][c] = _mm512_fmadd_ps(_mm512_set1_ps(p[0]), x0, acc0[h][c]);
        acc1[h][c] = _mm512_fmadd_ps(_mm512_set1_ps(p[1]), x1, acc1[h][c]);
      }
    }
  }
  if (s < n) {  // an odd last position
    const KV* v0 = a.v + cur.offset();
    for (int c = 0; c < NV; ++c) {
      const __m512 x0 = load_chunk<NV>(v0, c, tail);
      for (int h = 0; h < GB; ++h)
        acc0[h][c] = _mm512_fmadd_ps(_mm512_set1_ps(S[(j0 + h) * n + s]), x0, acc0[h][c]);
    }
  }
  for (int h = 0; h < GB; ++h) {
    const __m512 iz = _mm512_set1_ps(inv[j0 + h]);
    float* o = a.out + (j0 + h) * D;
    for (int c = 0; c < NV; ++c) {
      const __m512 r = _mm512_mul_ps(_mm512_add_ps(acc0[h][c], acc1[h][c]), iz);
      if (c == NV - 1)
        _mm512_mask_storeu_ps(o + 16 * c, tail, r);
      else
        _mm512_storeu_ps(o + 16 * c, r);
    }
  }
}

// fp32 AVX-512 path for D ≤ 16·NV: a head's D values are NV 16-lane chunks (the last one masked)
// held in registers. Scores go 16 positions at a time — 16 dot-product accumulators, reduced
// together by hsum16_f32 into one vector of 16 scores — and the weighted sum of values is
// value_pass (accumulators in registers, each V row read once per chunk of heads). Same formula
// as group_generic; the value sum adds even and odd positions separately. KV: float, or f16
// widened in registers as it is loaded (half the bytes from memory, the same fp32 math).
template <int NV, typename KV>
void group_f32(const Group<float, KV>& a, float* S, float* inv) {
  const int64_t n = a.n, G = a.G, D = a.D;
  const __mmask16 tail = first_lanes(D - 16 * (NV - 1));
  auto load = [tail](const auto* p, int c) { return load_chunk<NV>(p, c, tail); };
  const __m512 scale = _mm512_set1_ps(a.sc);
  RowCursor cur{a.table, a.bs, a.block_stride, a.D};
  RowPrefetcher<KV> pf(a.k, cur, n, D);
  for (int64_t s0 = 0; s0 < n; s0 += 16) {
    const int64_t rows = std::min<int64_t>(16, n - s0);
    const KV* kr[16];
    for (int64_t i = 0; i < rows; ++i, cur.next()) {
      pf.next();
      kr[i] = a.k + cur.offset();
    }
    for (int64_t j = 0; j < G; ++j) {
      __m512 qv[NV];
      for (int c = 0; c < NV; ++c) qv[c] = load(a.q + j * D, c);
      __m512 acc[16];
      for (int64_t i = 0; i < 16; ++i) {
        if (i >= rows) {
          acc[i] = _mm512_setzero_ps();
          continue;
        }
        __m512 x = _mm512_mul_ps(qv[0], load(kr[i], 0));
        for (int c = 1; c < NV; ++c) x = _mm512_fmadd_ps(qv[c], load(kr[i], c), x);
        acc[i] = x;
      }
      _mm512_mask_storeu_ps(S + j * n + s0, first_lanes(rows),
                            _mm512_mul_ps(hsum16_f32(acc), scale));
    }
  }
  softmax_rows(S, inv, G, n);
  // Heads in chunks of up to heads_per_pass<NV>() (their 2·NV accumulators each stay in
  // registers): each chunk reads every cached V row once.
  for (int64_t j = 0; j < G;) {
    const int64_t gb = std::min<int64_t>(G - j, heads_per_pass<NV>());
    switch (gb) {
      case 4:
        value_pass<NV, 4>(a, S, inv, j);
        break;
      case 3:
        value_pass<NV, 3>(a, S, inv, j);
        break;
      case 2:
        value_pass<NV, 2>(a, S, inv, j);
        break;
      default:
        value_pass<NV, 1>(a, S, inv, j);
        break;
    }
    j += gb;
  }
}

// Head dimensions up to 8 16-lane chunks (D ≤ 128) take the AVX-512 path, larger ones the
// portable one.
template <typename KV>
void group_dispatch(const Group<float, KV>& a, float* S, float* inv) {
  switch ((a.D + 15) / 16) {
    case 1:
      return group_f32<1>(a, S, inv);
    case 2:
      return group_f32<2>(a, S, inv);
    case 3:
      return group_f32<3>(a, S, inv);
    case 4:
      return group_f32<4>(a, S, inv);
    case 5:
      return group_f32<5>(a, S, inv);
    case 6:
      return group_f32<6>(a, S, inv);
    case 7:
      return group_f32<7>(a, S, inv);
    case 8:
      return group_f32<8>(a, S, inv);
    default:
      return group_generic(a, S, inv);
  }
}

RLHF_AVX512_DIAGNOSTICS_POP
#endif

}  // namespace

// Per (b, KV head g), for its G query heads j at once (each cached K/V row is read once per group
// of 16 positions):
//   S[j, s] = q_j · K[s] / sqrt(D)                      (positions in order)
//   e[j, s] = exp(S[j, s] − max_s S[j, ·]),  Z_j = Σ_s e[j, s]
//   out_j   = (Σ_s e[j, s] · V[s]) / Z_j
template <typename T, typename KV>
void attention_decode_cpu(T* out, const T* q, const KV* k_cache, const KV* v_cache,
                          const int32_t* block_table, const int32_t* seq_lens, int64_t B, int64_t H,
                          int64_t Hkv, int64_t D, int64_t num_blocks, int64_t block_size,
                          int64_t max_blocks) {
  RLHF_CHECK(
      B > 0 && H > 0 && Hkv > 0 && D > 0 && num_blocks > 0 && block_size > 0 && max_blocks > 0,
      "attention_decode_cpu: all dimensions must be > 0, got B={} H={} Hkv={} D={} "
      "num_blocks={} block_size={} max_blocks={}",
      B, H, Hkv, D, num_blocks, block_size, max_blocks);
  RLHF_CHECK(H % Hkv == 0,
             "attention_decode_cpu: num_attention_heads H={} is not a multiple of "
             "num_key_value_heads Hkv={}",
             H, Hkv);
  // Everything is checked before the parallel region (an exception must not leave it).
  int64_t max_n = 0;
  for (int64_t b = 0; b < B; ++b) {
    const int64_t n = seq_lens[b];
    RLHF_CHECK(n >= 1 && n <= max_blocks * block_size,
               "attention_decode_cpu: sequence {} has length {}, outside [1, {}] (max_blocks {} x "
               "block_size {})",
               b, n, max_blocks * block_size, max_blocks, block_size);
    for (int64_t i = 0; i < (n + block_size - 1) / block_size; ++i) {
      const int32_t blk = block_table[b * max_blocks + i];
      RLHF_CHECK(blk >= 0 && blk < num_blocks,
                 "attention_decode_cpu: block table entry {} of sequence {} is {}, outside [0, {})",
                 i, b, blk, num_blocks);
    }
    max_n = std::max(max_n, n);
  }
  const int64_t G = H / Hkv;
  const int64_t block_stride = Hkv * block_size * D;  // elements of one block
  const T sc = T(1) / std::sqrt(static_cast<T>(D));
  const int64_t scratch = G * max_n + G;  // per thread: scores (G, n) and 1/Z (G)
  std::vector<T> scores(static_cast<size_t>(omp_get_max_threads() * scratch));
#pragma omp parallel
  {
    T* S = scores.data() + omp_get_thread_num() * scratch;
    T* inv = S + G * max_n;  // (G) 1 / Z_j
#pragma omp for schedule(dynamic, 1)
    for (int64_t bg = 0; bg < B * Hkv; ++bg) {
      const int64_t b = bg / Hkv, g = bg % Hkv;
      const Group<T, KV> a{out + (b * H + g * G) * D,
                           q + (b * H + g * G) * D,
                           k_cache + g * block_size * D,
                           v_cache + g * block_size * D,
                           block_table + b * max_blocks,
                           int64_t(seq_lens[b]),
                           G,
                           D,
                           block_stride,
                           block_size,
                           sc};
#if defined(__AVX512F__)
      if constexpr (std::is_same_v<T, float> && std::is_same_v<KV, float>) {
        group_dispatch(a, S, inv);
        continue;
      }
#if defined(RLHF_ATT_DECODE_F16_AVX512)
      if constexpr (std::is_same_v<T, float> && std::is_same_v<KV, f16>) {
        group_dispatch(a, S, inv);
        continue;
      }
#endif
#endif
      group_generic(a, S, inv);
    }
  }
}

template void attention_decode_cpu<float>(float*, const float*, const float*, const float*,
                                          const int32_t*, const int32_t*, int64_t, int64_t, int64_t,
                                          int64_t, int64_t, int64_t, int64_t);
template void attention_decode_cpu<double>(double*, const double*, const double*, const double*,
                                           const int32_t*, const int32_t*, int64_t, int64_t,
                                           int64_t, int64_t, int64_t, int64_t, int64_t);
template void attention_decode_cpu<float, f16>(float*, const float*, const f16*, const f16*,
                                               const int32_t*, const int32_t*, int64_t, int64_t,
                                               int64_t, int64_t, int64_t, int64_t, int64_t);
template void attention_decode_cpu<double, f16>(double*, const double*, const f16*, const f16*,
                                                const int32_t*, const int32_t*, int64_t, int64_t,
                                                int64_t, int64_t, int64_t, int64_t, int64_t);

}  // namespace rlhf::model
