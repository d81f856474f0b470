#include "model/ops/embedding.h"

#include <omp.h>

#include <algorithm>

#include "core/error.h"

namespace rlhf::model {

namespace {

// Throws naming the first token outside [0, V) (positions are flat indices into tokens).
void check_tokens(const int32_t* tokens, int64_t N, int64_t V, const char* op) {
  for (int64_t n = 0; n < N; ++n) {
    RLHF_CHECK(tokens[n] >= 0 && tokens[n] < V,
               "{}: token id {} at position {} is outside the vocabulary [0, {})\nhint: the "
               "tokenizer and the model config disagree on vocab_size, or the data holds ids from "
               "another tokenizer",
               op, tokens[n], n, V);
  }
}

}  // namespace

template <typename T>
void embedding_forward_cpu(T* out, const int32_t* tokens, const T* wte, int64_t N, int64_t C,
                           int64_t V) {
  check_tokens(tokens, N, V, "embedding_forward_cpu");
#pragma omp parallel for schedule(static) if (N * C >= 32768)
  for (int64_t n = 0; n < N; ++n) {
    const T* src = wte + static_cast<int64_t>(tokens[n]) * C;
    std::copy(src, src + C, out + n * C);
  }
}

template <typename T>
void embedding_backward_cpu(T* dwte, const T* dout, const int32_t* tokens, int64_t N, int64_t C,
                            int64_t V) {
  check_tokens(tokens, N, V, "embedding_backward_cpu");
  // Each thread owns a disjoint column range of dwte and walks all tokens in order: every dwte
  // element receives its additions in token order whatever the thread count, and repeated tokens
  // need no atomics. Ranges are whole multiples of 64 bytes, so when rows are cache-line aligned
  // (C·sizeof(T) a multiple of 64, e.g. C = 288 in fp32) no two threads write the same line.
  constexpr int64_t kLine = 64 / sizeof(T);
  const int64_t nlines = (C + kLine - 1) / kLine;
#pragma omp parallel if (N * C >= 32768)
  {
    const int64_t nt = omp_get_num_threads(), t = omp_get_thread_num();
    const int64_t c0 = std::min(C, nlines * t / nt * kLine);
    const int64_t c1 = std::min(C, nlines * (t + 1) / nt * kLine);
    for (int64_t n = 0; n < N && c0 < c1; ++n) {
      T* dst = dwte + static_cast<int64_t>(tokens[n]) * C;
      const T* src = dout + n * C;
#pragma omp simd
      for (int64_t c = c0; c < c1; ++c) dst[c] += src[c];
    }
  }
}

template void embedding_forward_cpu<float>(float*, const int32_t*, const float*, int64_t, int64_t,
                                           int64_t);
template void embedding_forward_cpu<double>(double*, const int32_t*, const double*, int64_t,
                                            int64_t, int64_t);
template void embedding_backward_cpu<float>(float*, const float*, const int32_t*, int64_t, int64_t,
                                            int64_t);
template void embedding_backward_cpu<double>(double*, const double*, const int32_t*, int64_t,
                                             int64_t, int64_t);

}  // namespace rlhf::model
