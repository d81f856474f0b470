#include "model/config.h"

#include <nlohmann/json.hpp>

#include <set>

#include "core/error.h"

namespace rlhf::model {

RopeStyle rope_style_from_string(const std::string& s) {
  if (s == "interleaved") return RopeStyle::kInterleaved;
  if (s == "rotate_half") return RopeStyle::kRotateHalf;
  RLHF_FAIL(
      "unknown rope_style '{}'\nhint: use \"interleaved\" (Meta, llama2.c) or \"rotate_half\" (HF)",
      s);
}

const char* to_string(RopeStyle s) {
  return s == RopeStyle::kInterleaved ? "interleaved" : "rotate_half";
}

const char* to_string(HeadKind h) {
  switch (h) {
    case HeadKind::kLM:
      return "lm";
    case HeadKind::kValue:
      return "value";
    case HeadKind::kReward:
      return "reward";
  }
  return "?";
}

void ModelConfig::validate(const std::string& source) const {
  auto pos = [&](int64_t v, const char* name) {
    RLHF_CHECK(v > 0, "{}: {} must be > 0, got {}", source, name, v);
  };
  pos(hidden_size, "hidden_size");
  pos(intermediate_size, "intermediate_size");
  pos(num_hidden_layers, "num_hidden_layers");
  pos(num_attention_heads, "num_attention_heads");
  pos(num_key_value_heads, "num_key_value_heads");
  pos(vocab_size, "vocab_size");
  pos(max_position_embeddings, "max_position_embeddings");
  RLHF_CHECK(head_dim >= 0, "{}: head_dim must be >= 0, got {}", source, head_dim);
  RLHF_CHECK(head_dim > 0 || hidden_size % num_attention_heads == 0,
             "{}: hidden_size {} is not divisible by num_attention_heads {}", source, hidden_size,
             num_attention_heads);
  RLHF_CHECK(D() % 2 == 0, "{}: head dim {} must be even for RoPE", source, D());
  RLHF_CHECK(num_attention_heads % num_key_value_heads == 0,
             "{}: num_attention_heads {} is not divisible by num_key_value_heads {}", source,
             num_attention_heads, num_key_value_heads);
  RLHF_CHECK(rms_norm_eps > 0, "{}: rms_norm_eps must be > 0, got {}", source, rms_norm_eps);
  RLHF_CHECK(rope_theta > 0, "{}: rope_theta must be > 0, got {}", source, rope_theta);
  RLHF_CHECK(model_type == "llama" || model_type == "mistral" || model_type == "qwen2",
             "{}: model_type '{}' is not supported\nhint: llama, mistral or qwen2", source,
             model_type);
  auto tok = [&](int64_t v, const char* name) {
    RLHF_CHECK(v >= -1 && v < vocab_size, "{}: {} {} is outside the vocabulary [0, {})", source,
               name, v, vocab_size);
  };
  tok(bos_token_id, "bos_token_id");
  tok(eos_token_id, "eos_token_id");
  tok(pad_token_id, "pad_token_id");
}

nlohmann::json ModelConfig::to_json() const {
  nlohmann::json j;
  j["architectures"] = {model_type == "qwen2"     ? "Qwen2ForCausalLM"
                        : model_type == "mistral" ? "MistralForCausalLM"
                                                  : "LlamaForCausalLM"};
  j["model_type"] = model_type;
  j["hidden_size"] = hidden_size;
  j["intermediate_size"] = intermediate_size;
  j["num_hidden_layers"] = num_hidden_layers;
  j["num_attention_heads"] = num_attention_heads;
  j["num_key_value_heads"] = num_key_value_heads;
  j["head_dim"] = D();
  j["vocab_size"] = vocab_size;
  j["max_position_embeddings"] = max_position_embeddings;
  j["rms_norm_eps"] = rms_norm_eps;
  j["rope_theta"] = rope_theta;
  j["tie_word_embeddings"] = tie_word_embeddings;
  j["attention_bias"] = attention_bias;
  j["hidden_act"] = "silu";
  j["rope_style"] = to_string(rope_style);
  j["bos_token_id"] = bos_token_id;
  j["eos_token_id"] = eos_token_id;
  j["pad_token_id"] = pad_token_id;
  j["torch_dtype"] = "float32";
  return j;
}

namespace {

// Keys that HF config.json files carry and that do not change the computation we do (or that we
// check separately below). Anything else is an error, so a typo in a hand-written config is caught.
const std::set<std::string>& ignorable_hf_keys() {
  static const std::set<std::string> keys = {"architectures",
                                             "torch_dtype",
                                             "transformers_version",
                                             "initializer_range",
                                             "pretraining_tp",
                                             "use_cache",
                                             "attention_dropout",
                                             "_name_or_path",
                                             "auto_map",
                                             "bos_token_id",
                                             "eos_token_id",
                                             "pad_token_id",
                                             "sliding_window",
                                             "max_window_layers",
                                             "use_sliding_window",
                                             "output_attentions",
                                             "output_hidden_states",
                                             "return_dict",
                                             "dtype",
                                             "id2label",
                                             "label2id",
                                             "mlp_bias",
                                             "rope_scaling",
                                             "hidden_act",
                                             "rope_style",
                                             "layer_types",
                                             "tokenizer_class",
                                             "unsloth_fixed",
                                             "model_name",
                                             "use_return_dict",
                                             "problem_type",
                                             "num_labels",
                                             "head",
                                             "is_decoder",
                                             "torchscript",
                                             "keys_to_ignore_at_inference"};
  return keys;
}

}  // namespace

ModelConfig ModelConfig::from_json(const nlohmann::json& j, const std::string& source) {
  RLHF_CHECK(j.is_object(), "{}: a model config must be an object", source);
  ModelConfig c;
  std::set<std::string> seen;
  auto get_int = [&](const char* key, int64_t& out, bool required) {
    seen.insert(key);
    if (!j.contains(key) || j[key].is_null()) {
      RLHF_CHECK(!required, "{}: missing required key '{}'", source, key);
      return;
    }
    RLHF_CHECK(j[key].is_number_integer(), "{}: key '{}' must be an integer, got {}", source, key,
               j[key].dump());
    out = j[key].get<int64_t>();
  };
  auto get_float = [&](const char* key, double& out) {
    seen.insert(key);
    if (!j.contains(key) || j[key].is_null()) return;
    RLHF_CHECK(j[key].is_number(), "{}: key '{}' must be a number, got {}", source, key,
               j[key].dump());
    out = j[key].get<double>();
  };
  auto get_bool = [&](const char* key, bool& out) {
    seen.insert(key);
    if (!j.contains(key) || j[key].is_null()) return;
    RLHF_CHECK(j[key].is_boolean(), "{}: key '{}' must be true or false, got {}", source, key,
               j[key].dump());
    out = j[key].get<bool>();
  };
  if (j.contains("model_type")) {
    RLHF_CHECK(j["model_type"].is_string(), "{}: key 'model_type' must be a string", source);
    c.model_type = j["model_type"].get<std::string>();
  }
  seen.insert("model_type");
  get_int("hidden_size", c.hidden_size, true);
  get_int("intermediate_size", c.intermediate_size, true);
  get_int("num_hidden_layers", c.num_hidden_layers, true);
  get_int("num_attention_heads", c.num_attention_heads, true);
  c.num_key_value_heads = c.num_attention_heads;
  get_int("num_key_value_heads", c.num_key_value_heads, false);
  get_int("head_dim", c.head_dim, false);
  get_int("vocab_size", c.vocab_size, true);
  get_int("max_position_embeddings", c.max_position_embeddings, false);
  get_float("rms_norm_eps", c.rms_norm_eps);
  get_float("rope_theta", c.rope_theta);
  get_bool("tie_word_embeddings", c.tie_word_embeddings);
  get_bool("attention_bias", c.attention_bias);
  // Token ids: HF allows a list for eos_token_id (Llama 3); the first one is the stop token we use.
  auto get_token = [&](const char* key, int64_t& out) {
    if (!j.contains(key) || j[key].is_null()) return;
    const auto& v = j[key];
    if (v.is_array() && !v.empty() && v[0].is_number_integer()) {
      out = v[0].get<int64_t>();
      return;
    }
    RLHF_CHECK(v.is_number_integer(), "{}: key '{}' must be an integer, got {}", source, key,
               v.dump());
    out = v.get<int64_t>();
  };
  get_token("bos_token_id", c.bos_token_id);
  get_token("eos_token_id", c.eos_token_id);
  get_token("pad_token_id", c.pad_token_id);
  if (j.contains("rope_style")) {
    RLHF_CHECK(j["rope_style"].is_string(), "{}: key 'rope_style' must be a string", source);
    c.rope_style = rope_style_from_string(j["rope_style"].get<std::string>());
  }
  if (j.contains("hidden_act")) {
    RLHF_CHECK(j["hidden_act"] == "silu", "{}: hidden_act {} is not supported (only silu)", source,
               j["hidden_act"].dump());
  }
  if (j.contains("rope_scaling")) {
    RLHF_CHECK(j["rope_scaling"].is_null(),
               "{}: rope_scaling {} is not supported yet\nhint: remove it for contexts within "
               "max_position_embeddings",
               source, j["rope_scaling"].dump());
  }
  if (j.contains("mlp_bias")) {
    RLHF_CHECK(j["mlp_bias"] == false, "{}: mlp_bias = true is not supported", source);
  }
  for (auto it = j.begin(); it != j.end(); ++it) {
    RLHF_CHECK(seen.count(it.key()) || ignorable_hf_keys().count(it.key()),
               "{}: unknown model config key '{}'", source, it.key());
  }
  c.validate(source);
  return c;
}

int64_t ModelConfig::num_parameters(HeadKind head) const {
  const int64_t C = hidden_size, F = intermediate_size, D = this->D();
  const int64_t q = num_attention_heads * D, kv = num_key_value_heads * D;
  int64_t layer = C * q + 2 * C * kv + q * C + 3 * C * F + 2 * C;
  if (qkv_bias()) layer += q + 2 * kv;
  if (o_bias()) layer += C;
  int64_t n = vocab_size * C + num_hidden_layers * layer + C;
  if (head == HeadKind::kLM) {
    if (!tie_word_embeddings) n += vocab_size * C;
  } else {
    n += C;
  }
  return n;
}

}  // namespace rlhf::model
