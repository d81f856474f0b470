// The CPU decoder layer's bf16 compute mode: what project_forward_cpu / project_backward_cpu
// (model/decoder_layer.h) run instead of the fp32 GEMMs when a pass's LayerRun carries a
// LayerBf16. The numerics are the CUDA backend's (model/decoder_layer_cuda.cpp, cuBLASLt with
// CUBLAS_COMPUTE_32F):
//   - every GEMM multiplies bf16 operands (weights converted once per unit visit, activations and
//     activation gradients rounded to nearest-even bf16 as they enter) with fp32 accumulation,
//     through oneDNN (model/ops/matmul_bf16.h);
//   - a GEMM's activation output (forward y, backward dx) is rounded once to bf16 and kept in the
//     layer's fp32 buffers (bf16 values in fp32 storage), as the GPU writes bf16 outputs; the
//     weight and bias gradients are fp32, accumulated into the fp32 gradient buffers;
//   - the ops between the GEMMs (RMSNorm, RoPE, attention's softmax, SwiGLU, residual adds, the
//     losses) compute in fp32 on those bf16-rounded values; the outputs that feed a GEMM (the
//     norms', attention's and SwiGLU's) are rounded once where the GEMM reads them;
//   - the other weights (norm weights, biases, the embedding rows) are read as bf16 values too
//     (Transformer rounds them), as the GPU's bf16 weight copies hold them.
// fp32 master weights, gradients and AdamW moments are untouched (the optimizer never sees bf16).
#pragma once

#include <cstdint>
#include <vector>

#include "model/bf16_twin.h"
#include "model/layer_params.h"
#include "model/layout.h"
#include "model/ops/half.h"

namespace rlhf::model {

/// One decoder layer's weights in bf16 for a pass: w views a bf16 copy of the layer's unit buffer
/// (same offsets as the fp32 unit, model/layout.h). packed: the projection weights are instead
/// linear_decode_pack_bf16 panels (the engine's batch-invariant decode; forward only).
struct LayerBf16 {
  LayerParams<const bfloat16> w;
  bool packed = false;
};

/// y (N, OC) = round_bf16(round_bf16(x) · Wᵀ + bias), W = b.w.weight(p) (OC, IC) bf16 (or its
/// packed panels when b.packed: linear_decode_packed_bf16_cpu, batch-invariant), x (N, IC) fp32,
/// bias (OC) fp32 or nullptr; fp32 accumulation. y is assigned (fp32 storage of bf16 values).
/// x16: round_bf16(x) when the caller has it (one input shared by several projections:
/// round_bf16_input), else nullptr (rounded here); the packed kernel ignores it.
/// Throws rlhf::Error without oneDNN (unpacked) or on a negative dimension.
void project_forward_bf16(const LayerBf16& b, Proj p, float* y, const float* x, const float* bias,
                          int64_t N, int64_t IC, int64_t OC, const bfloat16* x16 = nullptr);

/// Backward of project_forward_bf16 (unpacked only): with dy16 = round_bf16(dy) (N, OC) and
/// x16 = round_bf16(x) (N, IC),
///   dx (N, IC)  = round_bf16(dy16 · W [+ dx when accumulate_dx])  (skipped when dx is nullptr)
///   dw (OC, IC) += dy16ᵀ · x16 in fp32                                (skipped when nullptr)
///   db (OC)     += Σ_n dy in fp32                                     (skipped when nullptr)
/// x16: round_bf16(x) when the caller has it, else nullptr (rounded here when dw is needed).
/// Throws rlhf::Error without oneDNN or when b.packed.
void project_backward_bf16(const LayerBf16& b, Proj p, float* dx, float* dw, float* db,
                           const float* dy, const float* x, int64_t N, int64_t IC, int64_t OC,
                           bool accumulate_dx, const bfloat16* x16 = nullptr);

/// round_bf16(x) (n values) into buf, once for the several projections that read the same input
/// (q/k/v, gate/up) when b computes unpacked GEMMs; nullptr when b is nullptr or packed (nothing
/// to share). The pointer is valid until buf changes.
const bfloat16* round_bf16_input(const LayerBf16* b, const float* x, int64_t n,
                                 std::vector<bfloat16>& buf);

/// A bf16 copy of unit buffers, converted at most once per (source buffer, unit, pass): a pass
/// (ZeRO-3 gather, a sweep's several batches, checkpointing's recompute) that visits a unit again
/// reuses the copy. Call next_pass() whenever the source buffers may have changed (every forward
/// or backward entry point: the optimizer updates the fp32 weights between passes).
class Bf16UnitCache {
 public:
  /// The bf16 copy of `src` (n fp32 values, unit index `unit`): the provider's own bf16 twin when
  /// it has one (no conversion; valid while the unit is acquired), else converted now unless this
  /// pass already converted the same (src, unit). The pointer stays valid until the next call with
  /// another unit or next_pass().
  const bfloat16* get(const float* src, int unit, int64_t n);
  /// Forget the cached copy: the next get() converts. twins: the pass's provider as a Bf16Twins
  /// (nullptr: it has none), consulted first by get().
  void next_pass(const Bf16Twins* twins = nullptr) {
    src_ = nullptr;
    twins_ = twins;
  }
  /// Elements converted from fp32 since construction (twins found are not counted).
  int64_t converted() const { return converted_; }
  /// Bytes held by the copy.
  int64_t bytes() const { return int64_t(buf_.capacity() * sizeof(bfloat16)); }

 private:
  std::vector<bfloat16> buf_;
  const float* src_ = nullptr;
  int unit_ = -1;
  int64_t n_ = 0;
  const Bf16Twins* twins_ = nullptr;
  int64_t converted_ = 0;
};

/// The LayerBf16 of a decoder layer unit laid out as `u` whose bf16 copy is `base`.
inline LayerBf16 layer_bf16(const UnitLayout& u, const bfloat16* base) {
  return LayerBf16{LayerParams<const bfloat16>(u, base), false};
}

}  // namespace rlhf::model
