// Kernels that exercise the emulator itself (tests/cuda_emu/test_emu.cpp); defined in
// selftest_kernels.cu, which the emulated build compiles through cu2cpp like any .cu file.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace rlhf::emu::selftest {

/// out[0] = Σ in[0, n) by one block of `threads` threads: a strided loop, then a tree over dynamic
/// shared memory with __syncthreads.
void block_sum(float* out, const float* in, int n, int threads, cudaStream_t s);

/// One block of `threads`: out[t] = __shfl_xor_sync butterfly sum of (t + 1) over t's warp.
void warp_xor_sum(int* out, int threads, cudaStream_t s);

/// One warp: out[4·t + {0,1,2,3}] = shfl(lane 5), shfl_down(t, 3), shfl_up(t, 3),
/// shfl_xor(t, 1) with width 16 (lanes in segments of 16).
void shuffle_modes(int* out, cudaStream_t s);

/// One warp: out[t] = __ballot_sync(full, t % 3 == 0).
void ballot(unsigned* out, cudaStream_t s);

/// One block of `threads`: smem[t] = t + 1, *no barrier*, out[t] = smem[(t + 1) % threads].
/// The result depends on the order the threads run in (the race a missing __syncthreads makes).
void racy_neighbour(int* out, int threads, cudaStream_t s);

/// __syncthreads only in threads t < threads / 2: a deadlock.
void divergent_barrier(int* out, int threads, cudaStream_t s);

/// Lanes >= 16 return, the others shuffle with the full mask: undefined on a GPU.
void shuffle_after_exit(int* out, cudaStream_t s);

/// A kernel launched with an arbitrary configuration (grid, block, dynamic shared bytes).
void launch_config(int* out, unsigned grid, unsigned block, size_t smem, cudaStream_t s);

/// The function that launch_config launches (for cudaFuncSetAttribute).
const void* launch_config_kernel();

/// out[i] = grid-stride index sum check: out[i] = i for i < n with a capped grid.
void iota(int64_t* out, int64_t n, unsigned grid, cudaStream_t s);

}  // namespace rlhf::emu::selftest
