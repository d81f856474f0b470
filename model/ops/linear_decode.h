// Linear layer for the few rows of a decode step (M = 1..64 tokens), HF weight convention (out,
// in).
//
// Decode is bound by reading the weights: at M = 1 every weight is used for one multiply-add, and
// OpenBLAS's GEMV reaches ≈8 GB/s on this machine against ≈20 GB/s of memory bandwidth
// (DESIGN.md §9). This kernel streams each weight row once per call and applies it to every input
// row (register blocks of 4 input rows × 4 weight rows, AVX-512 FMA under __AVX512F__, a portable
// `omp simd` loop otherwise), with threads splitting the output features.
#pragma once

#include <cstdint>

namespace rlhf::model {

/// y = x · wᵀ + b (assigned).  y: (M, OC); x: (M, IC); w: (OC, IC); b: (OC) or nullptr.
///
/// Batch-invariant: y[m, o] is computed by the same sequence of operations (IC in 16-lane chunks,
/// one accumulator, then a fixed horizontal sum, then + b[o]) whatever M, the row's position in the
/// batch and the thread count — so a decode row gives bit-identical results alone or in any batch.
/// Any M ≥ 0 works; the kernel is meant for M ≤ 64 (above that, gemm_cpu wins; see
/// linear_rows_cpu). y must not alias x. Throws rlhf::Error if a dimension is negative.
template <typename T>
void linear_decode_cpu(T* y, const T* x, const T* w, const T* b, int64_t M, int64_t IC, int64_t OC);

/// Output rows per panel of a packed weight (linear_decode_pack): one 16-lane fp32 vector.
inline constexpr int64_t kDecodePanel = 16;

/// Floats of a weight (OC, IC) packed by linear_decode_pack: ⌈OC / 16⌉ · 16 · IC.
inline int64_t linear_decode_packed_size(int64_t IC, int64_t OC) {
  return (OC + kDecodePanel - 1) / kDecodePanel * kDecodePanel * IC;
}

/// Packs w (OC, IC), row-major (HF's (out, in)), for linear_decode_packed_cpu: panels of 16
/// output rows, k-major inside a panel, zeros past OC:
///   wp[(p·IC + k)·16 + l] = w[(16p + l)·IC + k]   (16p + l < OC), 0 otherwise.
/// wp: linear_decode_packed_size(IC, OC) floats. OpenMP over panels.
void linear_decode_pack(float* wp, const float* w, int64_t IC, int64_t OC);

/// y = x · wᵀ + b (assigned) from wp = linear_decode_pack(w): the decode kernel of the engine.
/// y: (M, OC); x: (M, IC); b: (OC) or nullptr. Outer-product form: each 16-output vector of a
/// packed panel is loaded once per k and applied to up to 8 input rows held in registers, so the
/// weights stream from memory once per 8 rows (batch 1 is bound by memory bandwidth, larger
/// batches by FMA throughput).
///
/// Batch-invariant and exact in order: y[m, o] = fma(x[m, IC−1], w[o, IC−1], … fma(x[m, 1],
/// w[o, 1], x[m, 0]·w[o, 0]) …) + b[o] — one fused multiply-add per k in k order, whatever M, the
/// row's place in the batch or the thread count (the portable path computes the same sequence
/// with std::fma, bit for bit). y must not alias x. Throws rlhf::Error on a negative dimension.
void linear_decode_packed_cpu(float* y, const float* x, const float* wp, const float* b, int64_t M,
                              int64_t IC, int64_t OC);

/// Rows at or below which linear_rows_cpu uses linear_decode_cpu rather than BLAS.
inline constexpr int64_t kDecodeKernelMaxRows = 64;

/// y = x · wᵀ + b, picking the kernel by M: linear_decode_cpu for M ≤ kDecodeKernelMaxRows (the
/// whole decode batch, batch-invariant), linear_forward_cpu (BLAS GEMM) above (prefill).
template <typename T>
void linear_rows_cpu(T* y, const T* x, const T* w, const T* b, int64_t M, int64_t IC, int64_t OC);

}  // namespace rlhf::model
