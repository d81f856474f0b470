// The linear projections of a decoder layer as one table: names (ours and Hugging Face's), (in,
// out) dimensions, bias, tensor-parallel split. The parameter layout (model/layout.cpp), the layer
// views (model/layer_params.h), the parameter counts (model/config.cpp, model/flops.cpp), the
// decoder layer's one linear call site per backend (model/decoder_layer*.cpp: project_forward_* /
// project_backward_*) and the engines' packing and tensor-parallel slicing (rollout/engine_cpu.cpp,
// engine_cuda_tp.cpp) all read it, so a new projection, a bias on an existing one or a
// per-projection extension (LoRA, another GEMM precision) is one row here plus one edit per backend
// call site. llama.cpp's per-tensor tables (LLM_TENSOR_*) and its build_lora_mm seam are the model.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "model/arch.h"

namespace rlhf::model {

/// How a tensor-parallel group splits a projection's weight (Shoeybi et al. 2019, Megatron-LM
/// §3): by output rows (each rank computes a slice of the outputs; bias sliced the same way), by
/// input columns (each rank computes a partial sum of all outputs, summed over the group; the
/// bias is added once), or not at all.
enum class TpSplit { kColumn, kRow, kNone };

/// Which projection of a decoder layer (the order of LayerParams' named fields).
enum class Proj : int { kQ, kK, kV, kO, kGate, kUp, kDown };
inline constexpr int kNumProj = 7;

/// The part of the layer a projection belongs to.
enum class ProjBlock { kAttention, kMlp };

/// The fixed facts of a projection, independent of the config.
struct ProjInfo {
  Proj id;
  const char* name;         ///< "q_proj"
  const char* weight_name;  ///< HF tensor suffix of the (out, in) weight, "self_attn.q_proj.weight"
  const char* bias_name;    ///< HF tensor suffix of the (out) bias, "self_attn.q_proj.bias"
  ProjBlock block;
  TpSplit split;
  /// One of the q/k/v projections: their weights lie back to back in the layout, then their
  /// biases, so the three are one GEMM when the alignment keeps them adjacent (qkv_packed).
  bool fused_qkv;
};

/// Every projection a decoder layer can have, in Proj order (llama, mistral, qwen2, qwen3 have
/// all seven; the dense MLP is gate/up/down).
inline constexpr std::array<ProjInfo, kNumProj> kProjections = {{
    {Proj::kQ, "q_proj", "self_attn.q_proj.weight", "self_attn.q_proj.bias", ProjBlock::kAttention,
     TpSplit::kColumn, true},
    {Proj::kK, "k_proj", "self_attn.k_proj.weight", "self_attn.k_proj.bias", ProjBlock::kAttention,
     TpSplit::kColumn, true},
    {Proj::kV, "v_proj", "self_attn.v_proj.weight", "self_attn.v_proj.bias", ProjBlock::kAttention,
     TpSplit::kColumn, true},
    {Proj::kO, "o_proj", "self_attn.o_proj.weight", "self_attn.o_proj.bias", ProjBlock::kAttention,
     TpSplit::kRow, false},
    {Proj::kGate, "gate_proj", "mlp.gate_proj.weight", "mlp.gate_proj.bias", ProjBlock::kMlp,
     TpSplit::kColumn, false},
    {Proj::kUp, "up_proj", "mlp.up_proj.weight", "mlp.up_proj.bias", ProjBlock::kMlp,
     TpSplit::kColumn, false},
    {Proj::kDown, "down_proj", "mlp.down_proj.weight", "mlp.down_proj.bias", ProjBlock::kMlp,
     TpSplit::kRow, false},
}};

/// The fixed facts of projection p.
inline const ProjInfo& proj_info(Proj p) {
  return kProjections[static_cast<size_t>(p)];
}

/// One projection of a layer resolved against its LayerSpec: y (N, out) = x (N, in) · Wᵀ (+ b).
/// The dimensions are the spec's (under tensor parallelism, a rank's narrowed spec gives its
/// slice: out for kColumn, in for kRow).
struct Projection {
  const ProjInfo* info = nullptr;
  int64_t in = 0, out = 0;
  bool bias = false;
  Proj id() const { return info->id; }
  TpSplit split() const { return info->split; }
};

/// Projection p of a layer with spec s.
Projection projection(const LayerSpec& s, Proj p);

/// The projections a layer with spec s has, in Proj order (attention, then the MLP kind's).
std::vector<Projection> layer_projections(const LayerSpec& s);

/// Σ in·out over the layer's projections (weights only, no biases): the matmul parameters of one
/// layer (model/flops.h).
int64_t layer_matmul_params(const LayerSpec& s);

}  // namespace rlhf::model
