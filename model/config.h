// ModelConfig: the architecture of a Llama-family model, with Hugging Face config.json field names.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <string>

namespace rlhf::model {

/// How RoPE pairs the dimensions of a head (Su et al. 2021, eq. 34).
/// kInterleaved: pairs (2i, 2i+1), as Meta's Llama and llama2.c do.
/// kRotateHalf:  pairs (i, i + D/2), as Hugging Face transformers does.
enum class RopeStyle { kInterleaved, kRotateHalf };

/// "interleaved" | "rotate_half"; throws rlhf::Error on anything else.
RopeStyle rope_style_from_string(const std::string& s);
const char* to_string(RopeStyle s);

/// What sits on top of the final norm: the LM head (token log-probs), or a scalar head
/// (`score.weight`, shape (1, C)) read per token (critic values) or at the last token (reward
/// model).
enum class HeadKind { kLM, kValue, kReward };
const char* to_string(HeadKind h);

/// Architecture hyper-parameters. Names follow HF `config.json`; dimension symbols used in kernels:
/// C = hidden_size, F = intermediate_size, L = num_hidden_layers, H = num_attention_heads,
/// Hkv = num_key_value_heads, D = head_dim, V = vocab_size.
struct ModelConfig {
  std::string model_type = "llama";  ///< "llama" | "mistral" | "qwen2" (q/k/v bias)
  int64_t hidden_size = 288;
  int64_t intermediate_size = 768;
  int64_t num_hidden_layers = 6;
  int64_t num_attention_heads = 6;
  int64_t num_key_value_heads = 6;
  int64_t head_dim = 0;  ///< 0 means hidden_size / num_attention_heads
  int64_t vocab_size = 32000;
  int64_t max_position_embeddings = 2048;
  double rms_norm_eps = 1e-5;
  double rope_theta = 10000.0;
  bool tie_word_embeddings = false;
  bool attention_bias = false;  ///< Llama: bias on q, k, v and o projections
  RopeStyle rope_style = RopeStyle::kRotateHalf;
  int64_t bos_token_id = 1;
  int64_t eos_token_id = 2;
  int64_t pad_token_id = 0;

  int64_t D() const { return head_dim > 0 ? head_dim : hidden_size / num_attention_heads; }
  /// q/k/v projections carry a bias (Llama with attention_bias, or Qwen2 always).
  bool qkv_bias() const { return attention_bias || model_type == "qwen2"; }
  /// o_proj carries a bias (Llama with attention_bias; never Qwen2).
  bool o_bias() const { return attention_bias && model_type != "qwen2"; }

  /// Throws rlhf::Error naming the field when a value is out of range or inconsistent
  /// (e.g. heads not divisible by KV heads). `source` names the file for the message.
  void validate(const std::string& source = "model config") const;

  /// HF config.json object (architectures, model_type, every field above; rope_style as an extra
  /// key "rope_style" that HF ignores).
  nlohmann::json to_json() const;

  /// From a HF config.json-like object. Unknown keys are ignored only if HF uses them (a known
  /// list); any other unknown key, a wrong type, or a missing required field throws rlhf::Error
  /// naming `source` and the key. Validates the result.
  static ModelConfig from_json(const nlohmann::json& j, const std::string& source);

  /// Parameters of the model with this head (no padding), for MFU and summaries.
  int64_t num_parameters(HeadKind head = HeadKind::kLM) const;
};

}  // namespace rlhf::model
