// Model config files: the example TOMLs, HF config.json, and errors with line:column. JSON files
// are read leniently (a HF config.json: unknown keys ignored), TOML files strictly (unknown keys
// are errors with the key's line:column); unsupported features are refused by name in both.
#include "io/model_config_file.h"

#include <nlohmann/json.hpp>

#include "io/jsonl.h"
#include "tests/io/io_test_util.h"

using namespace rlhf;

namespace {
std::string example(const std::string& name) {
  return std::string(RLHF_SOURCE_DIR) + "/examples/models/" + name;
}
}  // namespace

TEST_CASE("model config files: the examples") {
  // Parameter counts by hand: V·C + L·(C·q + 2·C·kv + q·C + 3·C·F + 2·C) + C (+ V·C untied).
  const auto tiny = io::load_model_config_file(example("tiny.toml"));
  CHECK(tiny.vocab_size == 259);
  CHECK(tiny.hidden_size == 128);
  CHECK(tiny.num_hidden_layers == 4);
  CHECK(tiny.num_attention_heads == 4);
  CHECK(tiny.num_key_value_heads == 2);
  CHECK(tiny.intermediate_size == 352);
  CHECK(tiny.max_position_embeddings == 512);
  CHECK(tiny.rope_style == model::RopeStyle::kRotateHalf);
  CHECK(tiny.tie_word_embeddings);
  CHECK(tiny.bos_token_id == 256);
  CHECK(tiny.eos_token_id == 257);
  CHECK(tiny.pad_token_id == 258);
  // 259·128 + 4·(2·128·128 + 2·128·64 + 3·128·352 + 2·128) + 128
  CHECK(tiny.num_parameters() == 771584);

  const auto s15 = io::load_model_config_file(example("stories15M.toml"));
  CHECK(s15.hidden_size == 288);
  CHECK(s15.num_hidden_layers == 6);
  CHECK(s15.num_attention_heads == 6);
  CHECK(s15.num_key_value_heads == 6);
  CHECK(s15.intermediate_size == 768);
  CHECK(s15.vocab_size == 32000);
  CHECK(s15.max_position_embeddings == 256);
  CHECK(s15.rope_style == model::RopeStyle::kInterleaved);
  CHECK(s15.tie_word_embeddings);
  // 32000·288 + 6·(4·288·288 + 3·288·768 + 2·288) + 288 (tied classifier)
  CHECK(s15.num_parameters() == 15191712);

  const auto smol = io::load_model_config_file(example("smollm-135M.toml"));
  CHECK(smol.hidden_size == 576);
  CHECK(smol.num_hidden_layers == 30);
  CHECK(smol.num_attention_heads == 9);
  CHECK(smol.num_key_value_heads == 3);
  CHECK(smol.D() == 64);
  CHECK(smol.intermediate_size == 1536);
  CHECK(smol.vocab_size == 49152);
  CHECK(smol.tie_word_embeddings);
  CHECK(smol.rope_theta == 10000.0);
  CHECK(smol.max_position_embeddings == 2048);
  // 49152·576 + 30·(2·576·576 + 2·576·192 + 3·576·1536 + 2·576) + 576
  CHECK(smol.num_parameters() == 134515008);
}

TEST_CASE("model config files: TOML and JSON agree; HF config.json keys accepted") {
  test::TempDir dir;
  const auto tiny = io::load_model_config_file(example("tiny.toml"));
  const std::string json = dir.write("config.json", tiny.to_json().dump(2));
  CHECK(io::load_model_config_file(json).to_json() == tiny.to_json());
  const std::string hf = dir.write("hf.json", R"({
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
    "intermediate_size": 176, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "vocab_size": 256, "torch_dtype": "bfloat16",
    "transformers_version": "4.44.0", "rope_scaling": null, "eos_token_id": [2, 3]})");
  const auto c = io::load_model_config_file(hf);
  CHECK(c.hidden_size == 64);
  CHECK(c.eos_token_id == 2);
}

TEST_CASE("model config files: errors carry line and column") {
  test::TempDir dir;
  const std::string base =
      "hidden_size = 64\n"
      "intermediate_size = 176\n"
      "num_hidden_layers = 2\n"
      "num_attention_heads = 4\n"
      "vocab_size = 256\n";
  CHECK(io::load_model_config_file(dir.write("ok.toml", base)).hidden_size == 64);

  std::string p = dir.write("syntax.toml", base + "rope_theta = = 3\n");
  RLHF_CHECK_CONTAINS(test::error_of([&] { io::load_model_config_file(p); }),
                      p + ":6:14: TOML parse error: ");

  p = dir.write("unknown.toml", base + "\n  hiden_size = 3\n");
  std::string msg = test::error_of([&] { io::load_model_config_file(p); });
  CHECK(msg == p + ":7:3: unknown model config key 'hiden_size'");

  p = dir.write("type.toml",
                "vocab_size = 256\nhidden_size = \"64\"\nintermediate_size = 176\n"
                "num_hidden_layers = 2\nnum_attention_heads = 4\n");
  RLHF_CHECK_CONTAINS(test::error_of([&] { io::load_model_config_file(p); }),
                      p + ":2:1: key 'hidden_size' must be an integer");

  p = dir.write("invalid.toml", base + "num_key_value_heads = 3\n");
  RLHF_CHECK_CONTAINS(test::error_of([&] { io::load_model_config_file(p); }),
                      p + ":4:1: num_attention_heads 4 is not divisible by num_key_value_heads 3");

  p = dir.write("rope.toml", base + "rope_style = \"sideways\"\n");
  RLHF_CHECK_CONTAINS(test::error_of([&] { io::load_model_config_file(p); }),
                      p + ":6:1: unknown rope_style 'sideways'");

  p = dir.write("missing_key.toml", "hidden_size = 64\n");
  RLHF_CHECK_CONTAINS(test::error_of([&] { io::load_model_config_file(p); }),
                      p + ": missing required key");

  p = dir.write("bad.json", "{\n  \"hidden_size\": 64,\n  \"vocab_size\": 256,,\n}\n");
  RLHF_CHECK_CONTAINS(test::error_of([&] { io::load_model_config_file(p); }),
                      p + ":3:21: malformed JSON: ");
  p = dir.write("unknown.json", "{\"hidden_size\": 64, \"foo\": 1}");
  RLHF_CHECK_CONTAINS(test::error_of([&] { io::load_model_config_file(p); }),
                      p + ": missing required key 'intermediate_size'");

  const std::string missing = dir.file("none.toml");
  CHECK(test::error_of([&] { io::load_model_config_file(missing); }) ==
        "cannot open " + missing + ": No such file or directory");
  RLHF_CHECK_CONTAINS(test::error_of([&] { io::load_model_config_file(dir.write("c.yaml", "")); }),
                      "unsupported model config format '.yaml'");
}

TEST_CASE("model config files: JSON is lenient, TOML is strict") {
  test::TempDir dir;
  const std::string base =
      "hidden_size = 64\n"
      "intermediate_size = 176\n"
      "num_hidden_layers = 2\n"
      "num_attention_heads = 4\n"
      "vocab_size = 256\n";
  // A config.json as transformers v5 writes it, plus keys we do not know: loads.
  const std::string hf =
      std::string(RLHF_SOURCE_DIR) + "/tests/fixtures/hf_configs/llama3_2_1b_v5.json";
  nlohmann::json j = io::parse_json_file(hf);
  j["_model_name_or_path"] = "meta-llama/Llama-3.2-1B";
  j["some_future_key"] = true;
  const auto c = io::load_model_config_file(dir.write("config.json", j.dump(2)));
  CHECK(c.hidden_size == 2048);
  CHECK(c.rope_theta == 500000.0);
  CHECK(c.rope_scaling.rope_type == "llama3");
  CHECK(c.rope_scaling.factor == 32.0);
  CHECK(c.rope_scaling.original_max_position_embeddings == 8192);

  // The same unknown key in TOML: an error at its line and column.
  std::string p = dir.write("unknown.toml", base + "some_future_key = true\n");
  CHECK(test::error_of([&] { io::load_model_config_file(p); }) ==
        p + ":6:1: unknown model config key 'some_future_key'");

  // HF keys that do not change the computation are fine in TOML too.
  p = dir.write("hf_keys.toml", base + "torch_dtype = \"bfloat16\"\nattention_dropout = 0.0\n");
  CHECK(io::load_model_config_file(p).hidden_size == 64);

  // llama3 rope scaling as a TOML table.
  const std::string llama3 =
      "rope_theta = 500000.0\n"
      "max_position_embeddings = 131072\n"
      "\n"
      "[rope_scaling]\n"
      "rope_type = \"llama3\"\n"
      "factor = 32.0\n"
      "low_freq_factor = 1.0\n"
      "high_freq_factor = 4.0\n"
      "original_max_position_embeddings = 8192\n";
  p = dir.write("llama3.toml", base + llama3);
  const auto t = io::load_model_config_file(p);
  CHECK(t.rope_scaling == c.rope_scaling);
  CHECK(t.rope_theta == 500000.0);

  // Errors inside the table point at the table's name in its header.
  p = dir.write("llama3_typo.toml", base + llama3 + "low_freq_factr = 1.0\n");
  CHECK(test::error_of([&] { io::load_model_config_file(p); }) ==
        p + ":9:2: unknown model config key 'rope_scaling.low_freq_factr'");
  p = dir.write("yarn.toml", base + "\n[rope_scaling]\nrope_type = \"yarn\"\nfactor = 4.0\n");
  RLHF_CHECK_CONTAINS(test::error_of([&] { io::load_model_config_file(p); }),
                      p + ":7:2: 'rope_scaling' has rope_type 'yarn', which is not supported");

  // Refusals by name, with the key's position.
  p = dir.write("mlp_bias.toml", base + "mlp_bias = true\n");
  CHECK(test::error_of([&] { io::load_model_config_file(p); }) ==
        p + ":6:1: mlp_bias = true is not supported (the MLP projections have no bias)");
  p = dir.write("gelu.toml", base + "hidden_act = \"gelu\"\n");
  RLHF_CHECK_CONTAINS(test::error_of([&] { io::load_model_config_file(p); }),
                      p + ":6:1: hidden_act \"gelu\" is not supported (only silu)");
  p = dir.write("window.toml", "model_type = \"mistral\"\nsliding_window = 128\n" + base);
  RLHF_CHECK_CONTAINS(test::error_of([&] { io::load_model_config_file(p); }),
                      p + ":2:1: 'sliding_window' 128 is shorter than max_position_embeddings "
                          "2048: sliding-window attention is not supported");
  // In JSON the same refusals, without a position.
  p = dir.write("mlp_bias.json", R"({"hidden_size": 64, "intermediate_size": 176,
    "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 256, "mlp_bias": true})");
  CHECK(test::error_of([&] { io::load_model_config_file(p); }) ==
        p + ": mlp_bias = true is not supported (the MLP projections have no bias)");
}
