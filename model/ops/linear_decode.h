// Linear layer for the few rows of a decode step (M = 1..64 tokens), HF weight convention (out,
// in), over a packed copy of the weight.
//
// Decode is bound by reading the weights: at M = 1 every weight is used for one multiply-add, and
// OpenBLAS's GEMV reached ≈8 GB/s on the 2-core development machine against its ≈20–30 GB/s of
// memory bandwidth. The engine packs each weight once per generate() (linear_decode_pack) and
// streams it from memory once per 64 input rows (linear_decode_packed_cpu), threads splitting the
// outputs.
#pragma once

#include <cstdint>

#include "model/ops/half.h"

namespace rlhf::model {

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
/// packed panel is loaded once per k and applied to up to 8 input rows held in registers; beyond
/// 8 rows, k goes in chunks that stay in L1 for every 8-row block, so the weights stream from
/// memory once per 64 rows (batch 1 is bound by memory bandwidth, larger batches by FMA
/// throughput).
///
/// Batch-invariant and exact in order: y[m, o] = fma(x[m, IC−1], w[o, IC−1], … fma(x[m, 1],
/// w[o, 1], x[m, 0]·w[o, 0]) …) + b[o] — one fused multiply-add per k in k order, whatever M, the
/// row's place in the batch or the thread count (the portable path computes the same sequence
/// with std::fma, bit for bit). y must not alias x. Throws rlhf::Error on a negative dimension.
void linear_decode_packed_cpu(float* y, const float* x, const float* wp, const float* b, int64_t M,
                              int64_t IC, int64_t OC);

/// linear_decode_pack with every weight rounded to bfloat16 (nearest, ties to even): the same
/// layout in half the bytes. wp: linear_decode_packed_size(IC, OC) bfloat16 values.
void linear_decode_pack_bf16(bfloat16* wp, const float* w, int64_t IC, int64_t OC);

/// linear_decode_packed_cpu over a bfloat16 packed weight (linear_decode_pack_bf16): each weight is
/// widened to fp32 in registers (exactly), then the same fused multiply-adds in the same order, so
/// the result is bit-identical to linear_decode_packed_cpu on fp32 weights holding the bf16 values,
/// and as batch-invariant. At batch 1, bound by reading the weights: half the bytes of fp32.
/// x, y, b fp32. Throws rlhf::Error on a negative dimension.
void linear_decode_packed_bf16_cpu(float* y, const float* x, const bfloat16* wp, const float* b,
                                   int64_t M, int64_t IC, int64_t OC);

}  // namespace rlhf::model
