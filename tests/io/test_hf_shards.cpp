// Sharded Hugging Face exports (io/hf_shards.h, io::export_hf_folder): sizes parse as
// huggingface_hub parses them, shards are cut as split_state_dict_into_shards cuts them (its
// docstring's example), tensors follow transformers' state-dict order, and a bf16 export split
// into several files reads back through the import path equal to the bf16-rounded weights, with
// the index transformers writes; a later export that fits one file replaces the shards.
#include "io/hf_shards.h"

#include <nlohmann/json.hpp>

#include <cstring>
#include <filesystem>
#include <regex>
#include <set>

#include "io/hdf5_ckpt.h"
#include "io/pretrained.h"
#include "io/safetensors.h"
#include "model/init.h"
#include "tests/io/io_test_util.h"
#include "tests/test_util.h"

using namespace rlhf;
namespace fs = std::filesystem;

namespace {

// Round-to-nearest-even fp32 → bf16 → fp32 (the reference the export must match; finite input).
float bf16_round(float x) {
  uint32_t b;
  std::memcpy(&b, &x, 4);
  b += 0x7fffu + ((b >> 16) & 1u);
  b &= 0xffff0000u;
  float y;
  std::memcpy(&y, &b, 4);
  return y;
}

model::ModelConfig qwen2_small() {
  model::ModelConfig c;
  c.model_type = "qwen2";
  c.hidden_size = 64;
  c.intermediate_size = 96;
  c.num_hidden_layers = 3;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.vocab_size = 97;
  c.max_position_embeddings = 64;
  c.bos_token_id = c.eos_token_id = c.pad_token_id = 0;
  return c;
}

}  // namespace

TEST_CASE("hf shards: sizes parse like huggingface_hub's parse_size_to_int") {
  CHECK(io::parse_shard_size("5GB") == 5'000'000'000);
  CHECK(io::parse_shard_size(io::kDefaultMaxShardSize) == 5'000'000'000);
  CHECK(io::parse_shard_size("500MB") == 500'000'000);
  CHECK(io::parse_shard_size("1.5kb") == 1500);
  CHECK(io::parse_shard_size("2GiB") == 2147483648);
  CHECK(io::parse_shard_size(" 10 MiB ") == 10485760);
  CHECK(io::parse_shard_size("4096") == 4096);
  for (const char* bad : {"", "GB", "5XB", "-1GB", "0", "five"})
    RLHF_CHECK_CONTAINS(test::error_of([&] { io::parse_shard_size(bad); }), "is not a shard size");
}

TEST_CASE("hf shards: cut as split_state_dict_into_shards cuts") {
  // Its docstring: limit 10, sizes [6, 6, 2, 6, 2, 2] -> [6], [6+2], [6+2+2].
  const std::vector<int64_t> b = {6, 6, 2, 6, 2, 2};
  const std::vector<size_t> order = {0, 1, 2, 3, 4, 5};
  using V = std::vector<std::vector<size_t>>;
  CHECK(io::plan_hf_shards(b, order, 10) == V{{0}, {1, 2}, {3, 4, 5}});
  // A tensor above the limit gets a shard of its own, placed before the shard being filled.
  CHECK(io::plan_hf_shards({3, 12, 3, 5}, {0, 1, 2, 3}, 10) == V{{1}, {0, 2}, {3}});
  CHECK(io::plan_hf_shards(b, order, 1000) == V{{0, 1, 2, 3, 4, 5}});
  CHECK(io::hf_shard_file_name(0, 1) == "model.safetensors");
  CHECK(io::hf_shard_file_name(1, 12) == "model-00002-of-00012.safetensors");
}

TEST_CASE("hf shards: transformers' state-dict order") {
  // Qwen2ForCausalLM(...).state_dict().keys() for one layer, untied.
  const std::vector<std::string> hf = {"model.embed_tokens.weight",
                                       "model.layers.0.self_attn.q_proj.weight",
                                       "model.layers.0.self_attn.q_proj.bias",
                                       "model.layers.0.self_attn.k_proj.weight",
                                       "model.layers.0.self_attn.k_proj.bias",
                                       "model.layers.0.self_attn.v_proj.weight",
                                       "model.layers.0.self_attn.v_proj.bias",
                                       "model.layers.0.self_attn.o_proj.weight",
                                       "model.layers.0.mlp.gate_proj.weight",
                                       "model.layers.0.mlp.up_proj.weight",
                                       "model.layers.0.mlp.down_proj.weight",
                                       "model.layers.0.input_layernorm.weight",
                                       "model.layers.0.post_attention_layernorm.weight",
                                       "model.layers.1.self_attn.q_proj.weight",
                                       "model.norm.weight",
                                       "lm_head.weight"};
  // Any permutation comes back in that order; layer 10 sorts after layer 2 (numbers, not text).
  std::vector<std::string> shuffled = {hf[15], hf[3], hf[14], hf[12], hf[0],  hf[7], hf[1], hf[9],
                                       hf[13], hf[2], hf[11], hf[4],  hf[10], hf[6], hf[8], hf[5]};
  const auto order = io::hf_state_dict_order(shuffled);
  std::vector<std::string> got;
  for (size_t i : order) got.push_back(shuffled[i]);
  CHECK(got == hf);
  const auto o2 = io::hf_state_dict_order(
      {"model.layers.10.mlp.up_proj.weight", "model.layers.2.mlp.up_proj.weight"});
  CHECK(o2 == std::vector<size_t>{1, 0});
}

TEST_CASE("hf shards: a bf16 export split into shards imports back bf16-rounded") {
  test::TempDir dir;
  const model::ModelConfig cfg = qwen2_small();
  const model::ParamLayout layout(cfg, model::HeadKind::kLM);
  std::vector<std::vector<float>> units;
  std::vector<const float*> ptrs;
  for (int u = 0; u < layout.num_units(); ++u) {
    units.emplace_back(size_t(layout.unit(u).numel));
    model::init_unit_params(units.back().data(), layout.unit(u), 11, 0.5);
  }
  for (auto& u : units) ptrs.push_back(u.data());
  const std::string h5 = dir.file("x.h5");
  io::save_model_hdf5(h5, layout, ptrs, nullptr);
  const io::PretrainedModel x = io::open_pretrained(h5);

  const std::string hf = dir.file("hf");
  const int64_t max_bytes = 20'000;  // the embedding (97·64·2 = 12416 B) and a layer's MLP split
  io::export_hf_folder(hf, x, io::DType::kBF16, max_bytes);
  CHECK_FALSE(fs::exists(hf + "/model.safetensors"));
  const auto index = nlohmann::json::parse(test::slurp(hf + "/model.safetensors.index.json"));
  const auto& wm = index.at("weight_map");
  // Every tensor listed once, in a file named model-0000k-of-0000n.safetensors that holds it.
  int64_t total = 0, n_tensors = 0;
  std::set<std::string> files;
  static const std::regex name_re(R"(model-(\d{5})-of-(\d{5})\.safetensors)");
  for (const auto& u : layout.units()) {
    for (const auto& t : u.tensors) {
      REQUIRE(wm.contains(t.name));
      const std::string f = wm[t.name].get<std::string>();
      CHECK(std::regex_match(f, name_re));
      files.insert(f);
      total += t.numel * 2;
      ++n_tensors;
    }
  }
  CHECK(int64_t(wm.size()) == n_tensors);
  CHECK(files.size() > 2);
  CHECK(index.at("metadata").at("total_size") == total);
  CHECK(index.at("metadata").at("total_parameters") == cfg.num_parameters(model::HeadKind::kLM));
  // transformers' json.dumps(index, indent=2, sort_keys=True) + "\n".
  CHECK(test::slurp(hf + "/model.safetensors.index.json") == index.dump(2) + "\n");
  for (const std::string& f : files) {
    const io::SafetensorsFile st = io::open_safetensors(hf + "/" + f);
    int64_t bytes = 0;
    for (const auto& [name, e] : st.tensors) {
      CHECK(wm.at(name) == f);
      CHECK(e.dtype == io::DType::kBF16);
      bytes += e.end - e.begin;
    }
    // Within the limit unless the shard is one tensor larger than it.
    CHECK((bytes <= max_bytes || st.tensors.size() == 1));
    CHECK(st.metadata.at("format") == "pt");
  }
  // The import path reads the shards back: the bf16-rounded weights, exactly.
  const io::PretrainedModel y = io::open_pretrained(hf);
  CHECK(y.config.to_json() == x.config.to_json());
  for (int u = 0; u < layout.num_units(); ++u) {
    for (const auto& t : layout.unit(u).tensors) {
      std::vector<float> got(size_t(t.numel));
      y.tensors->read_checked(t.name, got.data(), t.shape);
      size_t bad = 0;
      for (int64_t i = 0; i < t.numel; ++i)
        if (got[size_t(i)] != bf16_round(units[size_t(u)][size_t(t.offset + i)])) ++bad;
      CHECK_MESSAGE(bad == 0, t.name);
    }
  }
  // An export that fits one file replaces the shards and the index.
  io::export_hf_folder(hf, x, io::DType::kBF16);
  CHECK(fs::exists(hf + "/model.safetensors"));
  CHECK_FALSE(fs::exists(hf + "/model.safetensors.index.json"));
  for (const std::string& f : files) CHECK_FALSE(fs::exists(hf + "/" + f));
}
