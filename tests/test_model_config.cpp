// ModelConfig::from_json on real config.json files written by transformers 4.57.6 and 5.24.0
// (tests/fixtures/hf_configs, scripts/make_hf_config_fixtures.py): every file loads leniently with
// the published hyper-parameters (parameter counts included), each v4 file and its v5 twin give
// the same config, to_json round-trips, and what we do not compute is refused by name.
#include "model/config.h"

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <set>

#include "io/jsonl.h"
#include "model/arch.h"
#include "tests/io/io_test_util.h"

using namespace rlhf;
using model::ConfigKeys;
using model::ModelConfig;
using nlohmann::json;

namespace {

std::string fixture(const std::string& name) {
  return std::string(RLHF_SOURCE_DIR) + "/tests/fixtures/hf_configs/" + name;
}

json read_fixture(const std::string& name) {
  return io::parse_json_file(fixture(name));
}

ModelConfig load(const json& j, ConfigKeys keys = ConfigKeys::kHuggingFace) {
  return ModelConfig::from_json(j, "config.json", keys);
}

// The error message of loading `j` leniently ("" if it loads).
std::string refusal(const json& j) {
  return test::error_of([&] { load(j); });
}

const char* const kModels[] = {"llama2_7b",  "llama3_2_1b",  "llama3_1_8b",    "qwen2_5_0_5b",
                               "qwen3_0_6b", "smollm2_135m", "mistral_7b_v0_3"};

struct Expected {
  const char* model_type;
  int64_t C, F, L, H, Hkv, D, V, max_pos;
  double eps, theta;
  bool tied, qkv_bias, o_bias;
  int64_t bos, eos;
  int64_t params;  ///< published parameter count
};

Expected expected(const std::string& m) {
  // Published counts: Llama-2-7b 6,738,415,616; Llama-3.2-1B 1,235,814,400; Llama-3.1-8B
  // 8,030,261,248; Qwen2.5-0.5B 494,032,768; SmolLM2-135M 134,515,008; Mistral-7B-v0.3
  // 7,248,023,552 (the Hub's safetensors totals).
  if (m == "llama2_7b")
    return {"llama", 4096, 11008, 32,    32,    32, 128, 32000,     4096,
            1e-5,    1e4,  false, false, false, 1,  2,   6738415616};
  if (m == "llama3_2_1b")
    return {"llama", 2048, 8192, 16,    32,    8,      64,     128256,    131072,
            1e-5,    5e5,  true, false, false, 128000, 128001, 1235814400};
  if (m == "llama3_1_8b")
    return {"llama", 4096, 14336, 32,    32,    8,      128,    128256,    131072,
            1e-5,    5e5,  false, false, false, 128000, 128001, 8030261248};
  if (m == "qwen2_5_0_5b")
    return {"qwen2", 896, 4864, 24,   14,    2,      64,     151936,   32768,
            1e-6,    1e6, true, true, false, 151643, 151643, 494032768};
  if (m == "qwen3_0_6b")
    // V·C + L·(C·2048 + 2·C·1024 + 2048·C + 3·C·3072 + 2·C + 2·128 q/k norms) + C = 596,049,920,
    // the Hub's safetensors total of Qwen3-0.6B.
    return {"qwen3", 1024, 3072, 28,    16,    8,      128,    151936,   40960,
            1e-6,    1e6,  true, false, false, 151643, 151645, 596049920};
  if (m == "smollm2_135m")
    return {"llama", 576, 1536, 30,    9,     3, 64, 49152,    8192,
            1e-5,    1e5, true, false, false, 0, 0,  134515008};
  REQUIRE(m == "mistral_7b_v0_3");
  return {"mistral", 4096, 14336, 32,    32,    8, 128, 32768,     32768,
          1e-5,      1e6,  false, false, false, 1, 2,   7248023552};
}

}  // namespace

TEST_CASE("hf config.json: every transformers v4 and v5 file loads with the published values") {
  for (const char* m : kModels) {
    const Expected e = expected(m);
    for (const char* v : {"_v4.json", "_v5.json"}) {
      const std::string name = std::string(m) + v;
      INFO(name);
      const ModelConfig c = load(read_fixture(name));
      CHECK(c.model_type == e.model_type);
      CHECK(c.hidden_size == e.C);
      CHECK(c.intermediate_size == e.F);
      CHECK(c.num_hidden_layers == e.L);
      CHECK(c.num_attention_heads == e.H);
      CHECK(c.num_key_value_heads == e.Hkv);
      CHECK(c.D() == e.D);
      CHECK(c.vocab_size == e.V);
      CHECK(c.max_position_embeddings == e.max_pos);
      CHECK(c.rms_norm_eps == e.eps);
      CHECK(c.rope_theta == e.theta);
      CHECK(c.tie_word_embeddings == e.tied);
      CHECK(model::layer_spec(c).qkv_bias == e.qkv_bias);
      CHECK(model::layer_spec(c).o_bias == e.o_bias);
      CHECK(c.bos_token_id == e.bos);
      CHECK(c.eos_token_id == e.eos);
      CHECK(c.rope_style == model::RopeStyle::kRotateHalf);
      CHECK(c.num_parameters() == e.params);
      const bool llama3 = std::string(m).rfind("llama3", 0) == 0;
      CHECK(c.rope_scaling.rope_type == (llama3 ? "llama3" : "default"));
      if (llama3) {
        CHECK(c.rope_scaling.factor == (std::string(m) == "llama3_2_1b" ? 32.0 : 8.0));
        CHECK(c.rope_scaling.low_freq_factor == 1.0);
        CHECK(c.rope_scaling.high_freq_factor == 4.0);
        CHECK(c.rope_scaling.original_max_position_embeddings == 8192);
      }
    }
  }
}

TEST_CASE("hf config.json: a v4 file and its v5 twin give the same config") {
  for (const char* m : kModels) {
    INFO(m);
    const ModelConfig a = load(read_fixture(std::string(m) + "_v4.json"));
    const ModelConfig b = load(read_fixture(std::string(m) + "_v5.json"));
    CHECK(a.to_json() == b.to_json());
    CHECK(a.rope_scaling == b.rope_scaling);
    CHECK(a.rope_theta == b.rope_theta);
    CHECK(a.D() == b.D());  // Mistral: v4 writes head_dim null, v5 128
    CHECK(model::rope_inv_freq(a) == model::rope_inv_freq(b));
  }
  // The v4 and v5 files differ where the layouts differ.
  const json v4 = read_fixture("llama3_2_1b_v4.json"), v5 = read_fixture("llama3_2_1b_v5.json");
  CHECK(v4.contains("rope_scaling"));
  CHECK(v4.contains("rope_theta"));
  CHECK_FALSE(v4.contains("rope_parameters"));
  CHECK(v5.contains("rope_parameters"));
  CHECK_FALSE(v5.contains("rope_theta"));
  CHECK_FALSE(v5.contains("rope_scaling"));
}

TEST_CASE("hf config.json: to_json -> from_json round-trips, rope scaling included") {
  for (const char* m : kModels) {
    for (const char* v : {"_v4.json", "_v5.json"}) {
      INFO(m << v);
      const ModelConfig c = load(read_fixture(std::string(m) + v));
      const json j = c.to_json();
      // Every key to_json writes is known: the strict mode reads it back too.
      const ModelConfig strict = ModelConfig::from_json(j, "ours.json", ConfigKeys::kStrict);
      const ModelConfig lenient = load(j);
      CHECK(strict.to_json() == j);
      CHECK(lenient.to_json() == j);
      CHECK(strict.rope_scaling == c.rope_scaling);
      CHECK(strict.rope_theta == c.rope_theta);
      CHECK(strict.D() == c.D());
      CHECK(model::layer_spec(strict).qkv_bias == model::layer_spec(c).qkv_bias);
    }
  }
  // The v4 layout that transformers v4 and v5 both read.
  const json j = load(read_fixture("llama3_2_1b_v5.json")).to_json();
  CHECK(j.at("rope_theta") == 500000.0);
  CHECK(j.at("rope_scaling") == json::parse(R"({"rope_type": "llama3", "factor": 32.0,
      "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})"));
  CHECK(j.at("head_dim") == 64);
  CHECK(j.at("architectures") == json::array({"LlamaForCausalLM"}));
  CHECK_FALSE(j.contains("rope_parameters"));
  const json d = load(read_fixture("qwen2_5_0_5b_v5.json")).to_json();
  CHECK(d.at("rope_scaling").is_null());
  CHECK(d.at("rope_theta") == 1e6);
  CHECK(d.at("architectures") == json::array({"Qwen2ForCausalLM"}));
  const json q3 = load(read_fixture("qwen3_0_6b_v4.json")).to_json();
  CHECK(q3.at("architectures") == json::array({"Qwen3ForCausalLM"}));
  CHECK(q3.at("model_type") == "qwen3");
  CHECK(q3.at("head_dim") == 128);
  CHECK(load(read_fixture("mistral_7b_v0_3_v4.json")).to_json().at("architectures") ==
        json::array({"MistralForCausalLM"}));
}

TEST_CASE("hf config.json: ignored keys (lenient) and the same keys in strict mode") {
  json j = read_fixture("llama3_2_1b_v4.json");
  j["_name_or_path"] = "meta-llama/Llama-3.2-1B";
  j["_model_name_or_path"] = "meta-llama/Llama-3.2-1B";
  j["unk_token_id"] = 0;
  j["quantization_config"] = {{"quant_method", "fp8"}, {"dequantize", true}};
  j["hidden_dropout"] = 0.1;
  j["embd_pdrop"] = 0.0;
  j["torch_dtype"] = "bfloat16";
  j["max_length"] = 20;
  j["temperature"] = 0.6;
  j["rope_interleaved"] = false;
  j["layer_types"] = json::array();
  for (int i = 0; i < 16; ++i) j["layer_types"].push_back("full_attention");
  const ModelConfig ref = load(read_fixture("llama3_2_1b_v4.json"));
  CHECK(load(j).to_json() == ref.to_json());
  CHECK(load(j, ConfigKeys::kStrict).to_json() == ref.to_json());  // all known keys

  // A key nobody knows: ignored leniently, an error in strict mode.
  j["some_future_key"] = {1, 2};
  CHECK(load(j).to_json() == ref.to_json());
  CHECK(test::error_of([&] { load(j, ConfigKeys::kStrict); }) ==
        "config.json: unknown model config key 'some_future_key'");
  json r = read_fixture("llama3_2_1b_v5.json");
  r["rope_parameters"]["mscale_all_dim"] = 1.0;
  CHECK(load(r).rope_scaling == ref.rope_scaling);
  CHECK(test::error_of([&] { load(r, ConfigKeys::kStrict); }) ==
        "config.json: unknown model config key 'rope_parameters.mscale_all_dim'");

  // Inactive sliding windows: Qwen2.5 as on the Hub (sliding_window 32768 = the context,
  // use_sliding_window false), a Mistral window as long as the context, Llama (no window in HF).
  json q = read_fixture("qwen2_5_0_5b_v4.json");
  q["sliding_window"] = 4096;  // use_sliding_window false: unused
  CHECK(load(q).hidden_size == 896);
  q["use_sliding_window"] = true;
  q["sliding_window"] = 32768;  // >= max_position_embeddings: full attention
  CHECK(load(q).hidden_size == 896);
  json mi = read_fixture("mistral_7b_v0_1_v4.json");
  mi["max_position_embeddings"] = 4096;
  CHECK(load(mi).max_position_embeddings == 4096);
  json ll = read_fixture("llama2_7b_v4.json");
  ll["sliding_window"] = 1024;
  CHECK(load(ll).hidden_size == 4096);
  ll["hidden_act"] = "swish";  // transformers' alias of silu
  CHECK(load(ll).hidden_size == 4096);
}

TEST_CASE("hf config.json: rope parameters in every layout") {
  const ModelConfig ref = load(read_fixture("llama3_2_1b_v5.json"));
  // v5, per layer type.
  json nested = read_fixture("llama3_2_1b_v5.json");
  const json flat = nested["rope_parameters"];
  nested["rope_parameters"] = {
      {"full_attention", flat},
      {"sliding_attention", {{"rope_type", "default"}, {"rope_theta", 1e4}}}};
  CHECK(load(nested).to_json() == ref.to_json());
  nested["rope_parameters"].erase("full_attention");
  RLHF_CHECK_CONTAINS(refusal(nested), "no 'full_attention' entry");
  // v4 with the legacy "type" key.
  json legacy = read_fixture("llama3_2_1b_v4.json");
  legacy["rope_scaling"].erase("rope_type");
  legacy["rope_scaling"]["type"] = "llama3";
  CHECK(load(legacy).to_json() == ref.to_json());
  // No rope_theta at all (Llama 2 on the Hub): 10000. rope_scaling {} is no scaling.
  json bare = read_fixture("llama2_7b_v4.json");
  bare.erase("rope_theta");
  bare["rope_scaling"] = json::object();
  CHECK(load(bare).rope_theta == 10000.0);
  CHECK(load(bare).rope_scaling == model::RopeScaling{});
  // rope_theta both at the top and in rope_parameters: must agree.
  json both = read_fixture("qwen3_0_6b_v5.json");
  both["rope_theta"] = 1e6;
  CHECK(load(both).rope_theta == 1e6);
  both["rope_theta"] = 1e4;
  RLHF_CHECK_CONTAINS(refusal(both), "rope_theta 10000 disagrees with the rope_theta 1000000");
  // llama3 without original_max_position_embeddings: transformers v5 uses max_position_embeddings.
  json no_orig = read_fixture("llama3_2_1b_v5.json");
  no_orig["rope_parameters"].erase("original_max_position_embeddings");
  CHECK(load(no_orig).rope_scaling.original_max_position_embeddings == 131072);
  // Whole-head rotary factor is the only one.
  json prf = read_fixture("llama2_7b_v5.json");
  prf["rope_parameters"]["partial_rotary_factor"] = 1.0;
  CHECK(load(prf).hidden_size == 4096);
}

TEST_CASE("hf config.json: what changes the computation is refused by name") {
  struct Case {
    const char* fixture;
    std::function<void(json&)> edit;
    const char* message;
  };
  const std::vector<Case> cases = {
      {"llama3_2_1b_v4.json", [](json& j) { j["rope_scaling"]["rope_type"] = "yarn"; },
       "config.json: 'rope_scaling' has rope_type 'yarn', which is not supported"},
      {"llama3_2_1b_v4.json",
       [](json& j) {
         j["rope_scaling"] = {{"type", "dynamic"}, {"factor", 2.0}};
       },
       "config.json: 'rope_scaling' has rope_type 'dynamic', which is not supported"},
      {"llama2_7b_v5.json",
       [](json& j) {
         j["rope_parameters"] = {{"rope_type", "linear"}, {"factor", 2.0}};
       },
       "config.json: 'rope_parameters' has rope_type 'linear', which is not supported"},
      {"llama3_2_1b_v5.json", [](json& j) { j["rope_parameters"]["rope_type"] = "longrope"; },
       "'rope_parameters' has rope_type 'longrope'"},
      {"llama3_2_1b_v5.json", [](json& j) { j["rope_parameters"].erase("factor"); },
       "config.json: 'rope_parameters' of rope_type llama3 needs key 'factor'"},
      {"llama3_2_1b_v4.json", [](json& j) { j["rope_scaling"]["high_freq_factor"] = 0.5; },
       "rope_scaling high_freq_factor 0.5 must be greater than low_freq_factor 1"},
      {"llama3_2_1b_v4.json",
       [](json& j) {
         j["rope_parameters"] = {{"rope_theta", 5e5}};
       },
       "config.json: both 'rope_scaling' and 'rope_parameters' are set"},
      {"llama2_7b_v4.json", [](json& j) { j["partial_rotary_factor"] = 0.5; },
       "config.json: 'partial_rotary_factor' = 0.5 is not supported"},
      {"qwen2_5_0_5b_v5.json", [](json& j) { j["use_mrope"] = true; },
       "config.json: use_mrope = true is not supported"},
      {"qwen2_5_0_5b_v4.json",
       [](json& j) {
         j["use_sliding_window"] = true;
         j["sliding_window"] = 4096;
       },
       "config.json: 'use_sliding_window' is true with sliding_window 4096 < "
       "max_position_embeddings 32768: sliding-window attention is not supported"},
      {"qwen3_0_6b_v5.json",
       [](json& j) {
         j["use_sliding_window"] = true;
         j["sliding_window"] = 4096;
       },
       "config.json: 'use_sliding_window' is true with sliding_window 4096"},
      {"qwen3_0_6b_v5.json",
       [](json& j) {
         j["sliding_window"] = 4096;
         j["layer_types"][27] = "sliding_attention";
       },
       "config.json: 'layer_types' entry 27 is 'sliding_attention' with sliding_window 4096 < "
       "max_position_embeddings 40960"},
      {"qwen2_5_0_5b_v5.json", [](json& j) { j["layer_types"][3] = "linear_attention"; },
       "config.json: 'layer_types' entry 3 is 'linear_attention': only full attention is "
       "supported"},
      {"mistral_7b_v0_1_v4.json", [](json&) {},
       "config.json: 'sliding_window' 4096 is shorter than max_position_embeddings 32768: "
       "sliding-window attention is not supported\nhint: set max_position_embeddings to at most "
       "4096"},
      {"mistral_7b_v0_1_v5.json", [](json&) {}, "'sliding_window' 4096 is shorter than"},
      {"llama3_2_1b_v4.json", [](json& j) { j["mlp_bias"] = true; },
       "config.json: mlp_bias = true is not supported"},
      {"smollm2_135m_v5.json", [](json& j) { j["hidden_act"] = "gelu"; },
       "config.json: hidden_act \"gelu\" is not supported (only silu)"},
      {"mistral_7b_v0_3_v5.json", [](json& j) { j["attention_bias"] = true; },
       "config.json: attention_bias = true is not supported for model_type 'mistral'"},
      {"qwen3_0_6b_v4.json", [](json& j) { j["model_type"] = "qwen3_moe"; },
       "config.json: model_type 'qwen3_moe' is not supported"},
      {"llama2_7b_v4.json", [](json& j) { j["rope_scaling"] = "llama3"; },
       "config.json: key 'rope_scaling' must be an object or null"},
  };
  for (const Case& k : cases) {
    json j = read_fixture(k.fixture);
    k.edit(j);
    INFO(k.fixture << ": " << k.message);
    const std::string msg = refusal(j);
    RLHF_CHECK_CONTAINS(msg, k.message);
    // Refusals do not depend on the mode.
    RLHF_CHECK_CONTAINS(test::error_of([&] { load(j, ConfigKeys::kStrict); }), k.message);
  }
}

TEST_CASE("model config: qwen3 and explicit head_dim for every model type") {
  for (const char* type : {"llama", "mistral", "qwen2", "qwen3"}) {
    INFO(type);
    ModelConfig c;
    c.model_type = type;
    c.hidden_size = 64;
    c.num_attention_heads = 4;
    c.num_key_value_heads = 2;
    c.head_dim = 24;  // != 64 / 4
    c.validate();
    const json j = c.to_json();
    CHECK(j.at("head_dim") == 24);
    const ModelConfig back = ModelConfig::from_json(j, "t", ConfigKeys::kStrict);
    CHECK(back.head_dim == 24);
    CHECK(back.D() == 24);
    CHECK(back.model_type == type);
    CHECK(model::layer_spec(back).qkv_bias == (std::string(type) == "qwen2"));
    CHECK_FALSE(model::layer_spec(back).o_bias);
  }
  ModelConfig q3;
  q3.model_type = "qwen3";
  q3.attention_bias = true;  // Qwen3 with attention_bias: q, k, v and o biases, as HF's
  CHECK(model::layer_spec(q3).qkv_bias);
  CHECK(model::layer_spec(q3).o_bias);
}
