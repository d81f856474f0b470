#include "model/ops/attention_decode.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/error.h"
#include "model/ops/cpu/vec_math.h"

namespace rlhf::model {

// Per (b, KV head g), for its G query heads j at once (each cached K/V row is read once per group):
//   S[j, s] = q_j · K[s] / sqrt(D)                      (positions in order, block by block)
//   e[j, s] = exp(S[j, s] − max_s S[j, ·]),  Z_j = Σ_s e[j, s]
//   out_j   = (Σ_s e[j, s] · V[s]) / Z_j
template <typename T>
void attention_decode_cpu(T* out, const T* q, const T* k_cache, const T* v_cache,
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
  const int64_t kv_row = Hkv * D;  // elements between consecutive positions of one block
  const T sc = T(1) / std::sqrt(static_cast<T>(D));
  const int64_t scratch = G * max_n + G;  // per thread: scores (G, n) and 1/Z (G)
  std::vector<T> scores(static_cast<size_t>(omp_get_max_threads() * scratch));
#pragma omp parallel
  {
    T* S = scores.data() + omp_get_thread_num() * scratch;
#pragma omp for schedule(dynamic, 1)
    for (int64_t bg = 0; bg < B * Hkv; ++bg) {
      const int64_t b = bg / Hkv, g = bg % Hkv, n = seq_lens[b];
      const int32_t* table = block_table + b * max_blocks;
      const T* qg = q + (b * H + g * G) * D;  // the group's G query heads, (G, D)
      // Scores, position by position.
      for (int64_t s0 = 0; s0 < n; s0 += block_size) {
        const int64_t rows = std::min(block_size, n - s0);
        const T* kb = k_cache + int64_t(table[s0 / block_size]) * block_size * kv_row + g * D;
        for (int64_t r = 0; r < rows; ++r) {
          const T* kr = kb + r * kv_row;
          for (int64_t j = 0; j < G; ++j) {
            const T* qr = qg + j * D;
            T dot = 0;
#pragma omp simd reduction(+ : dot)
            for (int64_t d = 0; d < D; ++d) dot += qr[d] * kr[d];
            S[j * n + s0 + r] = dot * sc;
          }
        }
      }
      // Softmax numerators and their sums.
      T* inv = S + G * max_n;  // (G) 1 / Z_j
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
      // Weighted sum of values, position by position, then the normalisation.
      T* og = out + (b * H + g * G) * D;
      std::fill(og, og + G * D, T(0));
      for (int64_t s0 = 0; s0 < n; s0 += block_size) {
        const int64_t rows = std::min(block_size, n - s0);
        const T* vb = v_cache + int64_t(table[s0 / block_size]) * block_size * kv_row + g * D;
        for (int64_t r = 0; r < rows; ++r) {
          const T* vr = vb + r * kv_row;
          for (int64_t j = 0; j < G; ++j) {
            const T p = S[j * n + s0 + r];
            T* o = og + j * D;
#pragma omp simd
            for (int64_t d = 0; d < D; ++d) o[d] += p * vr[d];
          }
        }
      }
      for (int64_t j = 0; j < G; ++j) {
        T* o = og + j * D;
#pragma omp simd
        for (int64_t d = 0; d < D; ++d) o[d] *= inv[j];
      }
    }
  }
}

template void attention_decode_cpu<float>(float*, const float*, const float*, const float*,
                                          const int32_t*, const int32_t*, int64_t, int64_t, int64_t,
                                          int64_t, int64_t, int64_t, int64_t);
template void attention_decode_cpu<double>(double*, const double*, const double*, const double*,
                                           const int32_t*, const int32_t*, int64_t, int64_t,
                                           int64_t, int64_t, int64_t, int64_t, int64_t);

}  // namespace rlhf::model
