// Linear layer on the GPU through cuBLASLt (bf16 inputs, fp32 compute), with a small cache of
// handles, per-stream workspaces and heuristic results.
//
// Row-major (N, X) arrays are column-major (X, N) matrices, so with HF's w (OC, IC):
//   y (N, OC)   = x · wᵀ   ->  yᶜ (OC × N)  = op_T(wᶜ: IC × OC) · xᶜ (IC × N)
//   dx (N, IC)  = dy · w   ->  dxᶜ (IC × N) = wᶜ (IC × OC) · dyᶜ (OC × N)
//   dw (OC, IC) = dyᵀ · x  ->  dwᶜ (IC × OC) = xᶜ (IC × N) · op_T(dyᶜ: OC × N)
#include <cublasLt.h>
#include <cublas_v2.h>

#include <climits>
#include <map>
#include <mutex>
#include <tuple>

#include "model/ops/cuda/cuda_common.cuh"
#include "model/ops/linear.h"

namespace rlhf::model {

using cuda::to_bf16;
using cuda::to_f32;

namespace {

constexpr size_t kWorkspaceBytes = size_t{32} << 20;  // cuBLAS' recommendation for Hopper
constexpr int kColTile = 32, kColRows = 16;           // db column sums (as rmsnorm's dw)

// --- kernels ---------------------------------------------------------------------------------

// y[n, o] = b[o] for every row (the bias pre-fill used when the epilogue cannot be).
__global__ void fill_rows_kernel(bf16* y, const bf16* b, int64_t N, int64_t OC) {
  const int64_t total = N * OC;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    y[i] = b[i % OC];
}

// db[o] += Σ_n dy[n, o]: block (32, 16), rows summed in a fixed order (deterministic).
__global__ void bias_grad_kernel(float* db, const bf16* dy, int64_t N, int64_t OC) {
  __shared__ float part[kColRows][kColTile];
  const int64_t o = static_cast<int64_t>(blockIdx.x) * kColTile + threadIdx.x;
  float acc = 0.0f;
  if (o < OC)
    for (int64_t n = threadIdx.y; n < N; n += kColRows) acc += to_f32(dy[n * OC + o]);
  part[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && o < OC) {
    float s = 0.0f;
    for (int i = 0; i < kColRows; ++i) s += part[i][threadIdx.x];
    db[o] += s;
  }
}

// --- the cache -------------------------------------------------------------------------------

// Largest power of two (<= 16) dividing the address: cuBLASLt's heuristics pick kernels by the
// alignment of the pointers, so it is part of the cache key.
int alignment(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  int al = 1;
  while (al < 16 && a % (2 * al) == 0) al *= 2;
  return al;
}

struct DeviceHandles {
  cublasLtHandle_t lt = nullptr;
  cublasHandle_t blas = nullptr;
};

// One GEMM problem as cuBLASLt sees it (column-major; see the file comment).
struct Gemm {
  bool trans_a = false, trans_b = false;
  int64_t m = 0, n = 0, k = 0;
  const void* A = nullptr;
  int64_t lda = 0;
  const void* B = nullptr;
  int64_t ldb = 0;
  void* D = nullptr;  // also C (in-place accumulate with beta)
  int64_t ldd = 0;
  cudaDataType_t d_type = CUDA_R_16BF;
  float beta = 0.0f;
  const void* bias = nullptr;  // bf16 (m), via CUBLASLT_EPILOGUE_BIAS
};

using AlgoKey = std::tuple<int, bool, bool, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                           int, bool, bool, int, int, int, int>;

struct Cache {
  std::mutex mu;
  std::map<int, DeviceHandles> handles;                            // by device
  std::map<std::pair<int, cudaStream_t>, void*> workspaces;        // by (device, stream)
  std::map<AlgoKey, std::pair<bool, cublasLtMatmulAlgo_t>> algos;  // found?, algo
};

Cache& cache() {
  static Cache* c = new Cache();  // never destroyed: may be used until the very end of main
  return *c;
}

// RAII for the cuBLASLt descriptors of one call.
struct LtDescs {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  LtDescs() = default;
  LtDescs(const LtDescs&) = delete;
  LtDescs& operator=(const LtDescs&) = delete;
  ~LtDescs() {
    if (d) cublasLtMatrixLayoutDestroy(d);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

void make_descs(LtDescs& ds, const Gemm& g) {
  CUBLAS_CHECK(cublasLtMatmulDescCreate(&ds.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t ta = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t tb = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(ds.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(ds.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  if (g.bias != nullptr) {
    const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
    const cudaDataType_t bias_type = CUDA_R_16BF;
    CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(ds.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(ds.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
                                                &bias_type, sizeof(bias_type)));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(ds.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g.bias,
                                                sizeof(g.bias)));
  }
  // Stored shapes: op(A) is (m × k), op(B) is (k × n).
  const uint64_t a_rows = g.trans_a ? g.k : g.m, a_cols = g.trans_a ? g.m : g.k;
  const uint64_t b_rows = g.trans_b ? g.n : g.k, b_cols = g.trans_b ? g.k : g.n;
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&ds.a, CUDA_R_16BF, a_rows, a_cols, g.lda));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&ds.b, CUDA_R_16BF, b_rows, b_cols, g.ldb));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&ds.d, g.d_type, static_cast<uint64_t>(g.m),
                                          static_cast<uint64_t>(g.n), g.ldd));
}

// Handles of the current device and the workspace of (device, stream), created on first use.
std::pair<DeviceHandles, void*> handles_for(cudaStream_t stream, int* device) {
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  *device = dev;
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mu);
  DeviceHandles& h = c.handles[dev];
  if (h.lt == nullptr) CUBLAS_CHECK(cublasLtCreate(&h.lt));
  if (h.blas == nullptr) CUBLAS_CHECK(cublasCreate(&h.blas));
  void*& ws = c.workspaces[{dev, stream}];
  if (ws == nullptr) CUDA_CHECK(cudaMalloc(&ws, kWorkspaceBytes));
  return {h, ws};
}

// Runs g through cuBLASLt. Returns false (and launches nothing) if the heuristic offers no
// algorithm for it, or if the algorithm it offered is refused at launch
// (CUBLAS_STATUS_NOT_SUPPORTED from cublasLtMatmul: seen on an H200 with cuBLAS 13.1 for a 1-column
// output of 8 rows, a value head); both are remembered for the shape. Throws on any other failure.
bool lt_gemm(const Gemm& g, cudaStream_t stream) {
  int dev = 0;
  const std::pair<DeviceHandles, void*> hw = handles_for(stream, &dev);
  const DeviceHandles h = hw.first;
  void* const ws = hw.second;
  LtDescs ds;
  make_descs(ds, g);
  const AlgoKey key{dev,
                    g.trans_a,
                    g.trans_b,
                    g.m,
                    g.n,
                    g.k,
                    g.lda,
                    g.ldb,
                    g.ldd,
                    static_cast<int>(g.d_type),
                    g.bias != nullptr,
                    g.beta != 0.0f,
                    alignment(g.A),
                    alignment(g.B),
                    alignment(g.D),
                    alignment(g.bias)};
  cublasLtMatmulAlgo_t algo{};
  bool found = false;
  {
    Cache& c = cache();
    std::lock_guard<std::mutex> lock(c.mu);
    auto it = c.algos.find(key);
    if (it != c.algos.end()) {
      found = it->second.first;
      algo = it->second.second;
    } else {
      cublasLtMatmulPreference_t pref = nullptr;
      CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
      const uint64_t ws_bytes = kWorkspaceBytes;
      cublasLtMatmulHeuristicResult_t res{};
      int returned = 0;
      cublasStatus_t st = cublasLtMatmulPreferenceSetAttribute(
          pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes, sizeof(ws_bytes));
      if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulAlgoGetHeuristic(h.lt, ds.op, ds.a, ds.b, ds.d, ds.d, pref, 1, &res,
                                            &returned);
      cublasLtMatmulPreferenceDestroy(pref);
      // NOT_SUPPORTED means "no algorithm for this problem": fall back, do not fail.
      if (st != CUBLAS_STATUS_NOT_SUPPORTED) CUBLAS_CHECK(st);
      found = st == CUBLAS_STATUS_SUCCESS && returned > 0 && res.state == CUBLAS_STATUS_SUCCESS;
      if (found) algo = res.algo;
      c.algos[key] = {found, algo};
    }
  }
  if (!found) return false;
  const float alpha = 1.0f, beta = g.beta;
  const cublasStatus_t st = cublasLtMatmul(h.lt, ds.op, &alpha, g.A, ds.a, g.B, ds.b, &beta, g.D,
                                           ds.d, g.D, ds.d, &algo, ws, kWorkspaceBytes, stream);
  if (st == CUBLAS_STATUS_NOT_SUPPORTED) {  // the offered algorithm does not run: fall back
    Cache& c = cache();
    std::lock_guard<std::mutex> lock(c.mu);
    c.algos[key] = {false, algo};
    return false;
  }
  CUBLAS_CHECK(st);
  return true;
}

// The same GEMM through cublasGemmEx (no epilogue): for shapes cuBLASLt has no algorithm for.
void gemm_ex(const Gemm& g, cudaStream_t stream) {
  RLHF_ASSERT(g.bias == nullptr);
  for (int64_t v : {g.m, g.n, g.k, g.lda, g.ldb, g.ldd})
    RLHF_CHECK(v <= INT_MAX, "linear (cuBLAS fallback): dimension {} exceeds INT_MAX", v);
  int dev = 0;
  const DeviceHandles h = handles_for(stream, &dev).first;
  const float alpha = 1.0f, beta = g.beta;
  std::lock_guard<std::mutex> lock(cache().mu);  // cublasSetStream + call on a shared handle
  CUBLAS_CHECK(cublasSetStream(h.blas, stream));
  CUBLAS_CHECK(cublasGemmEx(
      h.blas, g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
      static_cast<int>(g.m), static_cast<int>(g.n), static_cast<int>(g.k), &alpha, g.A, CUDA_R_16BF,
      static_cast<int>(g.lda), g.B, CUDA_R_16BF, static_cast<int>(g.ldb), &beta, g.D, g.d_type,
      static_cast<int>(g.ldd), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

// cuBLASLt, else cuBLAS. A bias that cuBLASLt cannot take as an epilogue (unaligned, or no
// algorithm with it) is pre-filled into D by the caller-visible path below.
void run_gemm(Gemm g, cudaStream_t stream, int64_t N_rows, bf16* y_for_bias) {
  if (g.bias != nullptr && alignment(g.bias) >= 16 && lt_gemm(g, stream)) return;
  if (g.bias != nullptr) {  // y[n, :] = b, then D += A·B
    fill_rows_kernel<<<cuda::grid_for(N_rows * g.m, 256), 256, 0, stream>>>(
        y_for_bias, static_cast<const bf16*>(g.bias), N_rows, g.m);
    CUDA_CHECK(cudaGetLastError());
    g.bias = nullptr;
    g.beta = 1.0f;
  }
  if (lt_gemm(g, stream)) return;
  gemm_ex(g, stream);
}

void check_dims(const char* op, int64_t N, int64_t IC, int64_t OC) {
  RLHF_CHECK(N >= 0 && IC > 0 && OC > 0, "{}: need N >= 0, IC > 0, OC > 0, got N={} IC={} OC={}",
             op, N, IC, OC);
}

}  // namespace

// --- launchers -------------------------------------------------------------------------------

void linear_forward_cuda(bf16* y, const bf16* x, const bf16* w, const bf16* b, int64_t N,
                         int64_t IC, int64_t OC, cudaStream_t stream) {
  NVTX_RANGE_FN();
  check_dims("linear_forward_cuda", N, IC, OC);
  if (N == 0) return;
  if (linear_skinny_serves(x, w, N, IC))
    return linear_forward_skinny_cuda(y, x, w, b, N, IC, OC, stream);
  Gemm g;
  g.trans_a = true;  // wᶜ (IC × OC) transposed
  g.trans_b = false;
  g.m = OC;
  g.n = N;
  g.k = IC;
  g.A = w;
  g.lda = IC;
  g.B = x;
  g.ldb = IC;
  g.D = y;
  g.ldd = OC;
  g.d_type = CUDA_R_16BF;
  g.beta = 0.0f;
  g.bias = b;
  run_gemm(g, stream, N, y);
}

void linear_backward_cuda(bf16* dx, float* dw, float* db, const bf16* dy, const bf16* x,
                          const bf16* w, int64_t N, int64_t IC, int64_t OC, bool accumulate_dx,
                          cudaStream_t stream) {
  NVTX_RANGE_FN();
  check_dims("linear_backward_cuda", N, IC, OC);
  if (N == 0) return;
  if (dx != nullptr) {  // dxᶜ (IC × N) = wᶜ (IC × OC) · dyᶜ (OC × N)
    Gemm g;
    g.m = IC;
    g.n = N;
    g.k = OC;
    g.A = w;
    g.lda = IC;
    g.B = dy;
    g.ldb = OC;
    g.D = dx;
    g.ldd = IC;
    g.d_type = CUDA_R_16BF;
    g.beta = accumulate_dx ? 1.0f : 0.0f;
    run_gemm(g, stream, N, nullptr);
  }
  if (dw != nullptr) {  // dwᶜ (IC × OC) += xᶜ (IC × N) · (dyᶜ (OC × N))ᵀ, fp32 output
    Gemm g;
    g.trans_b = true;
    g.m = IC;
    g.n = OC;
    g.k = N;
    g.A = x;
    g.lda = IC;
    g.B = dy;
    g.ldb = OC;
    g.D = dw;
    g.ldd = IC;
    g.d_type = CUDA_R_32F;
    g.beta = 1.0f;
    run_gemm(g, stream, N, nullptr);
  }
  if (db != nullptr) {
    const dim3 block(kColTile, kColRows);
    bias_grad_kernel<<<static_cast<unsigned>(cuda::ceil_div(OC, kColTile)), block, 0, stream>>>(
        db, dy, N, OC);
    CUDA_CHECK(cudaGetLastError());
  }
}

void linear_cuda_release() noexcept {
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mu);
  for (auto& [key, ws] : c.workspaces)
    if (ws != nullptr) (void)cudaFree(ws);
  for (auto& [dev, h] : c.handles) {
    if (h.lt != nullptr) (void)cublasLtDestroy(h.lt);
    if (h.blas != nullptr) (void)cublasDestroy(h.blas);
  }
  c.workspaces.clear();
  c.handles.clear();
  c.algos.clear();
}

}  // namespace rlhf::model
