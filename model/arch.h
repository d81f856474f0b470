// The architecture table: what a decoder layer of each supported model family holds and computes
// beyond the Llama block (llama.cpp keeps one such table per architecture). The layout
// (model/layout.h) builds each layer's tensor list from it and the one decoder-layer routine per
// backend (model/decoder_layer.h) reads it, so an architecture feature is one row here plus one
// edit per backend routine.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/config.h"

namespace rlhf::model {

/// Whether a projection carries a bias.
enum class BiasRule {
  kNever,            ///< no bias (Qwen2's o_proj)
  kAlways,           ///< always (Qwen2's q/k/v)
  kIfAttentionBias,  ///< when config.json's `attention_bias` is true (Llama, Qwen3)
};

/// One row of the architecture table.
struct ArchInfo {
  std::string model_type;       ///< config.json `model_type`
  std::string causal_lm_class;  ///< Hugging Face class of the LM (config.json `architectures`)
  BiasRule qkv_bias = BiasRule::kIfAttentionBias;  ///< q_proj, k_proj, v_proj biases
  BiasRule o_bias = BiasRule::kIfAttentionBias;    ///< o_proj bias
  /// RMSNorm over each head of q and of k (weights self_attn.q_norm / k_norm, shape (D)), after
  /// the projection and before RoPE (Qwen3).
  bool qk_norm = false;
};

/// Every supported architecture: llama, mistral, qwen2, qwen3.
const std::vector<ArchInfo>& architectures();

/// The row of `model_type`; throws rlhf::Error naming it and the supported types.
const ArchInfo& arch_info(const std::string& model_type);

/// What a layer's MLP computes (model/mlp.h): the seam a mixture of experts plugs into.
enum class MlpKind {
  kDense,  ///< SwiGLU: down(silu(gate(x)) ⊙ up(x)) (Shazeer 2020), the Llama family's MLP
};

/// What one decoder layer computes for a config: its architecture row resolved against the config
/// (biases, QK-norm), the norm epsilon, the RoPE pairing, and the dimensions. Tensor-parallel
/// engines narrow H, Hkv and F to their rank's share.
struct LayerSpec {
  bool qkv_bias = false, o_bias = false, qk_norm = false;
  MlpKind mlp = MlpKind::kDense;
  double rms_norm_eps = 1e-5;
  RopeStyle rope_style = RopeStyle::kRotateHalf;
  int64_t C = 0;    ///< hidden_size
  int64_t F = 0;    ///< intermediate_size (this rank's columns under tensor parallelism)
  int64_t H = 0;    ///< attention heads (this rank's)
  int64_t Hkv = 0;  ///< key/value heads (this rank's)
  int64_t D = 0;    ///< head dim
  int64_t q_dim() const { return H * D; }
  int64_t kv_dim() const { return Hkv * D; }
};

/// The layer spec of `c` (throws rlhf::Error for an unsupported model_type).
LayerSpec layer_spec(const ModelConfig& c);

}  // namespace rlhf::model
