// Owning handles for CUDA memory (device arrays, pinned host arrays, streams, events) and the
// device choice of a rank. Built with RLHF_CUDA only, except select_cuda_device's declaration
// comment applies to both builds (without CUDA it is absent).
#pragma once

#ifdef RLHF_CUDA

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>
#include <utility>

#include "core/cuda_check.h"

namespace rlhf {

/// The message of a failed device allocation: the phase (core/phase.h), `what`, the bytes asked,
/// the bytes free and total (cudaMemGetInfo), the CUDA error and the rank, then a "hint:" line
/// with the flags that reduce GPU memory (--micro_train_batch_size, --micro_rollout_batch_size,
/// --vllm_gpu_memory_utilization, --gradient_checkpointing, --adam_offload).
std::string device_oom_message(const char* what, size_t bytes, cudaError_t e);

/// n elements of T in device memory (cudaMalloc), uninitialised. Move-only. resize() discards the
/// contents (it reallocates only to grow). Throws rlhf::Error when out of memory, with
/// device_oom_message's text.
template <typename T>
class DeviceArray {
 public:
  DeviceArray() = default;
  explicit DeviceArray(int64_t n, const char* what = "device array") { resize(n, what); }
  ~DeviceArray() { reset(); }
  DeviceArray(DeviceArray&& o) noexcept
      : p_(std::exchange(o.p_, nullptr)),
        n_(std::exchange(o.n_, 0)),
        cap_(std::exchange(o.cap_, 0)) {}
  DeviceArray& operator=(DeviceArray&& o) noexcept {
    if (this != &o) {
      reset();
      p_ = std::exchange(o.p_, nullptr);
      n_ = std::exchange(o.n_, 0);
      cap_ = std::exchange(o.cap_, 0);
    }
    return *this;
  }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;

  /// Makes room for n elements (contents undefined afterwards).
  void resize(int64_t n, const char* what = "device array") {
    RLHF_CHECK(n >= 0, "{}: negative size {}", what, n);
    if (n > cap_) {
      reset();
      void* p = nullptr;
      const size_t bytes = static_cast<size_t>(n) * sizeof(T);
      const cudaError_t e = cudaMalloc(&p, bytes);
      if (e != cudaSuccess) {
        (void)cudaGetLastError();
        RLHF_FAIL("{}", device_oom_message(what, bytes, e));
      }
      p_ = static_cast<T*>(p);
      cap_ = n;
    }
    n_ = n;
  }
  void reset() noexcept {
    if (p_ != nullptr) (void)cudaFree(p_);
    p_ = nullptr;
    n_ = cap_ = 0;
  }
  T* get() { return p_; }
  const T* get() const { return p_; }
  int64_t size() const { return n_; }
  int64_t bytes() const { return cap_ * static_cast<int64_t>(sizeof(T)); }

 private:
  T* p_ = nullptr;
  int64_t n_ = 0, cap_ = 0;
};

/// n elements of T in pinned (page-locked) host memory (cudaMallocHost): the source and target of
/// asynchronous copies, and readable by kernels. Move-only; zero-initialised.
template <typename T>
class PinnedArray {
 public:
  PinnedArray() = default;
  explicit PinnedArray(int64_t n, const char* what = "pinned host array") {
    RLHF_CHECK(n >= 0, "{}: negative size {}", what, n);
    if (n == 0) return;
    void* p = nullptr;
    const size_t bytes = static_cast<size_t>(n) * sizeof(T);
    const cudaError_t e = cudaMallocHost(&p, bytes);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      RLHF_FAIL("{}: cudaMallocHost of {:.1f} MiB failed: {}", what,
                static_cast<double>(bytes) / (1 << 20), cuda_error_string(e));
    }
    p_ = static_cast<T*>(p);
    n_ = n;
    for (int64_t i = 0; i < n; ++i) p_[i] = T{};
  }
  ~PinnedArray() {
    if (p_ != nullptr) (void)cudaFreeHost(p_);
  }
  PinnedArray(PinnedArray&& o) noexcept
      : p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)) {}
  PinnedArray& operator=(PinnedArray&& o) noexcept {
    if (this != &o) {
      if (p_ != nullptr) (void)cudaFreeHost(p_);
      p_ = std::exchange(o.p_, nullptr);
      n_ = std::exchange(o.n_, 0);
    }
    return *this;
  }
  PinnedArray(const PinnedArray&) = delete;
  PinnedArray& operator=(const PinnedArray&) = delete;
  T* get() { return p_; }
  const T* get() const { return p_; }
  int64_t size() const { return n_; }
  T& operator[](int64_t i) { return p_[i]; }
  const T& operator[](int64_t i) const { return p_[i]; }

 private:
  T* p_ = nullptr;
  int64_t n_ = 0;
};

/// A non-blocking CUDA stream (cudaStreamNonBlocking), destroyed with the object.
class CudaStream {
 public:
  CudaStream() { CUDA_CHECK(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking)); }
  ~CudaStream() {
    if (s_ != nullptr) (void)cudaStreamDestroy(s_);
  }
  CudaStream(const CudaStream&) = delete;
  CudaStream& operator=(const CudaStream&) = delete;
  cudaStream_t get() const { return s_; }
  void sync() const { CUDA_CHECK(cudaStreamSynchronize(s_)); }

 private:
  cudaStream_t s_ = nullptr;
};

/// A CUDA event without timing (cudaEventDisableTiming): ordering between streams.
class CudaEvent {
 public:
  CudaEvent() { CUDA_CHECK(cudaEventCreateWithFlags(&e_, cudaEventDisableTiming)); }
  ~CudaEvent() {
    if (e_ != nullptr) (void)cudaEventDestroy(e_);
  }
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;
  cudaEvent_t get() const { return e_; }
  /// Records on `producer`, then makes `consumer` wait for it (no host blocking).
  void order(cudaStream_t producer, cudaStream_t consumer) {
    CUDA_CHECK(cudaEventRecord(e_, producer));
    CUDA_CHECK(cudaStreamWaitEvent(consumer, e_, 0));
  }
  void record(cudaStream_t s) { CUDA_CHECK(cudaEventRecord(e_, s)); }
  void sync() const { CUDA_CHECK(cudaEventSynchronize(e_)); }

 private:
  cudaEvent_t e_ = nullptr;
};

/// Selects the CUDA device of a rank: local_rank modulo the visible devices (one GPU per rank of
/// a node, as torchrun's LOCAL_RANK does). Returns the device index. Throws rlhf::Error when no
/// device is visible, with a hint about CUDA_VISIBLE_DEVICES.
int select_cuda_device(int local_rank);

}  // namespace rlhf

#endif  // RLHF_CUDA
