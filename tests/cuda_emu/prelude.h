// The CUDA emulator's prelude: force-included (`-include`) into every .cu file that the emulated
// build compiles as host C++ (after tests/cuda_emu/cu2cpp has rewritten its launches). It makes
// the device-side dialect our kernels use mean something on the CPU:
//  - `__global__`/`__device__`/`__host__` are empty (the CUDA headers already do that for a host
//    compiler); `__shared__` is `static thread_local` (one block runs at a time per OS thread, so
//    a function-static is exactly per-block storage); `__launch_bounds__` is dropped;
//  - threadIdx, blockIdx, blockDim, gridDim read the running emulated thread's indices;
//  - __syncthreads, __syncwarp and the warp shuffles/votes are real barriers between the threads
//    of a block, which run as fibers (tests/cuda_emu/emu.h);
//  - the fast-math intrinsics map to the host libm (so results differ from a GPU's in the last
//    bits, as any two GPUs' `__expf` may).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "tests/cuda_emu/emu.h"

#undef __shared__
#define __shared__ static thread_local
#ifndef __launch_bounds__
#define __launch_bounds__(...)
#endif

#define threadIdx (::rlhf::emu::tl_index->thread_idx)
#define blockIdx (::rlhf::emu::tl_index->block_idx)
#define blockDim (::rlhf::emu::tl_index->block_dim)
#define gridDim (::rlhf::emu::tl_index->grid_dim)
#define warpSize 32

inline void __syncthreads() {
  ::rlhf::emu::syncthreads();
}
inline void __syncwarp(unsigned mask = 0xffffffffu) {
  ::rlhf::emu::syncwarp(mask);
}
inline void __threadfence() {}
inline void __threadfence_block() {}

template <typename T>
T __shfl_sync(unsigned mask, T v, int src_lane, int width = 32) {
  return ::rlhf::emu::shuffle(mask, v, ::rlhf::emu::ShuffleKind::kIndex, src_lane, width);
}
template <typename T>
T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
  return ::rlhf::emu::shuffle(mask, v, ::rlhf::emu::ShuffleKind::kXor, lane_mask, width);
}
template <typename T>
T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32) {
  return ::rlhf::emu::shuffle(mask, v, ::rlhf::emu::ShuffleKind::kDown, static_cast<int>(delta),
                              width);
}
template <typename T>
T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = 32) {
  return ::rlhf::emu::shuffle(mask, v, ::rlhf::emu::ShuffleKind::kUp, static_cast<int>(delta),
                              width);
}
inline unsigned __ballot_sync(unsigned mask, int pred) {
  return ::rlhf::emu::ballot(mask, pred != 0);
}
inline int __any_sync(unsigned mask, int pred) {
  return ::rlhf::emu::ballot(mask, pred != 0) != 0u;
}
inline int __all_sync(unsigned mask, int pred) {
  return ::rlhf::emu::ballot(mask, pred != 0) == ::rlhf::emu::ballot(mask, true);
}

// CUDA's device math overloads that the host libm lacks.
template <typename A, typename B>
inline std::common_type_t<A, B> min(A a, B b) {
  using R = std::common_type_t<A, B>;
  return static_cast<R>(b) < static_cast<R>(a) ? static_cast<R>(b) : static_cast<R>(a);
}
template <typename A, typename B>
inline std::common_type_t<A, B> max(A a, B b) {
  using R = std::common_type_t<A, B>;
  return static_cast<R>(a) < static_cast<R>(b) ? static_cast<R>(b) : static_cast<R>(a);
}
inline float rsqrtf(float x) {
  return 1.0f / std::sqrt(x);
}
inline double rsqrt(double x) {
  return 1.0 / std::sqrt(x);
}
inline float __expf(float x) {
  return std::exp(x);
}
inline float __logf(float x) {
  return std::log(x);
}
inline float __powf(float x, float y) {
  return std::pow(x, y);
}
inline float __fdividef(float x, float y) {
  return x / y;
}
inline float __frcp_rn(float x) {
  return 1.0f / x;
}
inline float __fsqrt_rn(float x) {
  return std::sqrt(x);
}
inline float __saturatef(float x) {
  return x < 0.0f ? 0.0f : x > 1.0f ? 1.0f : x;
}
template <typename T>
inline T __ldg(const T* p) {
  return *p;
}
