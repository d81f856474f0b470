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
#include <vector>

#include "model/activations.h"
#include "model/arch.h"
#include "model/layer_params.h"
#include "model/ops/cuda_types.h"
#include "model/ops/half.h"
#include "model/projections.h"

namespace rlhf::model {

struct LayerBf16;  // model/layer_bf16.h

// ---------------------------------------------------------------------------------------------
// CPU (T = float, or double for gradient checks)

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
  /// The pass's precision: nullptr = T everywhere; else (T = float only) this layer's bf16
  /// weights, and every projection computes in bf16 (model/layer_bf16.h) instead of `linear`.
  const LayerBf16* bf16 = nullptr;
};

/// The one call site of every projection's forward on the CPU (llama.cpp's build_lora_mm): y (N,
/// out) = x (N, in) · Wᵀ (+ b) with projection p's weight and bias from w, its dims from s
/// (model/projections.h), N = run.N, through run.linear. A per-projection extension (a LoRA
/// adapter's low-rank path, another GEMM precision) is an edit here and in
/// project_backward_cpu.
/// x16: in bf16 passes, x rounded to bf16 by the caller once for the projections that share it
/// (bf16_shared_input), else nullptr.
template <typename T>
void project_forward_cpu(Proj p, T* y, const T* x, const LayerParams<const T>& w,
                         const LayerSpec& s, const LayerRun<T>& run, const bfloat16* x16 = nullptr);

/// Backward of project_forward_cpu over run.N rows (linear_backward_cpu; in bf16 when run.bf16): dx
/// (N, in) = dy · W (+= with accumulate_dx; skipped when dx is nullptr), g.weight(p) += dyᵀ · x
/// (skipped when nullptr: a frozen weight), g.bias(p) += Σ_n dy (skipped when nullptr).
/// x16 as in project_forward_cpu.
template <typename T>
void project_backward_cpu(Proj p, T* dx, const T* dy, const T* x, const LayerParams<T>& g,
                          const LayerParams<const T>& w, const LayerSpec& s, const LayerRun<T>& run,
                          bool accumulate_dx, const bfloat16* x16 = nullptr);

/// In a bf16 pass with unpacked weights (run.bf16), x (run.N rows of `width`) rounded to bf16 into
/// buf, for the projections that read it (q/k/v: ln1; gate/up: ln2) to share; nullptr otherwise
/// (fp32 or double passes, the engine's packed decode).
template <typename T>
const bfloat16* bf16_shared_input(const LayerRun<T>& run, const T* x, int64_t width,
                                  std::vector<bfloat16>& buf);

/// One decoder layer forward (see the file comment). x_in, x_out: (N, C); x_out may alias x_in
/// (x_in is not read after x_mid is formed). Every LayerActs buffer the spec needs must be set.
/// w: this rank's weights (tensor parallel: its slices, and the o_proj bias on one rank only).
template <typename T>
void decoder_layer_forward_cpu(T* x_out, LayerActs<T>& a, const T* x_in,
                               const LayerParams<const T>& w, const LayerSpec& s,
                               const LayerRun<T>& run);

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

/// Activations of one layer's forward on the device (model/activations.h): bf16 values, fp32
/// statistics.
using LayerActsCuda = LayerActs<bf16, float>;

struct KvCacheWrite;  // model/ops/kv_cache.h

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
  /// Tensor parallel: sums an (N, C) partial output (bf16, device) over the group in place, in
  /// the order of the given stream (o_proj and down_proj outputs, before their residual adds).
  /// Empty: no group.
  std::function<void(bf16* y, int64_t n, cudaStream_t)> partial_sum;
  /// No backward follows (the generation engine): activations only a backward reads need not
  /// be written, which lets the MLP fuse its kernels at few rows (mlp_forward_cuda).
  bool forward_only = false;
  /// fused_qkv: the split also writes each token's k and v rows into this layer's paged cache
  /// (the generation engine; qkv_rope_split_cuda), so `attention` finds them there already.
  const KvCacheWrite* kv_cache = nullptr;
  /// The next layer's input RMSNorm weight (forward chains of one set of acts: the engine): the
  /// output residual add is fused with that norm (rmsnorm_residual_forward_cuda, bit for bit
  /// the two steps), which writes a.ln1 / a.rstd1 for the next call; that call then gets the
  /// same acts and input_normed = true. nullptr: the plain residual add.
  const bf16* next_input_norm = nullptr;
  /// a.ln1 / a.rstd1 already hold this layer's input norm (see next_input_norm).
  bool input_normed = false;
  cudaStream_t stream = nullptr;
};

/// The one call site of every projection's forward on the device (contract of
/// project_forward_cpu; linear_forward_cuda, bf16 in and out, fp32 accumulation).
void project_forward_cuda(Proj p, bf16* y, const bf16* x, const LayerParams<const bf16>& w,
                          const LayerSpec& s, int64_t N, cudaStream_t st);

/// Backward of project_forward_cuda (contract of project_backward_cpu; fp32 parameter
/// gradients, bf16 dx).
void project_backward_cuda(Proj p, bf16* dx, const bf16* dy, const bf16* x,
                           const LayerParams<float>& g, const LayerParams<const bf16>& w,
                           const LayerSpec& s, int64_t N, bool accumulate_dx, cudaStream_t st);

/// The q, k, v projections as one GEMM (run.fused_qkv, model::qkv_packed): y (N, q + 2·kv) =
/// x · [Wq; Wk; Wv]ᵀ (+ [bq; bk; bv]) with w.wq / w.bq the packed weight and bias; and its
/// backward into the packed gradients g.wq / g.bq (dx assigned). The fused counterpart of
/// project_*_cuda for kQ, kK, kV: an extension of those projections goes here too.
void project_qkv_forward_cuda(bf16* y, const bf16* x, const LayerParams<const bf16>& w,
                              const LayerSpec& s, int64_t N, cudaStream_t st);
void project_qkv_backward_cuda(bf16* dx, const bf16* dy, const bf16* x, const LayerParams<float>& g,
                               const LayerParams<const bf16>& w, const LayerSpec& s, int64_t N,
                               cudaStream_t st);

/// The decoder layer forward on the device: the CPU routine's contract, with the post-attention
/// residual add fused into the following RMSNorm (rmsnorm_residual_forward_cuda). x_out may alias
/// x_in only when it does not alias x_mid.
void decoder_layer_forward_cuda(bf16* x_out, LayerActsCuda& a, LayerScratchCuda& scratch,
                                const bf16* x_in, const LayerParams<const bf16>& w,
                                const LayerSpec& s, const LayerRunCuda& run);

/// Activation-gradient scratch of the device backward (bf16; model/activations.h).
using LayerGradScratchCuda = LayerGradScratch<bf16>;

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
