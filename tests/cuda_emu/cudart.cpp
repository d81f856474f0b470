// The emulator's CUDA runtime: the cudart entry points the project calls, defined with the
// signatures of the real cuda_runtime_api.h, on host memory: devices, memory, copies, errors and
// kernel attributes (streams, events and graphs are in streams.cpp).
//
// Stricter than a real GPU where that finds bugs: device memory is filled with 0xFF bytes (NaN)
// when allocated; a cudaMemcpy/cudaMemset range must lie inside one live allocation of the kind
// its direction says (so an overrun or a host pointer where a device one belongs is an error,
// not silent corruption); kernel pointer arguments must be device-accessible; a destroyed stream
// or event is an invalid handle.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "tests/cuda_emu/emu.h"
#include "tests/cuda_emu/runtime.h"

namespace rlhf::emu {
namespace {

constexpr size_t kDefaultSmem = 48 << 10;
constexpr size_t kMaxSmemOptin = 227 << 10;  // H100
constexpr size_t kAlign = 256;

struct Alloc {
  size_t bytes = 0;
  MemKind kind = MemKind::kNone;
  bool owned = true;  // false for cudaHostRegister'ed ranges
};

struct State {
  std::mutex mu;
  std::map<uintptr_t, Alloc> allocs;
  std::map<const void*, size_t> smem_limits;
  size_t device_used = 0;
  size_t device_capacity = 0;
  int64_t launches = 0;
};

State& state() {
  static State* s = [] {
    auto* st = new State();  // never destroyed: may be used until the very end of main
    const char* mb = std::getenv("RLHF_CUDA_EMU_MEMORY_MB");
    st->device_capacity = (mb != nullptr ? std::strtoull(mb, nullptr, 10) : 16384) << 20;
    return st;
  }();
  return *s;
}

thread_local cudaError_t tl_last_error = cudaSuccess;

// Records a failing return for cudaGetLastError too (the runtime does the same).
cudaError_t err(cudaError_t e) {
  return set_last_error(e);
}

size_t round_up(size_t n, size_t a) {
  return (n + a - 1) / a * a;
}

void* register_alloc(size_t bytes, MemKind kind) {
  void* p = std::aligned_alloc(kind == MemKind::kDevice ? kAlign : 4096,
                               round_up(bytes == 0 ? 1 : bytes, 4096));
  if (p == nullptr) return nullptr;
  if (kind == MemKind::kDevice) std::memset(p, 0xFF, bytes);
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  s.allocs[reinterpret_cast<uintptr_t>(p)] = Alloc{bytes, kind, true};
  return p;
}

cudaError_t device_malloc(void** p, size_t bytes) {
  if (p == nullptr) return err(cudaErrorInvalidValue);
  *p = nullptr;
  if (bytes == 0) return cudaSuccess;
  {
    State& s = state();
    std::lock_guard<std::mutex> lock(s.mu);
    if (s.device_used + bytes > s.device_capacity) return err(cudaErrorMemoryAllocation);
    s.device_used += bytes;
  }
  *p = register_alloc(bytes, MemKind::kDevice);
  return *p != nullptr ? cudaSuccess : err(cudaErrorMemoryAllocation);
}

cudaError_t release(void* p, MemKind kind) {
  if (p == nullptr) return cudaSuccess;
  State& s = state();
  std::unique_lock<std::mutex> lock(s.mu);
  auto it = s.allocs.find(reinterpret_cast<uintptr_t>(p));
  if (it == s.allocs.end() || it->second.kind != kind || !it->second.owned)
    return err(cudaErrorInvalidValue);
  if (kind == MemKind::kDevice) s.device_used -= it->second.bytes;
  s.allocs.erase(it);
  lock.unlock();
  std::free(p);
  return cudaSuccess;
}

// The copy direction's checks: which side must be device memory, which must not be.
cudaError_t check_copy(void* dst, const void* src, size_t count, cudaMemcpyKind kind) {
  if (count == 0) return cudaSuccess;
  if (dst == nullptr || src == nullptr) return cudaErrorInvalidValue;
  const MemKind dk = memory_kind(dst, count), sk = memory_kind(src, count);
  const bool d_dev = dk == MemKind::kDevice, s_dev = sk == MemKind::kDevice;
  // A host pointer that starts inside a device allocation but runs past it is an overrun.
  const bool d_partial = !d_dev && memory_kind(dst) == MemKind::kDevice;
  const bool s_partial = !s_dev && memory_kind(src) == MemKind::kDevice;
  if (d_partial || s_partial) return cudaErrorInvalidValue;
  switch (kind) {
    case cudaMemcpyHostToDevice:
      return d_dev && !s_dev ? cudaSuccess : cudaErrorInvalidValue;
    case cudaMemcpyDeviceToHost:
      return s_dev && !d_dev ? cudaSuccess : cudaErrorInvalidValue;
    case cudaMemcpyDeviceToDevice:
      return d_dev && s_dev ? cudaSuccess : cudaErrorInvalidValue;
    case cudaMemcpyHostToHost:
      return !d_dev && !s_dev ? cudaSuccess : cudaErrorInvalidValue;
    case cudaMemcpyDefault:
      return cudaSuccess;
  }
  return cudaErrorInvalidMemcpyDirection;
}

const char* error_name(cudaError_t e) {
  switch (e) {
    case cudaSuccess:
      return "cudaSuccess";
    case cudaErrorInvalidValue:
      return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation:
      return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration:
      return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidDevice:
      return "cudaErrorInvalidDevice";
    case cudaErrorInvalidResourceHandle:
      return "cudaErrorInvalidResourceHandle";
    case cudaErrorInvalidMemcpyDirection:
      return "cudaErrorInvalidMemcpyDirection";
    case cudaErrorNotReady:
      return "cudaErrorNotReady";
    case cudaErrorIllegalAddress:
      return "cudaErrorIllegalAddress";
    case cudaErrorNoDevice:
      return "cudaErrorNoDevice";
    case cudaErrorNotSupported:
      return "cudaErrorNotSupported";
    case cudaErrorLaunchFailure:
      return "cudaErrorLaunchFailure";
    case cudaErrorStreamCaptureUnsupported:
      return "cudaErrorStreamCaptureUnsupported";
    case cudaErrorStreamCaptureInvalidated:
      return "cudaErrorStreamCaptureInvalidated";
    case cudaErrorIllegalState:
      return "cudaErrorIllegalState";
    default:
      return "cudaErrorUnknown";
  }
}

}  // namespace

MemKind memory_kind(const void* p, size_t bytes) {
  if (p == nullptr) return MemKind::kNone;
  const auto a = reinterpret_cast<uintptr_t>(p);
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  auto it = s.allocs.upper_bound(a);
  if (it == s.allocs.begin()) return MemKind::kNone;
  --it;
  const uintptr_t end = it->first + it->second.bytes;
  if (a > end || (bytes > 0 && a + bytes > end) || (a == end && bytes > 0)) return MemKind::kNone;
  return it->second.kind;
}

cudaError_t set_last_error(cudaError_t e) {
  if (e != cudaSuccess) tl_last_error = e;
  return e;
}

size_t max_dynamic_smem(const void* func) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  auto it = s.smem_limits.find(func);
  return it == s.smem_limits.end() ? kDefaultSmem : it->second;
}

namespace {
std::atomic<bool>& schedule_flag() {
  static std::atomic<bool> reversed{[] {
    const char* v = std::getenv("RLHF_CUDA_EMU_SCHEDULE");
    return v != nullptr && std::string(v) == "reverse";
  }()};
  return reversed;
}
}  // namespace

bool schedule_reversed() {
  return schedule_flag().load();
}
void set_schedule_reversed(bool reversed) {
  schedule_flag().store(reversed);
}

void count_launch() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  ++s.launches;
}

int64_t launch_count() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  return s.launches;
}

void fail(const std::string& what) {
  throw std::runtime_error("CUDA emulator: " + what);
}

bool device_accessible(const void* p) {
  return p == nullptr || memory_kind(p) != MemKind::kNone;
}

bool begin_launch(const LaunchConfig& cfg, const void* const* pointer_args, int n_pointer_args) {
  const dim3 b = cfg.block, g = cfg.grid;
  const uint64_t threads = uint64_t{b.x} * b.y * b.z;
  if (threads == 0 || threads > 1024 || b.x > 1024 || b.y > 1024 || b.z > 64 || g.x == 0 ||
      g.y == 0 || g.z == 0 || g.x > 0x7fffffffu || g.y > 65535 || g.z > 65535) {
    set_last_error(cudaErrorInvalidConfiguration);
    return false;
  }
  if (cfg.smem > max_dynamic_smem(cfg.func)) {
    set_last_error(cudaErrorInvalidValue);
    return false;
  }
  if (!stream_valid(cfg.stream)) {
    set_last_error(cudaErrorInvalidResourceHandle);
    return false;
  }
  for (int i = 0; i < n_pointer_args; ++i)
    if (!device_accessible(pointer_args[i]))
      fail(std::string("kernel ") + cfg.name + ": pointer argument " + std::to_string(i) +
           " is neither device memory nor pinned host memory (an illegal address on a GPU)");
  return true;
}

}  // namespace rlhf::emu

using rlhf::emu::err;
using rlhf::emu::MemKind;
using rlhf::emu::state;

// --- device management -----------------------------------------------------------------------

namespace rlhf::emu {
namespace {
// RLHF_CUDA_EMU_DEVICES devices (default 1) that share one memory: enough for tests that give
// every rank of a node its own device.
int device_count() {
  static const int n = [] {
    const char* v = std::getenv("RLHF_CUDA_EMU_DEVICES");
    const int k = v != nullptr ? std::atoi(v) : 1;
    return k >= 1 ? k : 1;
  }();
  return n;
}
thread_local int tl_device = 0;
}  // namespace
}  // namespace rlhf::emu

cudaError_t cudaGetDeviceCount(int* count) {
  if (count == nullptr) return err(cudaErrorInvalidValue);
  *count = rlhf::emu::device_count();
  return cudaSuccess;
}
cudaError_t cudaGetDevice(int* device) {
  if (device == nullptr) return err(cudaErrorInvalidValue);
  *device = rlhf::emu::tl_device;
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int device) {
  if (device < 0 || device >= rlhf::emu::device_count()) return err(cudaErrorInvalidDevice);
  rlhf::emu::tl_device = device;
  return cudaSuccess;
}
cudaError_t cudaSetDeviceFlags(unsigned int) {
  return cudaSuccess;
}
cudaError_t cudaDriverGetVersion(int* v) {
  if (v == nullptr) return err(cudaErrorInvalidValue);
  *v = CUDART_VERSION;
  return cudaSuccess;
}
cudaError_t cudaRuntimeGetVersion(int* v) {
  if (v == nullptr) return err(cudaErrorInvalidValue);
  *v = CUDART_VERSION;
  return cudaSuccess;
}
cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp* prop, int device) {
  if (prop == nullptr) return err(cudaErrorInvalidValue);
  if (device < 0 || device >= rlhf::emu::device_count()) return err(cudaErrorInvalidDevice);
  std::memset(prop, 0, sizeof(*prop));
  std::strncpy(prop->name, "CUDA emulator (CPU)", sizeof(prop->name) - 1);
  prop->totalGlobalMem = state().device_capacity;
  prop->sharedMemPerBlock = 48 << 10;
  prop->sharedMemPerBlockOptin = 227 << 10;
  prop->sharedMemPerMultiprocessor = 228 << 10;
  prop->regsPerBlock = 65536;
  prop->warpSize = 32;
  prop->maxThreadsPerBlock = 1024;
  prop->maxThreadsDim[0] = 1024;
  prop->maxThreadsDim[1] = 1024;
  prop->maxThreadsDim[2] = 64;
  prop->maxGridSize[0] = 0x7fffffff;
  prop->maxGridSize[1] = 65535;
  prop->maxGridSize[2] = 65535;
  prop->major = 9;
  prop->minor = 0;
  prop->multiProcessorCount = 132;
  prop->l2CacheSize = 50 << 20;
  prop->maxThreadsPerMultiProcessor = 2048;
  prop->unifiedAddressing = 1;
  return cudaSuccess;
}
cudaError_t cudaDeviceGetAttribute(int* value, enum cudaDeviceAttr attr, int device) {
  if (value == nullptr) return err(cudaErrorInvalidValue);
  if (device < 0 || device >= rlhf::emu::device_count()) return err(cudaErrorInvalidDevice);
  switch (attr) {
    case cudaDevAttrMultiProcessorCount:
      *value = 132;
      return cudaSuccess;
    case cudaDevAttrComputeCapabilityMajor:
      *value = 9;
      return cudaSuccess;
    case cudaDevAttrComputeCapabilityMinor:
      *value = 0;
      return cudaSuccess;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin:
      *value = 227 << 10;
      return cudaSuccess;
    default:
      *value = 0;
      return err(cudaErrorNotSupported);
  }
}
cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total) {
  auto& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  if (free_bytes != nullptr) *free_bytes = s.device_capacity - s.device_used;
  if (total != nullptr) *total = s.device_capacity;
  return cudaSuccess;
}

// --- errors ----------------------------------------------------------------------------------

const char* cudaGetErrorName(cudaError_t e) {
  return rlhf::emu::error_name(e);
}
const char* cudaGetErrorString(cudaError_t e) {
  if (e == cudaErrorLaunchFailure && rlhf::emu::sticky_error() != cudaSuccess) {
    thread_local std::string text;
    text = "unspecified launch failure (" + rlhf::emu::sticky_message() + ")";
    return text.c_str();
  }
  return rlhf::emu::error_name(e);
}
cudaError_t cudaGetLastError(void) {
  if (rlhf::emu::sticky_error() != cudaSuccess) return rlhf::emu::sticky_error();
  const cudaError_t e = rlhf::emu::tl_last_error;
  rlhf::emu::tl_last_error = cudaSuccess;
  return e;
}
cudaError_t cudaPeekAtLastError(void) {
  if (rlhf::emu::sticky_error() != cudaSuccess) return rlhf::emu::sticky_error();
  return rlhf::emu::tl_last_error;
}

// --- memory ----------------------------------------------------------------------------------

cudaError_t cudaMalloc(void** p, size_t bytes) {
  if (const cudaError_t c = rlhf::emu::check_not_capturing(); c != cudaSuccess) return err(c);
  return rlhf::emu::device_malloc(p, bytes);
}
cudaError_t cudaFree(void* p) {
  if (const cudaError_t c = rlhf::emu::check_not_capturing(); c != cudaSuccess) return err(c);
  rlhf::emu::drain_all();  // cudaFree synchronises the device
  return rlhf::emu::release(p, MemKind::kDevice);
}
cudaError_t cudaMallocAsync(void** p, size_t bytes, cudaStream_t stream) {
  if (!rlhf::emu::stream_valid(stream)) return err(cudaErrorInvalidResourceHandle);
  // Stream-ordered allocation inside a capture (a graph memory node) is not emulated.
  if (rlhf::emu::capturing(stream)) return err(cudaErrorStreamCaptureUnsupported);
  return rlhf::emu::device_malloc(p, bytes);  // usable by everything submitted from now on
}
cudaError_t cudaFreeAsync(void* p, cudaStream_t stream) {
  if (!rlhf::emu::stream_valid(stream)) return err(cudaErrorInvalidResourceHandle);
  if (rlhf::emu::capturing(stream)) return err(cudaErrorStreamCaptureUnsupported);
  if (p == nullptr) return cudaSuccess;
  if (rlhf::emu::memory_kind(p) != MemKind::kDevice) return err(cudaErrorInvalidValue);
  rlhf::emu::submit(stream, [p] { (void)rlhf::emu::release(p, MemKind::kDevice); });
  return cudaSuccess;
}
cudaError_t cudaMallocHost(void** p, size_t bytes) {
  if (const cudaError_t c = rlhf::emu::check_not_capturing(); c != cudaSuccess) return err(c);
  if (p == nullptr) return err(cudaErrorInvalidValue);
  *p = rlhf::emu::register_alloc(bytes, MemKind::kPinned);
  return *p != nullptr ? cudaSuccess : err(cudaErrorMemoryAllocation);
}
cudaError_t cudaHostAlloc(void** p, size_t bytes, unsigned int) {
  return cudaMallocHost(p, bytes);
}
cudaError_t cudaFreeHost(void* p) {
  if (const cudaError_t c = rlhf::emu::check_not_capturing(); c != cudaSuccess) return err(c);
  return rlhf::emu::release(p, MemKind::kPinned);
}
cudaError_t cudaHostRegister(void* p, size_t bytes, unsigned int) {
  if (p == nullptr || bytes == 0) return err(cudaErrorInvalidValue);
  if (rlhf::emu::memory_kind(p) != MemKind::kNone) return err(cudaErrorHostMemoryAlreadyRegistered);
  auto& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  s.allocs[reinterpret_cast<uintptr_t>(p)] = rlhf::emu::Alloc{bytes, MemKind::kPinned, false};
  return cudaSuccess;
}
cudaError_t cudaHostUnregister(void* p) {
  auto& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  auto it = s.allocs.find(reinterpret_cast<uintptr_t>(p));
  if (it == s.allocs.end() || it->second.owned) return err(cudaErrorHostMemoryNotRegistered);
  s.allocs.erase(it);
  return cudaSuccess;
}
cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes* a, const void* p) {
  if (a == nullptr) return err(cudaErrorInvalidValue);
  std::memset(a, 0, sizeof(*a));
  switch (rlhf::emu::memory_kind(p)) {
    case MemKind::kDevice:
      a->type = cudaMemoryTypeDevice;
      a->devicePointer = const_cast<void*>(p);
      break;
    case MemKind::kPinned:
      a->type = cudaMemoryTypeHost;
      a->hostPointer = const_cast<void*>(p);
      a->devicePointer = const_cast<void*>(p);
      break;
    case MemKind::kNone:
      a->type = cudaMemoryTypeUnregistered;
      a->hostPointer = const_cast<void*>(p);
      a->device = -2;
      break;
  }
  return cudaSuccess;
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t count, enum cudaMemcpyKind kind) {
  if (const cudaError_t c = rlhf::emu::check_not_capturing(); c != cudaSuccess) return err(c);
  const cudaError_t e = rlhf::emu::check_copy(dst, src, count, kind);
  if (e != cudaSuccess) return err(e);
  if (rlhf::emu::sticky_error() != cudaSuccess) return err(rlhf::emu::sticky_error());
  // The legacy default stream: after every blocking stream's work (not non-blocking streams').
  rlhf::emu::submit(nullptr, [=] {
    if (count > 0) std::memmove(dst, src, count);
  });
  return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t count, enum cudaMemcpyKind kind,
                            cudaStream_t stream) {
  if (!rlhf::emu::stream_valid(stream)) return err(cudaErrorInvalidResourceHandle);
  const cudaError_t e = rlhf::emu::check_copy(dst, src, count, kind);
  if (e != cudaSuccess) return err(e);
  if (rlhf::emu::sticky_error() != cudaSuccess) return err(rlhf::emu::sticky_error());
  if (count == 0) return cudaSuccess;
  const MemKind sk = rlhf::emu::memory_kind(src, count), dk = rlhf::emu::memory_kind(dst, count);
  if (sk == MemKind::kNone && !rlhf::emu::capturing(stream)) {
    // From pageable host memory the runtime stages the source before returning: the caller may
    // reuse it at once; the device side is written in stream order.
    auto staged = std::make_shared<std::vector<char>>(static_cast<const char*>(src),
                                                      static_cast<const char*>(src) + count);
    rlhf::emu::submit(stream, [dst, staged] { std::memcpy(dst, staged->data(), staged->size()); });
    return cudaSuccess;
  }
  rlhf::emu::submit(stream, [=] { std::memmove(dst, src, count); });
  // Into pageable host memory the call returns once the copy is done.
  if (dk == MemKind::kNone && !rlhf::emu::capturing(stream)) rlhf::emu::drain(stream);
  return cudaSuccess;
}
cudaError_t cudaMemcpy2DAsync(void* dst, size_t dpitch, const void* src, size_t spitch,
                              size_t width, size_t height, enum cudaMemcpyKind kind,
                              cudaStream_t stream) {
  if (!rlhf::emu::stream_valid(stream)) return err(cudaErrorInvalidResourceHandle);
  if (width > dpitch || width > spitch) return err(cudaErrorInvalidPitchValue);
  for (size_t r = 0; r < height; ++r) {
    const cudaError_t e =
        cudaMemcpyAsync(static_cast<char*>(dst) + r * dpitch,
                        static_cast<const char*>(src) + r * spitch, width, kind, stream);
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}
cudaError_t cudaMemset(void* p, int value, size_t count) {
  if (const cudaError_t c = rlhf::emu::check_not_capturing(); c != cudaSuccess) return err(c);
  if (rlhf::emu::sticky_error() != cudaSuccess) return err(rlhf::emu::sticky_error());
  if (count == 0) return cudaSuccess;
  if (!rlhf::emu::in_device_memory(p, count)) return err(cudaErrorInvalidValue);
  rlhf::emu::submit(nullptr, [=] { std::memset(p, value, count); });
  return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void* p, int value, size_t count, cudaStream_t stream) {
  if (!rlhf::emu::stream_valid(stream)) return err(cudaErrorInvalidResourceHandle);
  if (rlhf::emu::sticky_error() != cudaSuccess) return err(rlhf::emu::sticky_error());
  if (count == 0) return cudaSuccess;
  if (!rlhf::emu::in_device_memory(p, count)) return err(cudaErrorInvalidValue);
  rlhf::emu::submit(stream, [=] { std::memset(p, value, count); });
  return cudaSuccess;
}

// --- kernels ---------------------------------------------------------------------------------

cudaError_t cudaFuncSetAttribute(const void* func, enum cudaFuncAttribute attr, int value) {
  if (func == nullptr) return err(cudaErrorInvalidDeviceFunction);
  if (attr == cudaFuncAttributeMaxDynamicSharedMemorySize) {
    if (value < 0 || static_cast<size_t>(value) > rlhf::emu::kMaxSmemOptin)
      return err(cudaErrorInvalidValue);
    auto& g = state();
    std::lock_guard<std::mutex> lock(g.mu);
    g.smem_limits[func] = static_cast<size_t>(value);
  }
  return cudaSuccess;
}
