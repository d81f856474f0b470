// The LoRA adapter branch on the GPU (model/lora_cuda.h): two thin GEMMs through an (N, r)
// intermediate on cuBLAS (bf16 operands, CUBLAS_COMPUTE_32F), and PEFT's inverted dropout with
// the CPU's mask hash.
//
// Row-major C (M, N) = op(A)·op(B) is column-major Cᶜ (N × M) = op(B)ᶜ·op(A)ᶜ, so every GEMM here
// calls cublasGemmEx with the operands swapped (gemm_rm).
#include <cublas_v2.h>

#include <climits>
#include <map>
#include <mutex>

#include "model/lora_cuda.h"
#include "model/ops/cuda/cuda_common.cuh"

namespace rlhf::model {

using cuda::to_bf16;
using cuda::to_f32;

namespace {

// splitmix64's finaliser, as model/lora.cpp's mix(): the masks must agree bit for bit.
__host__ __device__ inline uint64_t mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// y[n, i] = keep(n, i) ? x[n, i]·keep_scale : 0 (lora_dropout_keep's test: u ≥ p).
__global__ void dropout_kernel(bf16* y, const bf16* x, double p, float keep_scale, uint64_t key,
                               int64_t N, int64_t in) {
  const int64_t total = N * in;
  for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; k < total;
       k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const double u =
        (static_cast<double>(mix64(key ^ mix64(static_cast<uint64_t>(k))) >> 11) + 0.5) * 0x1.0p-53;
    y[k] = u >= p ? to_bf16(to_f32(x[k]) * keep_scale) : to_bf16(0.0f);
  }
}

// dst[k] += src[k] (bf16, fp32 sum, one rounding).
__global__ void add_kernel(bf16* dst, const bf16* src, int64_t n) {
  for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; k < n;
       k += static_cast<int64_t>(gridDim.x) * blockDim.x)
    dst[k] = to_bf16(to_f32(dst[k]) + to_f32(src[k]));
}

// Per (device, stream): a cuBLAS handle and a bf16 scratch buffer, grown on demand.
struct StreamState {
  cublasHandle_t blas = nullptr;
  bf16* scratch = nullptr;
  int64_t elems = 0;
};

struct Cache {
  std::mutex mu;
  std::map<std::pair<int, cudaStream_t>, StreamState> states;
};

Cache& cache() {
  static Cache* c = new Cache();  // never destroyed: may be used until the very end of main
  return *c;
}

StreamState& state_for(cudaStream_t stream, int64_t scratch_elems) {
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mu);
  StreamState& s = c.states[{dev, stream}];
  if (s.blas == nullptr) {
    CUBLAS_CHECK(cublasCreate(&s.blas));
    CUBLAS_CHECK(cublasSetStream(s.blas, stream));
  }
  if (s.elems < scratch_elems) {
    // The old buffer may still be read by work enqueued on this stream: wait for it.
    CUDA_CHECK(cudaStreamSynchronize(stream));
    if (s.scratch != nullptr) CUDA_CHECK(cudaFree(s.scratch));
    s.scratch = nullptr;
    s.elems = 0;
    CUDA_CHECK(cudaMalloc(&s.scratch, static_cast<size_t>(scratch_elems) * sizeof(bf16)));
    s.elems = scratch_elems;
  }
  return s;
}

// Row-major C (M, N) = alpha·op(A)·op(B) + beta·C; A, B bf16, C bf16 or fp32 (c_type), fp32
// compute. op(A) is (M, K), op(B) is (K, N).
void gemm_rm(cublasHandle_t h, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
             const bf16* A, int64_t lda, const bf16* B, int64_t ldb, float beta, void* C,
             cudaDataType_t c_type, int64_t ldc) {
  for (int64_t v : {M, N, K, lda, ldb, ldc})
    RLHF_CHECK(v <= INT_MAX, "LoRA GEMM: dimension {} exceeds INT_MAX", v);
  CUBLAS_CHECK(cublasGemmEx(h, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N,
                            static_cast<int>(N), static_cast<int>(M), static_cast<int>(K), &alpha,
                            B, CUDA_R_16BF, static_cast<int>(ldb), A, CUDA_R_16BF,
                            static_cast<int>(lda), &beta, C, c_type, static_cast<int>(ldc),
                            CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

constexpr int64_t kAlign = 128;  // scratch pieces start on 256 bytes
int64_t up(int64_t n) {
  return (n + kAlign - 1) / kAlign * kAlign;
}

void dropout(bf16* y, const bf16* x, double p, uint64_t key, int64_t N, int64_t in,
             cudaStream_t stream) {
  const float keep_scale = static_cast<float>(1.0 / (1.0 - p));
  dropout_kernel<<<cuda::grid_for(N * in, 256), 256, 0, stream>>>(y, x, p, keep_scale, key, N, in);
  CUDA_CHECK(cudaGetLastError());
}

void check(const char* op, const LoraDeviceAdapter& a, int64_t N, int64_t in, int64_t out) {
  RLHF_CHECK(N >= 0 && in > 0 && out > 0 && a.r > 0,
             "{}: need N >= 0, in, out, r > 0, got N={} in={} out={} r={}", op, N, in, out, a.r);
}

}  // namespace

void lora_dropout_cuda(bf16* y, const bf16* x, double p, uint64_t key, int64_t N, int64_t in,
                       cudaStream_t stream) {
  RLHF_CHECK(p >= 0 && p < 1, "lora_dropout_cuda: p must be in [0, 1), got {}", p);
  if (N * in == 0) return;
  dropout(y, x, p, key, N, in, stream);
}

void lora_forward_cuda(bf16* y, const bf16* x, const LoraDeviceAdapter& a, int64_t N, int64_t in,
                       int64_t out, cudaStream_t stream) {
  if (a.A == nullptr || N == 0) return;
  NVTX_RANGE_FN();
  check("lora_forward_cuda", a, N, in, out);
  const int64_t r = a.r;
  const bool drop = a.dropout > 0;
  StreamState& s = state_for(stream, up(N * r) + (drop ? up(N * in) : 0));
  bf16* h = s.scratch;
  const bf16* xd = x;
  if (drop) {
    bf16* buf = s.scratch + up(N * r);
    dropout(buf, x, a.dropout, a.key, N, in, stream);
    xd = buf;
  }
  gemm_rm(s.blas, false, true, N, r, in, 1.0f, xd, in, a.A, in, 0.0f, h, CUDA_R_16BF, r);
  gemm_rm(s.blas, false, true, N, out, r, 1.0f, h, r, a.Bs, r, 1.0f, y, CUDA_R_16BF, out);
}

void lora_backward_cuda(bf16* dx, const bf16* dy, const bf16* x, const LoraDeviceAdapter& a,
                        int64_t N, int64_t in, int64_t out, cudaStream_t stream) {
  if (a.A == nullptr || N == 0) return;
  NVTX_RANGE_FN();
  check("lora_backward_cuda", a, N, in, out);
  const int64_t r = a.r;
  const bool drop = a.dropout > 0;
  StreamState& s = state_for(stream, 2 * up(N * r) + (drop ? 2 * up(N * in) : 0));
  bf16* h = s.scratch;
  bf16* g = s.scratch + up(N * r);
  const bf16* xd = x;
  bf16* gx = nullptr;
  if (drop) {
    bf16* buf = g + up(N * r);
    gx = buf + up(N * in);
    dropout(buf, x, a.dropout, a.key, N, in, stream);
    xd = buf;
  }
  // g = dy·Bs (N, r) = (α/r)·dy·B.
  gemm_rm(s.blas, false, false, N, r, out, 1.0f, dy, out, a.Bs, r, 0.0f, g, CUDA_R_16BF, r);
  if (a.dB != nullptr) {  // dB += (α/r)·dyᵀ·h, h = x'·Aᵀ recomputed
    gemm_rm(s.blas, false, true, N, r, in, 1.0f, xd, in, a.A, in, 0.0f, h, CUDA_R_16BF, r);
    gemm_rm(s.blas, true, false, out, r, N, a.scale, dy, out, h, r, 1.0f, a.dB, CUDA_R_32F, r);
  }
  if (a.dA != nullptr)  // dA += gᵀ·x'
    gemm_rm(s.blas, true, false, r, in, N, 1.0f, g, r, xd, in, 1.0f, a.dA, CUDA_R_32F, in);
  if (dx == nullptr) return;
  if (!drop) {  // dx += g·A
    gemm_rm(s.blas, false, false, N, in, r, 1.0f, g, r, a.A, in, 1.0f, dx, CUDA_R_16BF, in);
    return;
  }
  // dx += d(g·A): the forward's mask and 1/(1−p).
  gemm_rm(s.blas, false, false, N, in, r, 1.0f, g, r, a.A, in, 0.0f, gx, CUDA_R_16BF, in);
  dropout(gx, gx, a.dropout, a.key, N, in, stream);
  add_kernel<<<cuda::grid_for(N * in, 256), 256, 0, stream>>>(dx, gx, N * in);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace rlhf::model
