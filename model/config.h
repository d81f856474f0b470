// ModelConfig: the architecture of a Llama-family model, with Hugging Face config.json field names.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <string>
#include <vector>

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

/// How config keys that ModelConfig does not know are treated by ModelConfig::from_json.
/// Keys that change the computation in a way we do not implement (another rope type, an active
/// sliding window, mlp_bias, a hidden_act other than silu, ...) are refused by name in both modes;
/// known keys that do not change the computation (dtype, dropout rates, `_name_or_path`, ...) are
/// accepted and ignored in both modes.
///  - kStrict: any other key is an error ("unknown model config key 'k'"), so a typo in a config
///    written by hand is caught. For TOML model configs (io/model_config_file.h).
///  - kHuggingFace: any other key is ignored (logged at debug level), as transformers ignores the
///    keys its config class does not read. For config.json files written by transformers (v4 and
///    v5 layouts), JSON model configs, and the config stored in our HDF5 checkpoints.
enum class ConfigKeys { kStrict, kHuggingFace };

/// RoPE frequency scaling, as HF's `rope_scaling` (transformers v4) or `rope_parameters`
/// (transformers v5, without its `rope_theta`). Supported `rope_type`s:
///  - "default": no scaling (also a null/absent `rope_scaling`); the other fields are unused;
///  - "llama3": Llama 3.1 / 3.2 (Meta's scaling as transformers' `_compute_llama3_parameters`
///    implements it): wavelengths 2π/ω longer than original_max_position_embeddings /
///    low_freq_factor are divided by `factor`, those shorter than
///    original_max_position_embeddings / high_freq_factor are kept, and those in between are
///    interpolated smoothly (see rope_inv_freq).
struct RopeScaling {
  std::string rope_type = "default";
  double factor = 1.0;                           ///< llama3: frequency divisor (Llama 3.1: 8)
  double low_freq_factor = 1.0;                  ///< llama3: Llama 3.1: 1
  double high_freq_factor = 4.0;                 ///< llama3: > low_freq_factor (Llama 3.1: 4)
  int64_t original_max_position_embeddings = 0;  ///< llama3: pre-training context (Llama 3: 8192)

  // Spelled out: this header is also compiled as C++17 by nvcc (no defaulted comparisons).
  bool operator==(const RopeScaling& o) const {
    return rope_type == o.rope_type && factor == o.factor && low_freq_factor == o.low_freq_factor &&
           high_freq_factor == o.high_freq_factor &&
           original_max_position_embeddings == o.original_max_position_embeddings;
  }
  bool operator!=(const RopeScaling& o) const { return !(*this == o); }
};

/// Upper bounds on the dimensions of a model (ModelConfig::validate refuses anything larger, naming
/// the file, the key and the limit; the GGUF and llama2.c readers check their own keys against them
/// first). Each is 8x or more the largest published model of the families we run (Llama 3.1 405B:
/// hidden 16384, intermediate 53248, 126 layers, 128 heads of 128; vocabularies up to 262,144
/// (Gemma 3); contexts up to 10M positions (Llama 4 Scout)), and together they keep every product
/// the code forms far from int64/size_t overflow, so that a corrupt or hostile size is refused
/// before it can wrap into a small allocation or a huge one:
///  - a decoder layer's parameters: 2·C·(H·D) + 2·C·(Hkv·D) + 3·C·F + ... < 7·2^37 < 2^40;
///  - embedding / LM head V·C <= 2^41; all parameters <= 2^40·L + 2^42 < 2^53, and their fp32
///    bytes with gradients and AdamW state (5 copies) < 2^58;
///  - RoPE tables max_pos·D/2 <= 2^35 floats; KV-cache rows L·Hkv·D <= 2^32;
///  - attention widths H·D, Hkv·D <= 2^20, so activations N·(H·D) stay < 2^63 for N < 2^43 rows.
inline constexpr int64_t kMaxHiddenSize = int64_t{1} << 17;          ///< C: 131,072
inline constexpr int64_t kMaxIntermediateSize = int64_t{1} << 20;    ///< F: 1,048,576
inline constexpr int64_t kMaxHiddenLayers = int64_t{1} << 12;        ///< L: 4,096
inline constexpr int64_t kMaxAttentionHeads = int64_t{1} << 12;      ///< H (and Hkv <= H): 4,096
inline constexpr int64_t kMaxHeadDim = int64_t{1} << 12;             ///< D: 4,096
inline constexpr int64_t kMaxAttentionWidth = int64_t{1} << 20;      ///< H·D: 1,048,576
inline constexpr int64_t kMaxVocabSize = int64_t{1} << 24;           ///< V: 16,777,216
inline constexpr int64_t kMaxPositionEmbeddings = int64_t{1} << 24;  ///< 16,777,216 positions

/// Architecture hyper-parameters. Names follow HF `config.json`; dimension symbols used in kernels:
/// C = hidden_size, F = intermediate_size, L = num_hidden_layers, H = num_attention_heads,
/// Hkv = num_key_value_heads, D = head_dim, V = vocab_size.
struct ModelConfig {
  /// "llama" | "mistral" | "qwen2" (q/k/v bias) | "qwen3" (q/k norms): a row of the architecture
  /// table (model/arch.h)
  std::string model_type = "llama";
  int64_t hidden_size = 288;
  int64_t intermediate_size = 768;
  int64_t num_hidden_layers = 6;
  int64_t num_attention_heads = 6;
  int64_t num_key_value_heads = 6;
  int64_t head_dim = 0;  ///< 0 means hidden_size / num_attention_heads
  int64_t vocab_size = 32000;
  int64_t max_position_embeddings = 2048;
  double rms_norm_eps = 1e-5;
  double rope_theta = 10000.0;  ///< RoPE base θ (HF v4 `rope_theta`, v5 `rope_parameters`)
  RopeScaling rope_scaling;     ///< RoPE frequency scaling (HF `rope_scaling` / `rope_parameters`)
  bool tie_word_embeddings = false;
  bool attention_bias = false;  ///< Llama: bias on q, k, v and o projections
  RopeStyle rope_style = RopeStyle::kRotateHalf;
  int64_t bos_token_id = 1;
  int64_t eos_token_id = 2;
  int64_t pad_token_id = 0;

  int64_t D() const { return head_dim > 0 ? head_dim : hidden_size / num_attention_heads; }
  /// Throws rlhf::Error naming the field when a value is out of range or inconsistent
  /// (e.g. a dimension above its kMax* limit, heads not divisible by KV heads, a rope_scaling type
  /// other than default/llama3, a Mistral with attention_bias). `source` names the file for the
  /// message.
  void validate(const std::string& source = "model config") const;

  /// HF config.json object in the transformers v4 layout, which transformers v4 and v5 both load:
  /// architectures (LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM),
  /// model_type, every field above, head_dim = D() always, `rope_theta` at the top level and
  /// `rope_scaling` = null (default) or {"rope_type": "llama3", "factor", "low_freq_factor",
  /// "high_freq_factor", "original_max_position_embeddings"}; rope_style as an extra key
  /// "rope_style" that HF ignores.
  nlohmann::json to_json() const;

  /// From a HF config.json-like object, transformers v4 or v5 layout. Reads the fields above;
  /// RoPE from `rope_theta` (v4, top level; default 10000), `rope_scaling` (v4: null or a dict
  /// with `rope_type`, or the legacy `type`) and `rope_parameters` (v5: a dict with `rope_type`,
  /// `rope_theta` and the scaling keys, or such dicts per layer type, e.g. {"full_attention":
  /// {...}}, of which the full-attention one is used). Missing optional keys keep the defaults
  /// above (num_key_value_heads defaults to num_attention_heads); eos_token_id may be a list (the
  /// first id is used).
  /// Throws rlhf::Error naming `source` and the key on: a missing required key (hidden_size,
  /// intermediate_size, num_hidden_layers, num_attention_heads, vocab_size), a wrong type, an
  /// invalid value (validate()), an unknown key in `keys` = kStrict mode, and in both modes on
  /// what changes the computation and is not supported:
  ///  - a rope type other than default/llama3 ("yarn", "dynamic", "linear", "longrope", ...);
  ///    partial_rotary_factor != 1; use_mrope = true; both rope_scaling and rope_parameters set;
  ///  - an active sliding window: qwen2/qwen3 `use_sliding_window: true` with a `sliding_window`
  ///    shorter than max_position_embeddings; mistral `sliding_window` shorter than
  ///    max_position_embeddings (a window at least as long as the context is full attention);
  ///    `layer_types` with an entry other than "full_attention", except "sliding_attention"
  ///    entries whose window is null or at least max_position_embeddings;
  ///  - mlp_bias = true; hidden_act other than silu (or its alias swish); attention_bias = true
  ///    for mistral (HF's Mistral has no biases).
  static ModelConfig from_json(const nlohmann::json& j, const std::string& source,
                               ConfigKeys keys = ConfigKeys::kStrict);

  /// Parameters of the model with this head (no padding), for MFU and summaries.
  int64_t num_parameters(HeadKind head = HeadKind::kLM) const;
};

/// The D/2 RoPE inverse frequencies ω_i = θ^(−2i/D), i < D/2, computed in double exactly as
/// rope_tables_cpu(cos, sin, max_pos, D, theta) computes them (std::pow(θ, −2i/D)), so tables built
/// from these are bit-identical to the θ tables. Throws rlhf::Error unless D is even and positive
/// and θ > 0.
std::vector<double> rope_default_inv_freq(int64_t D, double theta);

/// The D/2 RoPE inverse frequencies of `c` (D = c.D(), θ = c.rope_theta), in radians per
/// position: pair i of a head at position p turns by p·ω_i.
///  - rope_scaling "default": rope_default_inv_freq(D, θ).
///  - "llama3" (Meta's Llama 3.1 RoPE scaling, as transformers' `_compute_llama3_parameters` in
///    modeling_rope_utils.py computes it, here in double): with ω the default frequencies,
///    λ = 2π/ω, L = original_max_position_embeddings, λ_lo = L / low_freq_factor,
///    λ_hi = L / high_freq_factor:
///      λ < λ_hi:  ω (high frequencies kept);
///      λ > λ_lo:  ω / factor;
///      otherwise: (1 − s)·ω/factor + s·ω with s = (L/λ − low_freq_factor) /
///                 (high_freq_factor − low_freq_factor).
/// Throws rlhf::Error unless D is even and positive, θ > 0 and the scaling is valid (as
/// validate() checks them).
std::vector<double> rope_inv_freq(const ModelConfig& c);

}  // namespace rlhf::model
