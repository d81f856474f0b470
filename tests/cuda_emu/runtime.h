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

/// Stream capture (CUDA graphs): when `s` is capturing, appends `op` to its graph and returns
/// true; otherwise returns false and the caller runs the operation now.
bool defer(cudaStream_t s, std::function<void()> op);

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
