// The bfloat16 array conversions of model/ops/half.h.
#include <algorithm>

#include "model/op_clock.h"
#include "model/ops/cpu/avx512_util.h"
#include "model/ops/half.h"

namespace rlhf::model {

namespace {

// Elements per OpenMP chunk, and the size below which one thread does it all (a conversion is a
// few cycles per element; a parallel region costs microseconds).
constexpr int64_t kChunk = 16384;

// Runs fn(begin, end) over [0, n) in kChunk pieces, threaded when n is large.
template <typename Fn>
void for_chunks(int64_t n, const Fn& fn) {
  const int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (chunks >= 4)
  for (int64_t c = 0; c < chunks; ++c) fn(c * kChunk, std::min(n, (c + 1) * kChunk));
}

#if defined(__AVX512F__)
RLHF_AVX512_DIAGNOSTICS_PUSH
// 16 floats (as their bits) -> 16 rounded bfloat16 bit patterns in the low halves of 32-bit lanes:
// the same integer arithmetic as float_to_bf16.
inline __m512i round_bits16(__m512 v) {
  const __m512i b = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(b, 16), _mm512_set1_epi32(1));
  const __m512i rounded =
      _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(b, _mm512_set1_epi32(0x7FFF)), lsb), 16);
  const __m512i nan = _mm512_or_si512(_mm512_srli_epi32(b, 16), _mm512_set1_epi32(0x40));
  const __mmask16 is_nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  return _mm512_mask_blend_epi32(is_nan, rounded, nan);
}
RLHF_AVX512_DIAGNOSTICS_POP
#endif

}  // namespace

#if defined(__AVX512F__)
RLHF_AVX512_DIAGNOSTICS_PUSH
#endif
void float_to_bf16_row(bfloat16* dst, const float* src, int64_t n) {
  int64_t i = 0;
#if defined(__AVX512F__)
  for (; i + 16 <= n; i += 16)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i),
                        _mm512_cvtepi32_epi16(round_bits16(_mm512_loadu_ps(src + i))));
#endif
  for (; i < n; ++i) dst[i] = float_to_bf16(src[i]);
}

void float_to_bf16_n(bfloat16* dst, const float* src, int64_t n) {
  const OpClock clock(OpKind::kBf16Round);
  for_chunks(n, [&](int64_t i, int64_t end) { float_to_bf16_row(dst + i, src + i, end - i); });
}

void bf16_to_float_n(float* dst, const bfloat16* src, int64_t n) {
  const OpClock clock(OpKind::kBf16Round);
  for_chunks(n, [&](int64_t i, int64_t end) {
#if defined(__AVX512F__)
    for (; i + 16 <= end; i += 16) {
      const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i));
      _mm512_storeu_si512(dst + i, _mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
#endif
    for (; i < end; ++i) dst[i] = bf16_to_float(src[i]);
  });
}

void round_to_bf16_n(float* x, int64_t n) {
  const OpClock clock(OpKind::kBf16Round);
  for_chunks(n, [&](int64_t i, int64_t end) {
#if defined(__AVX512F__)
    for (; i + 16 <= end; i += 16)
      _mm512_storeu_si512(x + i, _mm512_slli_epi32(round_bits16(_mm512_loadu_ps(x + i)), 16));
#endif
    for (; i < end; ++i) x[i] = round_to_bf16(x[i]);
  });
}
#if defined(__AVX512F__)
RLHF_AVX512_DIAGNOSTICS_POP
#endif

}  // namespace rlhf::model
