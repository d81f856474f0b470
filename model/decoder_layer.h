// The decoder layer, written once per backend. Training forward and backward
// (model/transformer*.cpp), the generation engine's prefill and its batched decode
// (rollout/engine*.cpp) all run these routines; they differ only in how attention reads its keys
// and values (a causal pass over (B, T), or a KV cache), which linear kernel runs the rows, and
// whether partial outputs are summed over a tensor-parallel group — each passed in by the caller.
//
// Per layer (pre-norm; Touvron et al. 2023, with the architecture's options from model/arch.h):
//   a = RMSNorm(x)·w_in;  q, k, v = a·W{q,k,v}ᵀ (+ b{q,k,v})
//   [QK-norm, Qwen3: q, k = RMSNorm over each head's D values · q_norm, k_norm]
//   q, k = RoPE(q, k);  x_mid = x + Attn(q, k, v)·Woᵀ (+ bo)
//   m = RMSNorm(x_mid)·w_post;  x_out = x_mid + (silu(m·Wgᵀ) ⊙ m·Wuᵀ)·Wdᵀ
#pragma once

#include <cstdint>
#include <functional>

#include "model/arch.h"
#include "model/layer_params.h"
#include "model/ops/cuda_types.h"

namespace rlhf::model {

// ---------------------------------------------------------------------------------------------
// CPU (T = float, or double for gradient checks)

/// Activations of one layer's forward over N rows, caller-owned (shapes with the spec's H, Hkv,
/// D, F; row-major). Training keeps them for backward; inference reuses one set per layer.
template <typename T>
struct LayerActs {
  T* ln1 = nullptr;    ///< (N, C) input RMSNorm output
  T* rstd1 = nullptr;  ///< (N)
  /// (N, H·D), (N, Hkv·D), (N, Hkv·D): what attention reads (after QK-norm and RoPE).
  T *q = nullptr, *k = nullptr, *v = nullptr;
  /// QK-norm with backward: the projections before the norm, (N, H·D) and (N, Hkv·D). nullptr
  /// (inference): the norm runs in place on q and k.
  T *q_raw = nullptr, *k_raw = nullptr;
  T *q_rstd = nullptr, *k_rstd = nullptr;          ///< QK-norm: (N·H), (N·Hkv) statistics
  T* atty = nullptr;                               ///< (N, H·D) attention output
  T* x_mid = nullptr;                              ///< (N, C) residual stream after attention
  T* ln2 = nullptr;                                ///< (N, C) post-attention RMSNorm output
  T* rstd2 = nullptr;                              ///< (N)
  T *gate = nullptr, *up = nullptr, *h = nullptr;  ///< (N, F)
};

/// y = x·wᵀ + b (assigned) for M rows: linear_forward_cpu (BLAS: training and engine prefill), or
/// linear_decode_packed_cpu (batch-invariant decode; w is then the packed weight).
template <typename T>
using LinearFn = void (*)(T* y, const T* x, const T* w, const T* b, int64_t M, int64_t IC,
                          int64_t OC);

/// How one forward pass runs the layer: what differs between training, prefill and decode.
template <typename T>
struct LayerRun {
  int64_t N = 0;                                     ///< rows (tokens)
  const int32_t* pos = nullptr;                      ///< (N) RoPE positions
  const T *rope_cos = nullptr, *rope_sin = nullptr;  ///< (max_pos, D/2) tables
  LinearFn<T> linear = nullptr;
  /// atty (N, H·D) = attention of the rows' q over their keys and values; k, v are these rows'
  /// (a cache-backed attention writes them to its cache first).
  std::function<void(T* atty, const T* q, const T* k, const T* v)> attention;
  /// Tensor parallel: sums an (N, C) partial output over the group, in place (o_proj and
  /// down_proj outputs, before their residual adds). Empty: no group.
  std::function<void(T* y, int64_t n)> partial_sum;
};

/// One decoder layer forward (see the file comment). x_in, x_out: (N, C); x_out may alias x_in
/// (x_in is not read after x_mid is formed). Every LayerActs buffer the spec needs must be set.
/// w: this rank's weights (tensor parallel: its slices, and the o_proj bias on one rank only).
template <typename T>
void decoder_layer_forward_cpu(T* x_out, LayerActs<T>& a, const T* x_in,
                               const LayerParams<const T>& w, const LayerSpec& s,
                               const LayerRun<T>& run);

/// Activation-gradient scratch of one layer's backward over N rows (shapes as LayerActs).
template <typename T>
struct LayerGradScratch {
  T* dln = nullptr;                                   ///< (N, C)
  T* datty = nullptr;                                 ///< (N, H·D)
  T *dq = nullptr, *dk = nullptr, *dv = nullptr;      ///< (N, H·D), (N, Hkv·D), (N, Hkv·D)
  T *dq_raw = nullptr, *dk_raw = nullptr;             ///< QK-norm: gradients before the norm
  T *dh = nullptr, *dgate = nullptr, *dup = nullptr;  ///< (N, F)
};

/// How the backward pass runs the attention: dq, dk, dv (assigned) from datty, for the q, k, v
/// and whatever the forward saved (training: the (B, H, T, T) probabilities).
template <typename T>
using AttentionBackwardFn =
    std::function<void(T* dq, T* dk, T* dv, const T* datty, const T* q, const T* k, const T* v)>;

/// Backward of decoder_layer_forward_cpu for the activations `a` of a forward over x_in (rows,
/// positions, tables and linear as in `run`; BLAS GEMMs). dres: in d x_out (N, C), out d x_in
/// (the residual stream: assigned through the chain, += by the norms as llm.c's contract says).
/// Parameter gradients accumulate (+=) into g.
template <typename T>
void decoder_layer_backward_cpu(T* dres, const LayerParams<T>& g, LayerGradScratch<T>& d,
                                const LayerActs<T>& a, const T* x_in, const LayerParams<const T>& w,
                                const LayerSpec& s, const LayerRun<T>& run,
                                const AttentionBackwardFn<T>& attention);

#ifdef RLHF_CUDA
// ---------------------------------------------------------------------------------------------
// CUDA (bf16 activations and weights, fp32 statistics and parameter gradients)

/// Activations of one layer's forward on the device (shapes as LayerActs; bf16 unless noted).
struct LayerActsCuda {
  bf16* ln1 = nullptr;
  float* rstd1 = nullptr;
  bf16 *q = nullptr, *k = nullptr, *v = nullptr;
  bf16 *q_raw = nullptr, *k_raw = nullptr;     ///< QK-norm with backward (else in place)
  float *q_rstd = nullptr, *k_rstd = nullptr;  ///< QK-norm statistics
  bf16* atty = nullptr;
  bf16* x_mid = nullptr;
  bf16* ln2 = nullptr;
  float* rstd2 = nullptr;
  bf16 *gate = nullptr, *up = nullptr, *h = nullptr;
};

/// Scratch shared by every layer of a pass: proj (N, C), the o_proj/down_proj output before its
/// residual add; qkv (N, (H + 2·Hkv)·D), the packed q/k/v GEMM output (fused_qkv only; in
/// backward it holds the packed gradient).
struct LayerScratchCuda {
  bf16* proj = nullptr;
  bf16* qkv = nullptr;
};

/// How one forward pass runs the layer on the device (see LayerRun).
struct LayerRunCuda {
  int64_t N = 0;
  const int32_t* pos = nullptr;  ///< (N) device positions
  const float *rope_cos = nullptr, *rope_sin = nullptr;
  /// One GEMM for q/k/v over the packed weights with RoPE in the split (qkv_rope_split_cuda):
  /// only when the layout packs them (model::qkv_packed) and the layer has no QK-norm.
  bool fused_qkv = false;
  std::function<void(bf16* atty, const bf16* q, const bf16* k, const bf16* v, cudaStream_t)>
      attention;
  cudaStream_t stream = nullptr;
};

/// The decoder layer forward on the device: the CPU routine's contract, with the post-attention
/// residual add fused into the following RMSNorm (rmsnorm_residual_forward_cuda). x_out may alias
/// x_in only when it does not alias x_mid.
void decoder_layer_forward_cuda(bf16* x_out, LayerActsCuda& a, LayerScratchCuda& scratch,
                                const bf16* x_in, const LayerParams<const bf16>& w,
                                const LayerSpec& s, const LayerRunCuda& run);

/// Activation-gradient scratch of the device backward (bf16; shapes as LayerGradScratch).
struct LayerGradScratchCuda {
  bf16 *dln = nullptr, *datty = nullptr, *dq = nullptr, *dk = nullptr, *dv = nullptr;
  bf16 *dq_raw = nullptr, *dk_raw = nullptr;
  bf16 *dh = nullptr, *dgate = nullptr, *dup = nullptr;
};

/// Backward of decoder_layer_forward_cuda (contract of decoder_layer_backward_cpu; fp32 parameter
/// gradients +=, bf16 activation gradients). attention: dq, dk, dv from datty (the flash
/// backward with the forward's lse and output).
void decoder_layer_backward_cuda(
    bf16* dres, const LayerParams<float>& g, LayerGradScratchCuda& d, LayerScratchCuda& scratch,
    const LayerActsCuda& a, const bf16* x_in, const LayerParams<const bf16>& w, const LayerSpec& s,
    const LayerRunCuda& run,
    const std::function<void(bf16* dq, bf16* dk, bf16* dv, const bf16* datty, cudaStream_t)>&
        attention);
#endif

}  // namespace rlhf::model
