// The CUDA emulator: runs our own CUDA kernels, cuBLAS(Lt) GEMMs and the CUDA runtime calls we use
// on the CPU, so that the CUDA backend is tested in CI on machines without a GPU (see README.md
// here for what it checks and what it cannot).
//
// Execution model. A kernel launch runs the whole grid as one operation of its stream (on the
// stream's worker thread, streams.cpp; on the caller for the legacy default stream). Blocks run
// one after the other; the threads of one block are fibers on that OS thread, each on its own
// stack, scheduled round-robin. A fiber runs until it reaches a barrier (__syncthreads, or a
// warp-level operation: shuffle, vote, __syncwarp), then the next fiber runs; a barrier opens when
// every live thread of its block (or warp) has arrived. So shared memory, barriers and warp
// shuffles have their CUDA meaning, and a barrier that not every thread reaches is reported as a
// deadlock instead of hanging.
//
// This header is the interface between the kernels (through prelude.h and the launches that
// cu2cpp writes) and the runtime (fiber.cpp, cudart.cpp).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <tuple>
#include <type_traits>
#include <utility>

namespace rlhf::emu {

/// The indices a running emulated thread sees as threadIdx, blockIdx, blockDim, gridDim.
struct ThreadIndex {
  uint3 thread_idx{};
  uint3 block_idx{};
  dim3 block_dim;
  dim3 grid_dim;
};

/// The running emulated thread's indices (nullptr outside a kernel). One per OS thread: the
/// scheduler points it at the fiber it resumes.
inline thread_local const ThreadIndex* tl_index = nullptr;

// --- device side -----------------------------------------------------------------------------

/// __syncthreads(): waits until every live thread of the block has arrived.
void syncthreads();
/// __syncwarp(mask): waits until every lane of the warp has arrived. Only full-warp masks.
void syncwarp(unsigned mask);

enum class ShuffleKind { kIndex, kXor, kDown, kUp };
/// The raw 8-byte exchange behind the __shfl_*_sync family: every lane of the warp must take part
/// (mask = all lanes of the warp); returns the value of the source lane, computed from `arg` as
/// the PTX shfl.sync modes do within segments of `width` lanes.
uint64_t shuffle_raw(unsigned mask, uint64_t value, ShuffleKind kind, int arg, int width);
/// Bit i set when lane i passed pred = true. Every lane in mask must take part.
unsigned ballot(unsigned mask, bool pred);

/// __shfl_*_sync for any trivially copyable type of up to 8 bytes.
template <typename T>
T shuffle(unsigned mask, T v, ShuffleKind kind, int arg, int width) {
  static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= 8, "shuffle: 8 bytes at most");
  uint64_t raw = 0;
  std::memcpy(&raw, &v, sizeof(T));
  raw = shuffle_raw(mask, raw, kind, arg, width);
  T out;
  std::memcpy(&out, &raw, sizeof(T));
  return out;
}

/// Base of the launch's dynamic shared memory (`extern __shared__ T name[]`, rewritten by
/// cu2cpp). Filled with 0xFF bytes (NaN) before each block, so a read of an element no thread
/// wrote shows up.
void* dynamic_shared();

// --- host side: launches ---------------------------------------------------------------------

/// One kernel launch's configuration, as `kernel<<<grid, block, smem, stream>>>` gives it.
struct LaunchConfig {
  const char* name = "";
  const void* func = nullptr;
  dim3 grid, block;
  size_t smem = 0;
  cudaStream_t stream = nullptr;
};

/// True when the device code may dereference p: inside (or one past the end of) a live device
/// allocation, or in pinned/registered host memory. nullptr is accepted (kernels test for it).
bool device_accessible(const void* p);

/// Validates cfg as the CUDA runtime does (block at most 1024 threads and 1024 × 1024 × 64, grid
/// within 2^31−1 × 65535 × 65535, dynamic shared memory within the function's limit, a live
/// stream); on failure sets the error cudaGetLastError returns and returns false. Then checks
/// that every pointer argument is device-accessible (throws std::runtime_error naming the kernel
/// and the argument otherwise: on a GPU it is an illegal address).
bool begin_launch(const LaunchConfig& cfg, const void* const* pointer_args, int n_pointer_args);
/// Submits the launch `op` in stream order (runtime.h's submit: recorded while capturing, queued
/// on an asynchronous stream, else run now). Always returns true.
bool defer_launch(cudaStream_t stream, std::function<void()> op);

/// Runs the grid: body(arg) once per thread of every block. Throws std::runtime_error on a
/// barrier deadlock or misuse, naming the kernel and the block.
void run_grid(const LaunchConfig& cfg, void (*body)(void*), void* arg);

/// The object `kernel<<<grid, block, smem, stream>>>` becomes: calling it with the kernel's
/// arguments converts them to the parameter types (as a launch does) and runs the grid.
template <typename... P>
class Launcher {
 public:
  Launcher(const char* name, void (*kernel)(P...), dim3 grid, dim3 block, size_t smem,
           cudaStream_t stream)
      : kernel_(kernel) {
    cfg_.name = name;
    cfg_.func = reinterpret_cast<const void*>(kernel);
    cfg_.grid = grid;
    cfg_.block = block;
    cfg_.smem = smem;
    cfg_.stream = stream;
  }

  template <typename... A>
  void operator()(A&&... a) const {
    static_assert(sizeof...(A) == sizeof...(P), "kernel launched with the wrong argument count");
    Call call{kernel_, std::tuple<std::decay_t<P>...>(static_cast<P>(std::forward<A>(a))...)};
    const void* ptrs[sizeof...(P) + 1] = {};
    int n = 0;
    std::apply([&](const auto&... x) { (collect(ptrs, n, x), ...); }, call.args);
    if (!begin_launch(cfg_, ptrs, n)) return;
    // The launch runs in stream order with a copy of its arguments: on an asynchronous stream's
    // worker, or at every cudaGraphLaunch when recorded in a capture (a graph kernel node).
    auto shared = std::make_shared<Call>(std::move(call));
    const LaunchConfig cfg = cfg_;
    defer_launch(cfg_.stream, [cfg, shared] { run_grid(cfg, &Launcher::body, shared.get()); });
  }

 private:
  struct Call {
    void (*kernel)(P...);
    std::tuple<std::decay_t<P>...> args;
  };
  static void body(void* p) {
    auto* c = static_cast<Call*>(p);
    std::apply(c->kernel, c->args);
  }
  template <typename X>
  static void collect(const void** ptrs, int& n, const X& x) {
    if constexpr (std::is_pointer_v<X> && !std::is_function_v<std::remove_pointer_t<X>>)
      ptrs[n++] = static_cast<const void*>(x);
  }
  void (*kernel_)(P...);
  LaunchConfig cfg_;
};

/// `kernel<<<grid, block, smem, stream>>>` as cu2cpp rewrites it.
template <typename... P>
Launcher<P...> make_launcher(const char* name, void (*kernel)(P...), dim3 grid, dim3 block,
                             size_t smem = 0, cudaStream_t stream = nullptr) {
  return Launcher<P...>(name, kernel, grid, block, smem, stream);
}

}  // namespace rlhf::emu
