#include "model/arch.h"

#include <fmt/format.h>

#include "core/error.h"

namespace rlhf::model {

const std::vector<ArchInfo>& architectures() {
  // Sources: transformers' modeling_llama.py (bias = attention_bias on all four projections),
  // modeling_mistral.py (no biases; ModelConfig::validate refuses attention_bias),
  // modeling_qwen2.py (q/k/v bias = True, o_proj bias = False), modeling_qwen3.py (bias =
  // attention_bias; q_norm/k_norm = Qwen3RMSNorm(head_dim)).
  static const std::vector<ArchInfo> table = {
      {"llama", "LlamaForCausalLM", BiasRule::kIfAttentionBias, BiasRule::kIfAttentionBias, false},
      {"mistral", "MistralForCausalLM", BiasRule::kNever, BiasRule::kNever, false},
      {"qwen2", "Qwen2ForCausalLM", BiasRule::kAlways, BiasRule::kNever, false},
      {"qwen3", "Qwen3ForCausalLM", BiasRule::kIfAttentionBias, BiasRule::kIfAttentionBias, true},
  };
  return table;
}

const ArchInfo& arch_info(const std::string& model_type) {
  std::vector<std::string> names;
  for (const ArchInfo& a : architectures()) {
    if (a.model_type == model_type) return a;
    names.push_back(a.model_type);
  }
  RLHF_FAIL("model_type '{}' is not supported\nhint: one of {}", model_type,
            fmt::join(names, ", "));
}

LayerSpec layer_spec(const ModelConfig& c) {
  const ArchInfo& a = arch_info(c.model_type);
  auto has = [&](BiasRule r) {
    return r == BiasRule::kAlways || (r == BiasRule::kIfAttentionBias && c.attention_bias);
  };
  LayerSpec s;
  s.qkv_bias = has(a.qkv_bias);
  s.o_bias = has(a.o_bias);
  s.qk_norm = a.qk_norm;
  s.rms_norm_eps = c.rms_norm_eps;
  s.rope_style = c.rope_style;
  s.C = c.hidden_size;
  s.F = c.intermediate_size;
  s.H = c.num_attention_heads;
  s.Hkv = c.num_key_value_heads;
  s.D = c.D();
  return s;
}

}  // namespace rlhf::model
