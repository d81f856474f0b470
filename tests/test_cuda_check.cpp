// The CUDA-side check macros and helpers, which work without a GPU: cuda_device_count() is 0
// without a device (or without CUDA), and CUDA_CHECK / CUBLAS_CHECK / NCCL_CHECK / CUDNN_CHECK
// throw rlhf::Error naming the library, the status, the call and the source location.
#include "core/cuda_check.h"

#include <string>

#include "core/device_memory.h"
#include "core/error.h"
#include "core/phase.h"
#include "model/ops/attention.h"
#include "parallel/runtime.h"
#include "tests/test_util.h"

#ifdef RLHF_NCCL
#include <nccl.h>
#endif
#ifdef RLHF_CUDNN
#include <cudnn.h>
#endif

using namespace rlhf;

#ifdef RLHF_CUDA
namespace {

// The message of the rlhf::Error thrown by f (empty if none).
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const rlhf::Error& e) {
    return e.what();
  }
  return {};
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

}  // namespace
#endif

TEST_CASE("cuda_device_count and the device summary never throw") {
  const int n = cuda_device_count();
  CHECK(n >= 0);
  CHECK(cuda_device_count() == n);  // stable, and a failed query leaves no error behind
  const std::string summary = cuda_device_summary();
  MESSAGE("CUDA devices: " << n << " (" << summary << ")");
  if (n == 0) CHECK(summary == "no CUDA device");
#ifndef RLHF_CUDA
  CHECK(n == 0);
#endif
  NVTX_RANGE_FN();  // a no-op without NVTX or a profiler
}

#ifdef RLHF_CUDA
TEST_CASE("CUDA_CHECK and CUBLAS_CHECK throw with the status, the call and the location") {
  CHECK_NOTHROW(CUDA_CHECK(cudaSuccess));
  const std::string e =
      error_of([] { CUDA_CHECK(static_cast<cudaError_t>(cudaErrorInvalidValue)); });
  INFO(e);
  CHECK(contains(e, "CUDA error"));
  CHECK(contains(e, "cudaErrorInvalidValue"));
  CHECK(contains(e, "static_cast<cudaError_t>(cudaErrorInvalidValue)"));
  CHECK(contains(e, "test_cuda_check.cpp:"));
  // The value is returned when it is a success.
  CHECK(CUDA_CHECK(cudaSuccess) == cudaSuccess);

  const std::string b =
      error_of([] { CUBLAS_CHECK(static_cast<cublasStatus_t>(CUBLAS_STATUS_NOT_SUPPORTED)); });
  INFO(b);
  CHECK(contains(b, "cuBLAS error"));
  CHECK(contains(b, "CUBLAS_STATUS_NOT_SUPPORTED"));
  CHECK(contains(b, "test_cuda_check.cpp:"));
}
#endif

#ifdef RLHF_NCCL
TEST_CASE("NCCL_CHECK throws with NCCL's error string") {
  CHECK_NOTHROW(NCCL_CHECK(ncclSuccess));
  const std::string e = error_of([] { NCCL_CHECK(static_cast<ncclResult_t>(ncclInvalidUsage)); });
  INFO(e);
  CHECK(contains(e, "NCCL error"));
  CHECK(contains(e, "(5)"));  // ncclInvalidUsage
  CHECK(contains(e, "ncclInvalidUsage"));
}
#endif

#ifdef RLHF_CUDNN
TEST_CASE("CUDNN_CHECK throws with cuDNN's error string") {
  CHECK_NOTHROW(CUDNN_CHECK(CUDNN_STATUS_SUCCESS));
  const std::string e =
      error_of([] { CUDNN_CHECK(static_cast<cudnnStatus_t>(CUDNN_STATUS_BAD_PARAM)); });
  INFO(e);
  CHECK(contains(e, "cuDNN error"));
  CHECK(contains(e, "CUDNN_STATUS_BAD_PARAM"));
}
#endif

#ifdef RLHF_CUDA
TEST_CASE("use_attention_implementation (--attn_implementation) sets the GPU attention") {
  // rlhf bench once skipped this call: its GPU training ran the flash kernels under "cudnn".
  const model::AttentionImpl before = model::attention_impl();
  parallel::use_attention_implementation("cudnn");
  CHECK(model::attention_impl() == model::AttentionImpl::kCudnn);
  parallel::use_attention_implementation("flash");
  CHECK(model::attention_impl() == model::AttentionImpl::kFlash);
  CHECK(parallel::training_pad_multiple(parallel::Device::kCuda) == 1);
  // auto: cuDNN where its fused attention runs on this GPU (never on the emulator), else flash;
  // padded micro-batches are rounded to kCudnnPadMultiple only then, and never on the CPU.
  parallel::use_attention_implementation("auto");
  const bool cudnn = model::attention_cudnn_runtime_version() > 0;
  CHECK(model::attention_impl() ==
        (cudnn ? model::AttentionImpl::kCudnn : model::AttentionImpl::kFlash));
  CHECK(parallel::training_pad_multiple(parallel::Device::kCuda) ==
        (cudnn ? parallel::kCudnnPadMultiple : 1));
  CHECK(parallel::training_pad_multiple(parallel::Device::kCpu) == 1);
  model::set_attention_impl(before);
}
#endif

#ifdef RLHF_CUDA
TEST_CASE("a failed device allocation names the phase, the bytes asked and free, and the flags") {
  if (cuda_device_count() == 0) {
    MESSAGE("skipped: no CUDA device");
    return;
  }
  set_phase("RL step 7, log-probs and training");
  // 64 TiB: more than any device (and the emulator's RLHF_CUDA_EMU_MEMORY_MB) holds.
  const int64_t n = int64_t(1) << 46;
  const std::string e = error_of([&] { DeviceArray<uint8_t> a(n, "activations"); });
  set_phase("");
  CHECK(contains(e,
                 "out of GPU memory during RL step 7, log-probs and training: activations "
                 "asked for 67108864.0 MiB, "));
  size_t free_b = 0, total_b = 0;
  REQUIRE(cudaMemGetInfo(&free_b, &total_b) == cudaSuccess);
  CHECK(contains(e, fmt::format("MiB free of {:.1f} MiB", double(total_b) / (1 << 20))));
  for (const char* flag :
       {"--micro_train_batch_size", "--micro_rollout_batch_size", "--vllm_gpu_memory_utilization",
        "--gradient_checkpointing", "--adam_offload"})
    CHECK(contains(e, flag));
  // The device is usable afterwards (the error was cleared).
  DeviceArray<float> ok(16, "small");
  CHECK(cudaGetLastError() == cudaSuccess);
}
#endif
