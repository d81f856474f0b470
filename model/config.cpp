#include "model/config.h"

#include "model/projections.h"

#include <nlohmann/json.hpp>

#include <bit>
#include <cmath>
#include <numbers>
#include <set>

#include "core/error.h"
#include "core/log.h"
#include "model/arch.h"
#include "model/projections.h"

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

namespace {

// The RoPE part of validate(): head dim, θ and the scaling.
void validate_rope(const ModelConfig& c, const std::string& source) {
  RLHF_CHECK(c.D() > 0 && c.D() % 2 == 0, "{}: head dim {} must be even and positive for RoPE",
             source, c.D());
  RLHF_CHECK(c.rope_theta > 0 && std::isfinite(c.rope_theta), "{}: rope_theta must be > 0, got {}",
             source, c.rope_theta);
  const RopeScaling& r = c.rope_scaling;
  RLHF_CHECK(r.rope_type == "default" || r.rope_type == "llama3",
             "{}: rope_scaling rope_type '{}' is not supported\nhint: default (plain RoPE) or "
             "llama3 (Llama 3.1/3.2)",
             source, r.rope_type);
  if (r.rope_type != "llama3") return;
  RLHF_CHECK(r.factor > 0 && std::isfinite(r.factor), "{}: rope_scaling factor must be > 0, got {}",
             source, r.factor);
  RLHF_CHECK(r.low_freq_factor > 0 && std::isfinite(r.low_freq_factor),
             "{}: rope_scaling low_freq_factor must be > 0, got {}", source, r.low_freq_factor);
  RLHF_CHECK(r.high_freq_factor > r.low_freq_factor && std::isfinite(r.high_freq_factor),
             "{}: rope_scaling high_freq_factor {} must be greater than low_freq_factor {}", source,
             r.high_freq_factor, r.low_freq_factor);
  RLHF_CHECK(r.original_max_position_embeddings > 0,
             "{}: rope_scaling original_max_position_embeddings must be > 0, got {}", source,
             r.original_max_position_embeddings);
}

}  // namespace

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
  // Bounds before anything multiplies two of these (see kMaxHiddenSize in config.h).
  auto at_most = [&](int64_t v, int64_t limit, const char* name) {
    RLHF_CHECK(v <= limit,
               "{}: {} {} exceeds the limit {} (2^{})\nhint: every model we run is far below it; "
               "the file is probably corrupt",
               source, name, v, limit, std::bit_width(static_cast<uint64_t>(limit)) - 1);
  };
  at_most(hidden_size, kMaxHiddenSize, "hidden_size");
  at_most(intermediate_size, kMaxIntermediateSize, "intermediate_size");
  at_most(num_hidden_layers, kMaxHiddenLayers, "num_hidden_layers");
  at_most(num_attention_heads, kMaxAttentionHeads, "num_attention_heads");
  at_most(num_key_value_heads, kMaxAttentionHeads, "num_key_value_heads");
  at_most(head_dim, kMaxHeadDim, "head_dim");
  at_most(D(), kMaxHeadDim,
          head_dim > 0 ? "head_dim" : "head dim (hidden_size / num_attention_heads)");
  at_most(num_attention_heads * D(), kMaxAttentionWidth, "num_attention_heads x head dim");
  at_most(vocab_size, kMaxVocabSize, "vocab_size");
  at_most(max_position_embeddings, kMaxPositionEmbeddings, "max_position_embeddings");
  RLHF_CHECK(head_dim > 0 || hidden_size % num_attention_heads == 0,
             "{}: hidden_size {} is not divisible by num_attention_heads {}", source, hidden_size,
             num_attention_heads);
  RLHF_CHECK(D() % 2 == 0, "{}: head dim {} must be even for RoPE", source, D());
  RLHF_CHECK(num_attention_heads % num_key_value_heads == 0,
             "{}: num_attention_heads {} is not divisible by num_key_value_heads {}", source,
             num_attention_heads, num_key_value_heads);
  RLHF_CHECK(rms_norm_eps > 0, "{}: rms_norm_eps must be > 0, got {}", source, rms_norm_eps);
  RLHF_CHECK(rope_theta > 0, "{}: rope_theta must be > 0, got {}", source, rope_theta);
  try {
    arch_info(model_type);  // the architecture table names the supported types
  } catch (const Error& e) {
    RLHF_FAIL("{}: {}", source, e.what());
  }
  RLHF_CHECK(!(model_type == "mistral" && attention_bias),
             "{}: attention_bias = true is not supported for model_type 'mistral' (Mistral has no "
             "attention biases)\nhint: use model_type 'llama' for a Llama with attention biases",
             source);
  validate_rope(*this, source);
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
  std::string lm_class = "LlamaForCausalLM";
  for (const ArchInfo& a : architectures())
    if (a.model_type == model_type) lm_class = a.causal_lm_class;
  j["architectures"] = {lm_class};
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
  if (rope_scaling.rope_type == "default") {
    j["rope_scaling"] = nullptr;
  } else {
    j["rope_scaling"] = {
        {"rope_type", rope_scaling.rope_type},
        {"factor", rope_scaling.factor},
        {"low_freq_factor", rope_scaling.low_freq_factor},
        {"high_freq_factor", rope_scaling.high_freq_factor},
        {"original_max_position_embeddings", rope_scaling.original_max_position_embeddings}};
  }
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

using nlohmann::json;

// Keys that HF config.json files carry and that do not change the computation we do: accepted and
// ignored in both modes (ConfigKeys). Read from the config.json files that transformers 4.x and
// 5.x write for Llama 2/3.x, Mistral, Qwen2/2.5, Qwen3 and SmolLM2, and from PretrainedConfig's
// common attributes (generation, fine-tuning and export keys). The keys that may change the
// computation (sliding_window, layer_types, mlp_bias, hidden_act, use_mrope, ...) are not here:
// from_json reads and checks them.
const std::set<std::string>& ignorable_hf_keys() {
  static const std::set<std::string> keys = {
      // Identity, provenance, export.
      "architectures", "auto_map", "_name_or_path", "_model_name_or_path", "name_or_path",
      "model_name", "transformers_version", "torch_dtype", "dtype", "use_bfloat16",
      "tokenizer_class", "unsloth_fixed", "unsloth_version", "_commit_hash",
      "quantization_config",  // of a dequantized export; safetensors refuses quantized tensors
      "head",                 // our checkpoints: the head kind, read by the callers
      // Runtime and training switches that do not change the function computed.
      "use_cache", "output_attentions", "output_hidden_states", "return_dict", "use_return_dict",
      "torchscript", "is_decoder", "add_cross_attention", "cross_attention_hidden_size",
      "tie_encoder_decoder", "is_encoder_decoder", "pruned_heads", "chunk_size_feed_forward",
      "tf_legacy_loss", "keys_to_ignore_at_inference", "_attn_implementation",
      "_attn_implementation_autoset", "attn_implementation", "initializer_range",
      "pretraining_tp",  // Llama 2: a slicing of the same matmuls, same result
      // Dropout (inference and our training run without dropout).
      "attention_dropout", "hidden_dropout", "hidden_dropout_prob", "attention_probs_dropout_prob",
      "embd_pdrop", "resid_pdrop", "attn_pdrop", "dropout", "classifier_dropout",
      "activation_dropout",
      // Token ids other than bos/eos/pad.
      "unk_token_id", "sep_token_id", "decoder_start_token_id", "forced_bos_token_id",
      "forced_eos_token_id",
      // Generation defaults (transformers v4 PretrainedConfig kept them in config.json).
      "max_length", "min_length", "do_sample", "early_stopping", "num_beams", "num_beam_groups",
      "diversity_penalty", "temperature", "top_k", "top_p", "typical_p", "repetition_penalty",
      "length_penalty", "no_repeat_ngram_size", "encoder_no_repeat_ngram_size", "bad_words_ids",
      "num_return_sequences", "output_scores", "return_dict_in_generate", "remove_invalid_values",
      "exponential_decay_length_penalty", "suppress_tokens", "begin_suppress_tokens", "prefix",
      "task_specific_params", "finetuning_task",
      // Sequence classification heads (the head kind is decided by the callers).
      "id2label", "label2id", "num_labels", "problem_type",
      // Qwen2/Qwen3: the layers from which a sliding window would apply; the window is checked
      // through use_sliding_window / sliding_window / layer_types.
      "max_window_layers",
      // SmolLM2 (nanotron export): HF's Llama ignores both; HF weights are rotate-half.
      "is_llama_config", "rope_interleaved"};
  return keys;
}

// Keys understood inside a rope_scaling / rope_parameters dict.
const std::set<std::string>& rope_dict_keys() {
  static const std::set<std::string> keys = {"rope_type",
                                             "type",
                                             "rope_theta",
                                             "factor",
                                             "low_freq_factor",
                                             "high_freq_factor",
                                             "original_max_position_embeddings",
                                             "partial_rotary_factor"};
  return keys;
}

// What from_json reads: the object, its source name and mode, and the keys consumed.
struct Reader {
  const json& j;
  const std::string& source;
  ConfigKeys mode;
  std::set<std::string> seen;

  // The value of `key`, or nullptr when absent or null. Marks the key as read.
  const json* get(const std::string& key) {
    seen.insert(key);
    auto it = j.find(key);
    return it == j.end() || it->is_null() ? nullptr : &*it;
  }

  void unknown(const std::string& key) const {
    if (mode == ConfigKeys::kStrict) RLHF_FAIL("{}: unknown model config key '{}'", source, key);
    LOG_DEBUG("{}: ignoring model config key '{}'", source, key);
  }
};

double number_of(const json& v, const std::string& source, const std::string& key) {
  RLHF_CHECK(v.is_number(), "{}: key '{}' must be a number, got {}", source, key, v.dump());
  return v.get<double>();
}

int64_t integer_of(const json& v, const std::string& source, const std::string& key) {
  if (v.is_number_float()) {  // 8192.0 written by a hand or a float-typed exporter
    const double d = v.get<double>();
    RLHF_CHECK(std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9.0e15,
               "{}: key '{}' must be an integer, got {}", source, key, v.dump());
    return static_cast<int64_t>(d);
  }
  RLHF_CHECK(v.is_number_integer(), "{}: key '{}' must be an integer, got {}", source, key,
             v.dump());
  return v.get<int64_t>();
}

bool bool_of(const json& v, const std::string& source, const std::string& key) {
  RLHF_CHECK(v.is_boolean(), "{}: key '{}' must be true or false, got {}", source, key, v.dump());
  return v.get<bool>();
}

void check_partial_rotary_factor(const json& v, const std::string& source, const std::string& key) {
  const double f = number_of(v, source, key);
  RLHF_CHECK(f == 1.0,
             "{}: '{}' = {} is not supported (RoPE on a part of the head dim)\nhint: only 1.0, "
             "RoPE on the whole head",
             source, key, v.dump());
}

// One rope dict (v4 rope_scaling, v5 rope_parameters or one of its per-layer-type entries) named
// `name` in messages. Sets c.rope_scaling; returns the dict's rope_theta (0 if it has none).
double read_rope_dict(const json& d, const std::string& name, Reader& r, ModelConfig& c) {
  const std::string& src = r.source;
  RLHF_CHECK(d.is_object(), "{}: key '{}' must be an object or null, got {}", src, name, d.dump());
  auto field = [&](const char* k) -> const json* {
    auto it = d.find(k);
    return it == d.end() || it->is_null() ? nullptr : &*it;
  };
  const std::string q = name + ".";
  std::string type = "default";
  if (const json* t = field("rope_type") ? field("rope_type") : field("type")) {
    RLHF_CHECK(t->is_string(), "{}: key '{}rope_type' must be a string, got {}", src, q, t->dump());
    type = t->get<std::string>();
  }
  RLHF_CHECK(type == "default" || type == "llama3",
             "{}: '{}' has rope_type '{}', which is not supported\nhint: supported RoPE types "
             "are default (no scaling) and llama3 (Llama 3.1/3.2)",
             src, name, type);
  double theta = 0;
  if (const json* t = field("rope_theta")) theta = number_of(*t, src, q + "rope_theta");
  if (const json* p = field("partial_rotary_factor"))
    check_partial_rotary_factor(*p, src, q + "partial_rotary_factor");
  RopeScaling s;
  s.rope_type = type;
  if (type == "llama3") {
    auto need = [&](const char* k) -> const json& {
      const json* v = field(k);
      RLHF_CHECK(v != nullptr, "{}: '{}' of rope_type llama3 needs key '{}'", src, name, k);
      return *v;
    };
    s.factor = number_of(need("factor"), src, q + "factor");
    s.low_freq_factor = number_of(need("low_freq_factor"), src, q + "low_freq_factor");
    s.high_freq_factor = number_of(need("high_freq_factor"), src, q + "high_freq_factor");
    // transformers v5 falls back to max_position_embeddings (v4 requires the key).
    s.original_max_position_embeddings = c.max_position_embeddings;
    if (const json* o = field("original_max_position_embeddings"))
      s.original_max_position_embeddings =
          integer_of(*o, src, q + "original_max_position_embeddings");
  }
  for (auto it = d.begin(); it != d.end(); ++it)
    if (!rope_dict_keys().count(it.key())) r.unknown(q + it.key());
  c.rope_scaling = s;
  return theta;
}

// RoPE: rope_theta (v4), rope_scaling (v4), rope_parameters (v5, flat or per layer type).
void read_rope(Reader& r, ModelConfig& c, const std::vector<std::string>& layer_types) {
  const std::string& src = r.source;
  const json* top_theta = r.get("rope_theta");
  const json* scaling = r.get("rope_scaling");
  const json* params = r.get("rope_parameters");
  auto empty = [](const json* v) { return v == nullptr || (v->is_object() && v->empty()); };
  RLHF_CHECK(empty(scaling) || empty(params),
             "{}: both 'rope_scaling' and 'rope_parameters' are set\nhint: keep one "
             "(transformers v4 writes rope_theta + rope_scaling, v5 rope_parameters)",
             src);
  double theta = 0;
  if (!empty(scaling)) {
    theta = read_rope_dict(*scaling, "rope_scaling", r, c);
  } else if (!empty(params)) {
    RLHF_CHECK(params->is_object(), "{}: key 'rope_parameters' must be an object or null, got {}",
               src, params->dump());
    // Per layer type ({"full_attention": {...}, "sliding_attention": {...}}) when keyed by layer
    // types, as transformers' nested_rope_parameter_keys decides.
    std::set<std::string> labels(layer_types.begin(), layer_types.end());
    labels.insert({"full_attention", "sliding_attention"});
    bool nested = false;
    for (auto it = params->begin(); it != params->end(); ++it)
      nested = nested || labels.count(it.key()) > 0;
    if (nested) {
      for (auto it = params->begin(); it != params->end(); ++it)
        if (!labels.count(it.key())) r.unknown("rope_parameters." + it.key());
      auto full = params->find("full_attention");
      RLHF_CHECK(full != params->end() && full->is_object(),
                 "{}: 'rope_parameters' is given per layer type but has no 'full_attention' "
                 "entry\nhint: every layer of the models we run is full attention",
                 src);
      theta = read_rope_dict(*full, "rope_parameters.full_attention", r, c);
    } else {
      theta = read_rope_dict(*params, "rope_parameters", r, c);
    }
  }
  if (top_theta) {
    const double t = number_of(*top_theta, src, "rope_theta");
    RLHF_CHECK(theta == 0 || theta == t,
               "{}: rope_theta {} disagrees with the rope_theta {} of '{}'", src, t, theta,
               !empty(scaling) ? "rope_scaling" : "rope_parameters");
    theta = t;
  }
  if (theta != 0) c.rope_theta = theta;
  if (const json* p = r.get("partial_rotary_factor"))
    check_partial_rotary_factor(*p, src, "partial_rotary_factor");
  // Phi-3 style top-level original_max_position_embeddings: transformers v5 gives it priority for
  // llama3 scaling; for default RoPE it is unused.
  if (const json* o = r.get("original_max_position_embeddings")) {
    const int64_t v = integer_of(*o, src, "original_max_position_embeddings");
    if (c.rope_scaling.rope_type == "llama3") c.rope_scaling.original_max_position_embeddings = v;
  }
}

// Sliding-window attention in its three spellings. A window at least max_position_embeddings long
// never masks a key at the positions we run (< max_position_embeddings): that is full attention.
void check_sliding_window(Reader& r, const ModelConfig& c,
                          const std::vector<std::string>& layer_types) {
  const std::string& src = r.source;
  int64_t window = 0;  // 0 = none
  if (const json* w = r.get("sliding_window")) window = integer_of(*w, src, "sliding_window");
  const bool short_window = window > 0 && window < c.max_position_embeddings;
  bool use = false;
  if (const json* u = r.get("use_sliding_window")) use = bool_of(*u, src, "use_sliding_window");
  const std::string hint = fmt::format(
      "\nhint: set max_position_embeddings to at most {} in the config: over contexts within the "
      "window, sliding-window attention is full attention",
      window);
  if (c.model_type == "qwen2" || c.model_type == "qwen3") {
    RLHF_CHECK(!(use && short_window),
               "{}: 'use_sliding_window' is true with sliding_window {} < max_position_embeddings "
               "{}: sliding-window attention is not supported{}",
               src, window, c.max_position_embeddings, hint);
  } else if (c.model_type == "mistral") {
    RLHF_CHECK(!short_window,
               "{}: 'sliding_window' {} is shorter than max_position_embeddings {}: "
               "sliding-window attention is not supported{}",
               src, window, c.max_position_embeddings, hint);
  }
  // HF's Llama has no sliding window: a sliding_window key there is ignored, as transformers does.
  for (size_t i = 0; i < layer_types.size(); ++i) {
    const std::string& t = layer_types[i];
    if (t == "full_attention") continue;
    RLHF_CHECK(t == "sliding_attention",
               "{}: 'layer_types' entry {} is '{}': only full attention is supported", src, i, t);
    RLHF_CHECK(!short_window,
               "{}: 'layer_types' entry {} is 'sliding_attention' with sliding_window {} < "
               "max_position_embeddings {}: sliding-window attention is not supported{}",
               src, i, window, c.max_position_embeddings, hint);
  }
}

}  // namespace

ModelConfig ModelConfig::from_json(const nlohmann::json& j, const std::string& source,
                                   ConfigKeys keys) {
  RLHF_CHECK(j.is_object(), "{}: a model config must be an object", source);
  ModelConfig c;
  Reader r{j, source, keys, {}};
  auto get_int = [&](const char* key, int64_t& out, bool required) {
    const json* v = r.get(key);
    if (v == nullptr) {
      RLHF_CHECK(!required, "{}: missing required key '{}'", source, key);
      return;
    }
    RLHF_CHECK(v->is_number_integer(), "{}: key '{}' must be an integer, got {}", source, key,
               v->dump());
    out = v->get<int64_t>();
  };
  auto get_float = [&](const char* key, double& out) {
    if (const json* v = r.get(key)) out = number_of(*v, source, key);
  };
  auto get_bool = [&](const char* key, bool& out) {
    if (const json* v = r.get(key)) out = bool_of(*v, source, key);
  };
  if (const json* v = r.get("model_type")) {
    RLHF_CHECK(v->is_string(), "{}: key 'model_type' must be a string", source);
    c.model_type = v->get<std::string>();
  }
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
  get_bool("tie_word_embeddings", c.tie_word_embeddings);
  get_bool("attention_bias", c.attention_bias);
  // Token ids: HF allows a list for eos_token_id (Llama 3); the first one is the stop token we use.
  auto get_token = [&](const char* key, int64_t& out) {
    const json* v = r.get(key);
    if (v == nullptr) return;
    if (v->is_array() && !v->empty() && (*v)[0].is_number_integer()) {
      out = (*v)[0].get<int64_t>();
      return;
    }
    RLHF_CHECK(v->is_number_integer(), "{}: key '{}' must be an integer, got {}", source, key,
               v->dump());
    out = v->get<int64_t>();
  };
  get_token("bos_token_id", c.bos_token_id);
  get_token("eos_token_id", c.eos_token_id);
  get_token("pad_token_id", c.pad_token_id);
  if (const json* v = r.get("rope_style")) {
    RLHF_CHECK(v->is_string(), "{}: key 'rope_style' must be a string", source);
    c.rope_style = rope_style_from_string(v->get<std::string>());
  }
  std::vector<std::string> layer_types;
  if (const json* v = r.get("layer_types")) {
    RLHF_CHECK(v->is_array(), "{}: key 'layer_types' must be a list, got {}", source, v->dump());
    for (const json& t : *v) {
      RLHF_CHECK(t.is_string(), "{}: key 'layer_types' must be a list of strings, got {}", source,
                 v->dump());
      layer_types.push_back(t.get<std::string>());
    }
  }
  read_rope(r, c, layer_types);
  if (const json* v = r.get("hidden_act")) {
    RLHF_CHECK(*v == "silu" || *v == "swish",
               "{}: hidden_act {} is not supported (only silu)\nhint: the MLP is SwiGLU with SiLU",
               source, v->dump());
  }
  if (const json* v = r.get("mlp_bias")) {
    RLHF_CHECK(!bool_of(*v, source, "mlp_bias"),
               "{}: mlp_bias = true is not supported (the MLP projections have no bias)", source);
  }
  if (const json* v = r.get("use_mrope")) {
    RLHF_CHECK(!bool_of(*v, source, "use_mrope"),
               "{}: use_mrope = true is not supported (multimodal RoPE)", source);
  }
  check_sliding_window(r, c, layer_types);
  for (auto it = j.begin(); it != j.end(); ++it)
    if (!r.seen.count(it.key()) && !ignorable_hf_keys().count(it.key())) r.unknown(it.key());
  c.validate(source);
  return c;
}

int64_t ModelConfig::num_parameters(HeadKind head) const {
  const LayerSpec s = layer_spec(*this);
  const int64_t C = hidden_size, D = s.D;
  int64_t layer = 2 * C;  // the two norms
  for (const Projection& p : layer_projections(s)) layer += p.in * p.out + (p.bias ? p.out : 0);
  if (s.qk_norm) layer += 2 * D;
  int64_t n = vocab_size * C + num_hidden_layers * layer + C;
  if (head == HeadKind::kLM) {
    if (!tie_word_embeddings) n += vocab_size * C;
  } else {
    n += C;
  }
  return n;
}

std::vector<double> rope_default_inv_freq(int64_t D, double theta) {
  RLHF_CHECK(D > 0 && D % 2 == 0,
             "rope_default_inv_freq: head_dim must be even and positive, got {}", D);
  RLHF_CHECK(theta > 0, "rope_default_inv_freq: rope_theta must be > 0, got {}", theta);
  std::vector<double> inv(static_cast<size_t>(D / 2));
  for (int64_t i = 0; i < D / 2; ++i)
    inv[static_cast<size_t>(i)] =
        std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(D));
  return inv;
}

std::vector<double> rope_inv_freq(const ModelConfig& c) {
  validate_rope(c, "rope_inv_freq");
  std::vector<double> inv = rope_default_inv_freq(c.D(), c.rope_theta);
  const RopeScaling& s = c.rope_scaling;
  if (s.rope_type != "llama3") return inv;
  // transformers' _compute_llama3_parameters, term by term (in double instead of float32).
  const double old_context_len = static_cast<double>(s.original_max_position_embeddings);
  const double low_freq_wavelen = old_context_len / s.low_freq_factor;
  const double high_freq_wavelen = old_context_len / s.high_freq_factor;
  for (double& f : inv) {
    const double wavelen = 2 * std::numbers::pi / f;
    const double llama = wavelen > low_freq_wavelen ? f / s.factor : f;
    const bool medium = !(wavelen < high_freq_wavelen) && !(wavelen > low_freq_wavelen);
    if (medium) {
      const double smooth = (old_context_len / wavelen - s.low_freq_factor) /
                            (s.high_freq_factor - s.low_freq_factor);
      f = (1 - smooth) * llama / s.factor + smooth * llama;
    } else {
      f = llama;
    }
  }
  return inv;
}

}  // namespace rlhf::model
