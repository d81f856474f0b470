// CUDA-side error checks and helpers (docs/design.md, "Conventions: ops" and "Errors"), usable from
// host C++ and from .cu files.
//
// Always available (with or without CUDA):
//  - cuda_device_count(): number of usable CUDA devices, 0 when built without CUDA, when there is
//    no driver or no device. Tests call it to report "skipped: no CUDA device".
//  - NVTX_RANGE_FN(): an NVTX range named after the enclosing function (llm.c); a no-op when built
//    without CUDA or when the NVTX v3 headers are missing.
// With RLHF_CUDA:
//  - CUDA_CHECK(call), CUBLAS_CHECK(call): throw rlhf::Error "<lib> error: <name: text> in `call`
//    at file:line (rank R on host H)" when the call does not return success (RLHF_CHECK_GEN).
//  - CUDNN_CHECK(call) (with RLHF_CUDNN) and NCCL_CHECK(call) (with RLHF_NCCL): the same for
//    cudnnStatus_t and ncclResult_t. The status enums are converted to int here, so this header
//    does not pull cudnn.h or nccl.h into every file: include them yourself where you call them.
#pragma once

#include <string>

#include "core/error.h"

#ifdef RLHF_CUDA
#include <cublas_api.h>
#include <cuda_runtime_api.h>
#endif

#if defined(RLHF_CUDA) && defined(__has_include)
#if __has_include(<nvtx3/nvToolsExt.h>)
#include <nvtx3/nvToolsExt.h>
#define RLHF_HAVE_NVTX 1
#endif
#endif

namespace rlhf {

/// Number of CUDA devices this process can use; 0 when built without CUDA, with no driver (or one
/// too old for the runtime) or no device. Never throws; clears the CUDA error state it causes.
int cuda_device_count() noexcept;

/// "NVIDIA H100 80GB HBM3 (sm_90, 79.1 GiB), driver 12080, runtime 13000" for the current device,
/// or "no CUDA device" (for test and log messages). Never throws.
std::string cuda_device_summary() noexcept;

#ifdef RLHF_CUDA

/// True for cudaSuccess.
inline bool cuda_ok(cudaError_t e) {
  return e == cudaSuccess;
}
/// "cudaErrorMemoryAllocation: out of memory" (cudaGetErrorName: cudaGetErrorString).
std::string cuda_error_string(cudaError_t e);

/// True for CUBLAS_STATUS_SUCCESS (cuBLAS and cuBLASLt share cublasStatus_t).
inline bool cublas_ok(cublasStatus_t s) {
  return s == CUBLAS_STATUS_SUCCESS;
}
/// "CUBLAS_STATUS_NOT_SUPPORTED: the functionality requested is not supported"
/// (cublasGetStatusName: cublasGetStatusString).
std::string cublas_error_string(cublasStatus_t s);

/// cuDNN and NCCL statuses, taken as int (their enums start at success = 0): "CUDNN_STATUS_...
/// (code)" via cudnnGetErrorString and "ncclInvalidUsage: ... (code)" via ncclGetErrorString. Built
/// only with RLHF_CUDNN / RLHF_NCCL; otherwise they return "status <code>".
std::string cudnn_error_string(int status);
std::string nccl_error_string(int status);

/// Success test for the int-like status enums of cuDNN (CUDNN_STATUS_SUCCESS = 0) and NCCL
/// (ncclSuccess = 0).
template <typename E>
inline bool status_zero_ok(E s) {
  return static_cast<int>(s) == 0;
}
template <typename E>
inline std::string cudnn_status_string(E s) {
  return cudnn_error_string(static_cast<int>(s));
}
template <typename E>
inline std::string nccl_status_string(E s) {
  return nccl_error_string(static_cast<int>(s));
}

#endif  // RLHF_CUDA

/// RAII NVTX range (push in the constructor, pop in the destructor); a no-op without NVTX.
class NvtxRange {
 public:
  explicit NvtxRange(const char* name) noexcept {
#ifdef RLHF_HAVE_NVTX
    nvtxRangePushA(name);
#else
    (void)name;
#endif
  }
  ~NvtxRange() {
#ifdef RLHF_HAVE_NVTX
    nvtxRangePop();
#endif
  }
  NvtxRange(const NvtxRange&) = delete;
  NvtxRange& operator=(const NvtxRange&) = delete;
};

}  // namespace rlhf

/// An NVTX range over the rest of the enclosing scope, named after the function (llm.c).
#define NVTX_RANGE_FN() ::rlhf::NvtxRange rlhf_nvtx_range_(__func__)

#ifdef RLHF_CUDA
/// Checked CUDA runtime call: `CUDA_CHECK(cudaMemcpyAsync(...));` throws rlhf::Error on failure.
#define CUDA_CHECK(expr) RLHF_CHECK_GEN("CUDA", expr, ::rlhf::cuda_ok, ::rlhf::cuda_error_string)
/// Checked cuBLAS / cuBLASLt call.
#define CUBLAS_CHECK(expr) \
  RLHF_CHECK_GEN("cuBLAS", expr, ::rlhf::cublas_ok, ::rlhf::cublas_error_string)
/// Checked cuDNN call (include cudnn.h where you use it).
#define CUDNN_CHECK(expr) \
  RLHF_CHECK_GEN("cuDNN", expr, ::rlhf::status_zero_ok, ::rlhf::cudnn_status_string)
/// Checked NCCL call (include nccl.h where you use it). For a communicator created non-blocking,
/// ncclInProgress is an error here: our communicators are blocking.
#define NCCL_CHECK(expr) \
  RLHF_CHECK_GEN("NCCL", expr, ::rlhf::status_zero_ok, ::rlhf::nccl_status_string)
#endif
