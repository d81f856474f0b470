#include "core/cuda_check.h"

#include "core/device_memory.h"

#include <fmt/format.h>

#ifdef RLHF_CUDNN
#include <cudnn.h>
#endif
#ifdef RLHF_NCCL
#include <nccl.h>
#endif

namespace rlhf {

int cuda_device_count() noexcept {
#ifdef RLHF_CUDA
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    // cudaErrorNoDevice, cudaErrorInsufficientDriver, ...: not sticky, but reset the last-error
    // slot so that a later CUDA_CHECK(cudaGetLastError()) does not report it.
    (void)cudaGetLastError();
    return 0;
  }
  return n;
#else
  return 0;
#endif
}

std::string cuda_device_summary() noexcept {
  try {
#ifdef RLHF_CUDA
    if (cuda_device_count() == 0) return "no CUDA device";
    int dev = 0, driver = 0, runtime = 0;
    cudaDeviceProp prop{};
    if (cudaGetDevice(&dev) != cudaSuccess || cudaGetDeviceProperties(&prop, dev) != cudaSuccess) {
      (void)cudaGetLastError();
      return "CUDA device (properties unavailable)";
    }
    (void)cudaDriverGetVersion(&driver);
    (void)cudaRuntimeGetVersion(&runtime);
    return fmt::format("{} (sm_{}{}, {:.1f} GiB), driver {}, runtime {}", prop.name, prop.major,
                       prop.minor, static_cast<double>(prop.totalGlobalMem) / (1 << 30), driver,
                       runtime);
#else
    return "no CUDA device";
#endif
  } catch (...) {
    return "no CUDA device";
  }
}

#ifdef RLHF_CUDA

int select_cuda_device(int local_rank) {
  const int n = cuda_device_count();
  RLHF_CHECK(n > 0,
             "no CUDA device is visible to this rank (local rank {})\nhint: check "
             "CUDA_VISIBLE_DEVICES and the job's GPU allocation (srun --gpus-per-task / "
             "--gres=gpu), or run with --device cpu",
             local_rank);
  const int dev = (local_rank < 0 ? 0 : local_rank) % n;
  CUDA_CHECK(cudaSetDevice(dev));
  return dev;
}

std::string cuda_error_string(cudaError_t e) {
  return fmt::format("{}: {}", cudaGetErrorName(e), cudaGetErrorString(e));
}

std::string cublas_error_string(cublasStatus_t s) {
  return fmt::format("{}: {}", cublasGetStatusName(s), cublasGetStatusString(s));
}

std::string cudnn_error_string(int status) {
#ifdef RLHF_CUDNN
  return fmt::format("{} ({})", cudnnGetErrorString(static_cast<cudnnStatus_t>(status)), status);
#else
  return fmt::format("status {}", status);
#endif
}

std::string nccl_error_string(int status) {
#ifdef RLHF_NCCL
  static const char* const kNames[] = {
      "ncclSuccess",         "ncclUnhandledCudaError", "ncclSystemError", "ncclInternalError",
      "ncclInvalidArgument", "ncclInvalidUsage",       "ncclRemoteError", "ncclInProgress"};
  const char* name = status >= 0 && status < 8 ? kNames[status] : "ncclResult";
  return fmt::format("{}: {} ({})", name, ncclGetErrorString(static_cast<ncclResult_t>(status)),
                     status);
#else
  return fmt::format("status {}", status);
#endif
}

#endif  // RLHF_CUDA

}  // namespace rlhf
