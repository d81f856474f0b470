// Model config files: the example TOMLs, HF config.json, and errors with line:column.
#include "io/model_config_file.h"

#include <nlohmann/json.hpp>

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
  RLHF_CHECK_CONTAINS(test::error_of([&] { io::load_model_config_file(p); }), p + ": ");

  const std::string missing = dir.file("none.toml");
  CHECK(test::error_of([&] { io::load_model_config_file(missing); }) ==
        "cannot open " + missing + ": No such file or directory");
  RLHF_CHECK_CONTAINS(test::error_of([&] { io::load_model_config_file(dir.write("c.yaml", "")); }),
                      "unsupported model config format '.yaml'");
}
