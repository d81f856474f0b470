// Token embedding on the GPU: gather forward, deterministic sorted-segment backward.
#include <cub/device/device_radix_sort.cuh>

#include "model/ops/cuda/cuda_common.cuh"
#include "model/ops/embedding.h"

namespace rlhf::model {

using cuda::to_bf16;
using cuda::to_f32;

namespace {

// --- kernels ---------------------------------------------------------------------------------

// One block per row n (grid-stride over rows), threads over columns.
__global__ void embedding_forward_kernel(bf16* out, const int32_t* tokens, const bf16* wte,
                                         int64_t N, int64_t C, int64_t V) {
  for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
    const int64_t tok = tokens[n];
    bf16* dst = out + n * C;
    if (tok < 0 || tok >= V) {
      for (int64_t c = threadIdx.x; c < C; c += blockDim.x) dst[c] = to_bf16(NAN);
      continue;
    }
    const bf16* src = wte + tok * C;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) dst[c] = src[c];
  }
}

// keys[n] = tokens[n] if valid else V (sorts after every valid id and is skipped), vals[n] = n.
__global__ void embedding_sort_prepare_kernel(int32_t* keys, int32_t* vals, const int32_t* tokens,
                                              int64_t N, int64_t V) {
  for (int64_t n = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; n < N;
       n += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int32_t t = tokens[n];
    keys[n] = (t >= 0 && t < V) ? t : static_cast<int32_t>(V);
    vals[n] = static_cast<int32_t>(n);
  }
}

// keys/rows: the (token, n) pairs sorted by token, stably (n increasing inside a token's run).
// The block at sorted position i owns the run that starts there (i = 0 or keys[i] != keys[i-1])
// and adds its rows of dout into dwte[token] in run order, column by column: every dwte element
// is written by exactly one thread, in the same order as the CPU version (n increasing).
__global__ void embedding_backward_kernel(float* dwte, const bf16* dout, const int32_t* keys,
                                          const int32_t* rows, int64_t N, int64_t C, int64_t V) {
  for (int64_t i = blockIdx.x; i < N; i += gridDim.x) {
    const int32_t tok = keys[i];
    if (tok >= V) continue;                     // invalid tokens (sorted last)
    if (i > 0 && keys[i - 1] == tok) continue;  // not the start of a run
    int64_t end = i + 1;
    while (end < N && keys[end] == tok) ++end;  // run [i, end)
    float* dst = dwte + static_cast<int64_t>(tok) * C;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
      float acc = dst[c];
      for (int64_t j = i; j < end; ++j) acc += to_f32(dout[static_cast<int64_t>(rows[j]) * C + c]);
      dst[c] = acc;
    }
  }
}

void check_dims(const char* op, int64_t N, int64_t C, int64_t V) {
  RLHF_CHECK(N >= 0 && C > 0 && V > 0, "{}: need N >= 0, C > 0, V > 0, got N={} C={} V={}", op, N,
             C, V);
  RLHF_CHECK(N <= INT32_MAX && V < INT32_MAX, "{}: N={} or V={} does not fit int32", op, N, V);
}

// Smallest b with 2^b > V: the sort only needs the bits of keys in [0, V].
int key_bits(int64_t V) {
  int b = 1;
  while (b < 31 && (int64_t{1} << b) <= V) ++b;
  return b;
}

size_t align256(size_t x) {
  return (x + 255) / 256 * 256;
}

}  // namespace

// --- launchers -------------------------------------------------------------------------------

void embedding_forward_cuda(bf16* out, const int32_t* tokens, const bf16* wte, int64_t N, int64_t C,
                            int64_t V, cudaStream_t stream) {
  NVTX_RANGE_FN();
  check_dims("embedding_forward_cuda", N, C, V);
  if (N == 0) return;
  const int block = C >= 256 ? 256 : 64;
  const unsigned grid = static_cast<unsigned>(N < 65535 * 4 ? N : 65535 * 4);
  embedding_forward_kernel<<<grid, block, 0, stream>>>(out, tokens, wte, N, C, V);
  CUDA_CHECK(cudaGetLastError());
}

void embedding_backward_cuda(float* dwte, const bf16* dout, const int32_t* tokens, int64_t N,
                             int64_t C, int64_t V, cudaStream_t stream) {
  NVTX_RANGE_FN();
  check_dims("embedding_backward_cuda", N, C, V);
  if (N == 0) return;
  const int n = static_cast<int>(N);
  const int end_bit = key_bits(V);
  size_t sort_bytes = 0;
  CUDA_CHECK(cub::DeviceRadixSort::SortPairs(
      nullptr, sort_bytes, static_cast<const int32_t*>(nullptr), static_cast<int32_t*>(nullptr),
      static_cast<const int32_t*>(nullptr), static_cast<int32_t*>(nullptr), n, 0, end_bit, stream));
  // One stream-ordered allocation: keys_in, keys_out, vals_in, vals_out (N int32 each), CUB temp.
  const size_t arr = align256(static_cast<size_t>(N) * sizeof(int32_t));
  const size_t total = 4 * arr + align256(sort_bytes);
  void* scratch = nullptr;
  CUDA_CHECK(cudaMallocAsync(&scratch, total, stream));
  char* base = static_cast<char*>(scratch);
  auto* keys_in = reinterpret_cast<int32_t*>(base);
  auto* keys_out = reinterpret_cast<int32_t*>(base + arr);
  auto* vals_in = reinterpret_cast<int32_t*>(base + 2 * arr);
  auto* vals_out = reinterpret_cast<int32_t*>(base + 3 * arr);
  void* sort_tmp = base + 4 * arr;
  try {
    embedding_sort_prepare_kernel<<<cuda::grid_for(N, 256), 256, 0, stream>>>(keys_in, vals_in,
                                                                              tokens, N, V);
    CUDA_CHECK(cudaGetLastError());
    CUDA_CHECK(cub::DeviceRadixSort::SortPairs(sort_tmp, sort_bytes, keys_in, keys_out, vals_in,
                                               vals_out, n, 0, end_bit, stream));
    const int block = C >= 256 ? 256 : 64;
    const unsigned grid = static_cast<unsigned>(N < 65535 * 4 ? N : 65535 * 4);
    embedding_backward_kernel<<<grid, block, 0, stream>>>(dwte, dout, keys_out, vals_out, N, C, V);
    CUDA_CHECK(cudaGetLastError());
  } catch (...) {
    (void)cudaFreeAsync(scratch, stream);
    throw;
  }
  CUDA_CHECK(cudaFreeAsync(scratch, stream));
}

}  // namespace rlhf::model
