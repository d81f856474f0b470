// The MLP of a decoder layer behind one seam: what each MLP kind (LayerSpec::mlp, model/arch.h)
// adds to the layer's activation tables, and its forward and backward per backend. The decoder
// layer (model/decoder_layer*.cpp) calls only these, so a new kind (a mixture of experts) is its
// rows and routines here, one edit per backend, plus its projections in model/projections.cpp.
//   kDense (SwiGLU, Shazeer 2020): gate = x·Wgᵀ, up = x·Wuᵀ, h = silu(gate) ⊙ up, y = h·Wdᵀ.
#pragma once

#include <cstdint>
#include <vector>

#include "model/activations.h"
#include "model/decoder_layer.h"

namespace rlhf::model {

/// Appends the activations (forward) of s.mlp's MLP to a layer's table (layer_act_table).
void mlp_act_rows(std::vector<ActInfo>& table, const LayerSpec& s);

/// Appends the activation-gradient scratch of s.mlp's MLP to a layer's table (layer_grad_table).
void mlp_grad_rows(std::vector<ActInfo>& table, const LayerSpec& s);

/// y (N, C) = MLP(x) (assigned; no residual add, no tensor-parallel sum) for x (N, C), the
/// post-attention norm output; keeps its activations in a (N = run.N rows). Projections go
/// through project_forward_cpu.
template <typename T>
void mlp_forward_cpu(T* y, LayerActs<T>& a, const T* x, const LayerParams<const T>& w,
                     const LayerSpec& s, const LayerRun<T>& run);

/// Backward of mlp_forward_cpu over run.N rows (its projections in bf16 when run.bf16): dx (N, C)
/// assigned from dy (N, C), the activations a of the forward over x; parameter gradients += into g
/// (nullptr weights: frozen, skipped).
template <typename T>
void mlp_backward_cpu(T* dx, const LayerParams<T>& g, LayerGradScratch<T>& d, const LayerActs<T>& a,
                      const T* dy, const T* x, const LayerParams<const T>& w, const LayerSpec& s,
                      const LayerRun<T>& run);

#ifdef RLHF_CUDA
/// The device MLP (contract of mlp_forward_cpu; bf16 values, kernels on st). forward_only (no
/// backward follows: the generation engine): a.gate / a.up need not be kept, so up to
/// kSkinnyMaxRows rows run gate, up and SwiGLU as one kernel (linear_swiglu_skinny_cuda, the
/// same values as the three steps) and leave a.gate / a.up unwritten.
void mlp_forward_cuda(bf16* y, LayerActsCuda& a, const bf16* x, const LayerParams<const bf16>& w,
                      const LayerSpec& s, int64_t N, cudaStream_t st, bool forward_only = false);

/// Backward of mlp_forward_cuda (contract of mlp_backward_cpu; fp32 parameter gradients).
void mlp_backward_cuda(bf16* dx, const LayerParams<float>& g, LayerGradScratchCuda& d,
                       const LayerActsCuda& a, const bf16* dy, const bf16* x,
                       const LayerParams<const bf16>& w, const LayerSpec& s, int64_t N,
                       cudaStream_t st);
#endif

}  // namespace rlhf::model
