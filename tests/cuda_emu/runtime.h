// Internals shared by the emulator's runtime files (cudart.cpp, cublas.cpp, nccl.cpp, fiber.cpp):
// the registry of device and pinned allocations, streams, the sticky "last error".
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

namespace rlhf::emu {

/// What kind of memory an address belongs to.
enum class MemKind { kNone, kDevice, kPinned };

/// The kind of the allocation that holds the whole range [p, p + bytes) (bytes = 0: p itself, or
/// one past the end), kNone when no single live allocation does.
MemKind memory_kind(const void* p, size_t bytes = 0);

/// True when [p, p + bytes) lies inside one live device allocation.
inline bool in_device_memory(const void* p, size_t bytes) {
  return memory_kind(p, bytes) == MemKind::kDevice;
}

/// Sets the error that cudaGetLastError returns next (and cudaPeekAtLastError shows); returns e.
cudaError_t set_last_error(cudaError_t e);

/// True for 0 (the legacy default stream), cudaStreamPerThread and streams created and not yet
/// destroyed.
bool stream_valid(cudaStream_t s);

/// Runs op in the order of stream s: recorded into s's graph while s is being captured; queued on
/// s's worker thread for an asynchronous stream (streams.cpp); otherwise run now on the caller (a
/// synchronous stream; the legacy default stream, after every blocking stream has drained).
/// Failures of queued operations become the sticky error.
void submit(cudaStream_t s, std::function<void()> op);
/// True while this thread captures s.
bool capturing(cudaStream_t s);
/// Blocks until everything submitted to s so far has run (the legacy default stream: every
/// blocking stream).
void drain(cudaStream_t s);
/// Blocks until every stream has drained.
void drain_all();
/// Whether streams created from now on run asynchronously on a worker thread of their own:
/// RLHF_CUDA_EMU_ASYNC (default on; 0 = every stream synchronous).
bool async_streams();
void set_async_streams(bool on);

/// The sticky error of a failed asynchronous operation: recorded once (with its message, also
/// printed to stderr); from then on the runtime calls return cudaErrorLaunchFailure.
void set_sticky_error(const std::string& what);
cudaError_t sticky_error();
std::string sticky_message();
/// Forgets the sticky error (the emulator's own tests only: on a GPU it lasts as long as the
/// process).
void clear_sticky_error();

/// A synchronous (stream-less) call was made: while this thread is capturing a stream, that is
/// illegal (CUDA: cudaErrorStreamCaptureUnsupported, and the capture is invalidated). Returns
/// cudaSuccess when no capture is active.
cudaError_t check_not_capturing();

/// The dynamic shared memory limit of a kernel (48 KiB unless raised with cudaFuncSetAttribute).
size_t max_dynamic_smem(const void* func);

/// True when the threads of a block run last-to-first between barriers (a missing __syncthreads
/// then shows with the opposite ordering). Starts as RLHF_CUDA_EMU_SCHEDULE=reverse says.
bool schedule_reversed();
/// Sets the order for later launches (tests).
void set_schedule_reversed(bool reversed);

/// Kernel launches run so far in this process (for tests and the launch log).
void count_launch();
int64_t launch_count();

/// Throws std::runtime_error("CUDA emulator: " + what).
[[noreturn]] void fail(const std::string& what);

}  // namespace rlhf::emu
