// The emulator's CUDA runtime: the cudart entry points the project calls, defined with the
// signatures of the real cuda_runtime_api.h, on host memory. One device (0). Every stream is
// synchronous: an operation is complete when its call returns.
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

// The operations a capture recorded, in stream order (a graph and its executable alike).
struct GraphOps {
  std::vector<std::function<void()>> ops;
};

struct Stream {
  unsigned flags = 0;
  GraphOps* capture = nullptr;  // while capturing
  bool invalidated = false;
};

struct Event {
  unsigned flags = 0;
  bool recorded = false;
  std::chrono::steady_clock::time_point t;
};

struct State {
  std::mutex mu;
  std::map<uintptr_t, Alloc> allocs;
  std::set<const void*> streams, events;
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
thread_local std::vector<Stream*> tl_capturing;  // streams this thread is capturing

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

bool stream_valid(cudaStream_t st) {
  if (st == nullptr || st == cudaStreamPerThread || st == cudaStreamLegacy) return true;
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  return s.streams.count(st) != 0;
}

bool defer(cudaStream_t st, std::function<void()> op) {
  if (tl_capturing.empty() || st == nullptr || st == cudaStreamPerThread || st == cudaStreamLegacy)
    return false;
  auto* s = reinterpret_cast<Stream*>(st);
  if (s->capture == nullptr) return false;
  s->capture->ops.push_back(std::move(op));
  return true;
}

cudaError_t check_not_capturing() {
  if (tl_capturing.empty()) return cudaSuccess;
  for (Stream* s : tl_capturing) s->invalidated = true;
  return cudaErrorStreamCaptureUnsupported;
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
cudaError_t cudaDeviceSynchronize(void) {
  if (const cudaError_t c = rlhf::emu::check_not_capturing(); c != cudaSuccess) return err(c);
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
  return rlhf::emu::error_name(e);
}
cudaError_t cudaGetLastError(void) {
  const cudaError_t e = rlhf::emu::tl_last_error;
  rlhf::emu::tl_last_error = cudaSuccess;
  return e;
}
cudaError_t cudaPeekAtLastError(void) {
  return rlhf::emu::tl_last_error;
}

// --- memory ----------------------------------------------------------------------------------

cudaError_t cudaMalloc(void** p, size_t bytes) {
  if (const cudaError_t c = rlhf::emu::check_not_capturing(); c != cudaSuccess) return err(c);
  return rlhf::emu::device_malloc(p, bytes);
}
cudaError_t cudaFree(void* p) {
  if (const cudaError_t c = rlhf::emu::check_not_capturing(); c != cudaSuccess) return err(c);
  return rlhf::emu::release(p, MemKind::kDevice);
}
cudaError_t cudaMallocAsync(void** p, size_t bytes, cudaStream_t stream) {
  if (!rlhf::emu::stream_valid(stream)) return err(cudaErrorInvalidResourceHandle);
  // Stream-ordered allocation inside a capture (a graph memory node) is not emulated.
  if (rlhf::emu::defer(stream, [] {})) return err(cudaErrorStreamCaptureUnsupported);
  return rlhf::emu::device_malloc(p, bytes);
}
cudaError_t cudaFreeAsync(void* p, cudaStream_t stream) {
  if (!rlhf::emu::stream_valid(stream)) return err(cudaErrorInvalidResourceHandle);
  if (rlhf::emu::defer(stream, [] {})) return err(cudaErrorStreamCaptureUnsupported);
  return rlhf::emu::release(p, MemKind::kDevice);
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
  if (count > 0) std::memmove(dst, src, count);
  return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t count, enum cudaMemcpyKind kind,
                            cudaStream_t stream) {
  if (!rlhf::emu::stream_valid(stream)) return err(cudaErrorInvalidResourceHandle);
  const cudaError_t e = rlhf::emu::check_copy(dst, src, count, kind);
  if (e != cudaSuccess) return err(e);
  auto op = [=] {
    if (count > 0) std::memmove(dst, src, count);
  };
  if (!rlhf::emu::defer(stream, op)) op();
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
  if (count == 0) return cudaSuccess;
  if (!rlhf::emu::in_device_memory(p, count)) return err(cudaErrorInvalidValue);
  std::memset(p, value, count);
  return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void* p, int value, size_t count, cudaStream_t stream) {
  if (!rlhf::emu::stream_valid(stream)) return err(cudaErrorInvalidResourceHandle);
  if (count == 0) return cudaSuccess;
  if (!rlhf::emu::in_device_memory(p, count)) return err(cudaErrorInvalidValue);
  auto op = [=] { std::memset(p, value, count); };
  if (!rlhf::emu::defer(stream, op)) op();
  return cudaSuccess;
}

// --- streams and events ----------------------------------------------------------------------

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* st, unsigned int flags) {
  if (st == nullptr) return err(cudaErrorInvalidValue);
  auto* s = new rlhf::emu::Stream{flags};
  auto& g = state();
  std::lock_guard<std::mutex> lock(g.mu);
  g.streams.insert(s);
  *st = reinterpret_cast<cudaStream_t>(s);
  return cudaSuccess;
}
cudaError_t cudaStreamCreate(cudaStream_t* st) {
  return cudaStreamCreateWithFlags(st, cudaStreamDefault);
}
cudaError_t cudaStreamDestroy(cudaStream_t st) {
  auto& g = state();
  std::lock_guard<std::mutex> lock(g.mu);
  if (st == nullptr || g.streams.erase(st) == 0) return err(cudaErrorInvalidResourceHandle);
  delete reinterpret_cast<rlhf::emu::Stream*>(st);
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t st) {
  if (!rlhf::emu::stream_valid(st)) return err(cudaErrorInvalidResourceHandle);
  return rlhf::emu::check_not_capturing() == cudaSuccess ? cudaSuccess
                                                         : err(cudaErrorStreamCaptureUnsupported);
}
cudaError_t cudaStreamQuery(cudaStream_t st) {
  return rlhf::emu::stream_valid(st) ? cudaSuccess : err(cudaErrorInvalidResourceHandle);
}

namespace {
rlhf::emu::Event* live_event(cudaEvent_t ev) {
  auto& g = state();
  std::lock_guard<std::mutex> lock(g.mu);
  return g.events.count(ev) != 0 ? reinterpret_cast<rlhf::emu::Event*>(ev) : nullptr;
}
}  // namespace

cudaError_t cudaStreamWaitEvent(cudaStream_t st, cudaEvent_t ev, unsigned int) {
  if (!rlhf::emu::stream_valid(st) || live_event(ev) == nullptr)
    return err(cudaErrorInvalidResourceHandle);
  return cudaSuccess;
}
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* ev, unsigned int flags) {
  if (ev == nullptr) return err(cudaErrorInvalidValue);
  auto* e = new rlhf::emu::Event{};
  e->flags = flags;
  auto& g = state();
  std::lock_guard<std::mutex> lock(g.mu);
  g.events.insert(e);
  *ev = reinterpret_cast<cudaEvent_t>(e);
  return cudaSuccess;
}
cudaError_t cudaEventCreate(cudaEvent_t* ev) {
  return cudaEventCreateWithFlags(ev, cudaEventDefault);
}
cudaError_t cudaEventDestroy(cudaEvent_t ev) {
  auto& g = state();
  std::lock_guard<std::mutex> lock(g.mu);
  if (g.events.erase(ev) == 0) return err(cudaErrorInvalidResourceHandle);
  delete reinterpret_cast<rlhf::emu::Event*>(ev);
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t ev, cudaStream_t st) {
  rlhf::emu::Event* e = live_event(ev);
  if (e == nullptr || !rlhf::emu::stream_valid(st)) return err(cudaErrorInvalidResourceHandle);
  auto op = [e] {
    e->recorded = true;
    e->t = std::chrono::steady_clock::now();
  };
  if (!rlhf::emu::defer(st, op)) op();
  return cudaSuccess;
}
cudaError_t cudaEventQuery(cudaEvent_t ev) {
  return live_event(ev) != nullptr ? cudaSuccess : err(cudaErrorInvalidResourceHandle);
}
cudaError_t cudaEventSynchronize(cudaEvent_t ev) {
  if (const cudaError_t c = rlhf::emu::check_not_capturing(); c != cudaSuccess) return err(c);
  return live_event(ev) != nullptr ? cudaSuccess : err(cudaErrorInvalidResourceHandle);
}
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  rlhf::emu::Event *a = live_event(start), *b = live_event(end);
  if (ms == nullptr) return err(cudaErrorInvalidValue);
  if (a == nullptr || b == nullptr || (a->flags & cudaEventDisableTiming) != 0 ||
      (b->flags & cudaEventDisableTiming) != 0)
    return err(cudaErrorInvalidResourceHandle);
  if (!a->recorded || !b->recorded) return err(cudaErrorInvalidResourceHandle);
  *ms = std::chrono::duration<float, std::milli>(b->t - a->t).count();
  return cudaSuccess;
}
cudaError_t cudaLaunchHostFunc(cudaStream_t st, cudaHostFn_t fn, void* user_data) {
  if (!rlhf::emu::stream_valid(st)) return err(cudaErrorInvalidResourceHandle);
  if (fn == nullptr) return err(cudaErrorInvalidValue);
  if (!rlhf::emu::defer(st, [fn, user_data] { fn(user_data); })) fn(user_data);
  return cudaSuccess;
}
cudaError_t cudaStreamIsCapturing(cudaStream_t st, enum cudaStreamCaptureStatus* status) {
  if (!rlhf::emu::stream_valid(st)) return err(cudaErrorInvalidResourceHandle);
  const bool on = st != nullptr && st != cudaStreamPerThread && st != cudaStreamLegacy &&
                  reinterpret_cast<rlhf::emu::Stream*>(st)->capture != nullptr;
  if (status != nullptr) *status = on ? cudaStreamCaptureStatusActive : cudaStreamCaptureStatusNone;
  return cudaSuccess;
}

// --- graphs (stream capture) -----------------------------------------------------------------

cudaError_t cudaStreamBeginCapture(cudaStream_t st, enum cudaStreamCaptureMode) {
  if (!rlhf::emu::stream_valid(st)) return err(cudaErrorInvalidResourceHandle);
  if (st == nullptr || st == cudaStreamPerThread || st == cudaStreamLegacy)
    return err(cudaErrorStreamCaptureUnsupported);  // the legacy default stream cannot capture
  auto* s = reinterpret_cast<rlhf::emu::Stream*>(st);
  if (s->capture != nullptr) return err(cudaErrorIllegalState);
  s->capture = new rlhf::emu::GraphOps();
  s->invalidated = false;
  rlhf::emu::tl_capturing.push_back(s);
  return cudaSuccess;
}
cudaError_t cudaStreamEndCapture(cudaStream_t st, cudaGraph_t* graph) {
  if (!rlhf::emu::stream_valid(st) || st == nullptr) return err(cudaErrorInvalidResourceHandle);
  auto* s = reinterpret_cast<rlhf::emu::Stream*>(st);
  if (s->capture == nullptr) return err(cudaErrorIllegalState);
  auto& caps = rlhf::emu::tl_capturing;
  caps.erase(std::remove(caps.begin(), caps.end(), s), caps.end());
  std::unique_ptr<rlhf::emu::GraphOps> ops(s->capture);
  s->capture = nullptr;
  if (graph != nullptr) *graph = nullptr;
  if (s->invalidated) return err(cudaErrorStreamCaptureInvalidated);
  if (graph == nullptr) return err(cudaErrorInvalidValue);
  *graph = reinterpret_cast<cudaGraph_t>(ops.release());
  return cudaSuccess;
}
cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph, unsigned long long) {
  if (exec == nullptr || graph == nullptr) return err(cudaErrorInvalidValue);
  *exec = reinterpret_cast<cudaGraphExec_t>(
      new rlhf::emu::GraphOps(*reinterpret_cast<rlhf::emu::GraphOps*>(graph)));
  return cudaSuccess;
}
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t st) {
  if (exec == nullptr) return err(cudaErrorInvalidValue);
  if (!rlhf::emu::stream_valid(st)) return err(cudaErrorInvalidResourceHandle);
  auto* g = reinterpret_cast<rlhf::emu::GraphOps*>(exec);
  auto run = [g] {
    for (auto& op : g->ops) op();
  };
  if (!rlhf::emu::defer(st, run)) run();
  return cudaSuccess;
}
cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  delete reinterpret_cast<rlhf::emu::GraphOps*>(graph);
  return cudaSuccess;
}
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
  delete reinterpret_cast<rlhf::emu::GraphOps*>(exec);
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
