// Sizes read from configs and files are bounded before use (model/config.h kMax*): a model config
// with 2^61 positions or a 2^40-token vocabulary, in TOML, in a HF config.json, in the config
// attribute of an rlhf HDF5 checkpoint, or a GGUF with a 2^32 - 1 context, is an rlhf::Error
// naming the file, the key and the limit (it used to wrap P·D/2 and segfault, or end in a bare
// std::bad_alloc); a failed allocation names what and how much (core/checked_alloc.h); an empty
// prompt file says so.
#include <nlohmann/json.hpp>

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "core/checked_alloc.h"
#include "io/gguf.h"
#include "io/hdf5_ckpt.h"
#include "io/llama2c.h"
#include "io/model_config_file.h"
#include "io/pretrained.h"
#include "io/tokenizer.h"
#include "model/config.h"
#include "model/layout.h"
#include "rl/prompts.h"
#include "tests/io/io_test_util.h"

using namespace rlhf;

namespace {

constexpr int64_t k2p61 = int64_t{1} << 61;  // 2305843009213693952
constexpr int64_t k2p40 = int64_t{1} << 40;  // 1099511627776

// examples/models/tiny.toml with `key` set to `value`.
std::string tiny_toml(const std::string& key, int64_t value) {
  std::string s =
      "model_type = \"llama\"\nvocab_size = 259\nhidden_size = 128\nintermediate_size = 352\n"
      "num_hidden_layers = 4\nnum_attention_heads = 4\nnum_key_value_heads = 2\n"
      "max_position_embeddings = 512\nrms_norm_eps = 1e-5\nrope_theta = 10000.0\n"
      "tie_word_embeddings = true\nbos_token_id = 256\neos_token_id = 257\npad_token_id = 258\n";
  const size_t at = s.find(key + " = ");
  REQUIRE(at != std::string::npos);
  const size_t eol = s.find('\n', at);
  return s.substr(0, at) + key + " = " + std::to_string(value) + s.substr(eol);
}

nlohmann::json tiny_json(const std::string& key, int64_t value) {
  model::ModelConfig c;
  c.hidden_size = 128;
  c.intermediate_size = 352;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.vocab_size = 259;
  c.max_position_embeddings = 512;
  nlohmann::json j = c.to_json();
  j[key] = value;
  return j;
}

}  // namespace

TEST_CASE(
    "bounds: a TOML model config with 2^61 positions or a 2^40 vocabulary is refused by name") {
  test::TempDir dir;
  const std::string huge = dir.write("huge.toml", tiny_toml("max_position_embeddings", k2p61));
  std::string e = test::error_of([&] { io::load_model_config_file(huge); });
  CHECK_MESSAGE(e.find(huge) != std::string::npos, e);
  CHECK_MESSAGE(e.find("max_position_embeddings 2305843009213693952 exceeds the limit 16777216 "
                       "(2^24)") != std::string::npos,
                e);
  const std::string vocab = dir.write("vocab.toml", tiny_toml("vocab_size", k2p40));
  e = test::error_of([&] { io::load_model_config_file(vocab); });
  CHECK_MESSAGE(e.find(vocab) != std::string::npos, e);
  CHECK_MESSAGE(e.find("vocab_size 1099511627776 exceeds the limit 16777216") != std::string::npos,
                e);
}

TEST_CASE("bounds: a HF config.json with 2^61 positions is refused by name (file and folder)") {
  test::TempDir dir;
  const std::string cfg =
      dir.write("config.json", tiny_json("max_position_embeddings", k2p61).dump());
  std::string e = test::error_of([&] { io::load_model_config_file(cfg); });
  CHECK_MESSAGE(e.find(cfg) != std::string::npos, e);
  CHECK_MESSAGE(
      e.find("max_position_embeddings 2305843009213693952 exceeds the limit") != std::string::npos,
      e);
  // As a Hugging Face model folder (--pretrain dir): the config is read before any weights.
  e = test::error_of([&] { io::open_pretrained(dir.path().string()); });
  CHECK_MESSAGE(e.find("config.json") != std::string::npos, e);
  CHECK_MESSAGE(
      e.find("max_position_embeddings 2305843009213693952 exceeds the limit") != std::string::npos,
      e);
  dir.write("config.json", tiny_json("vocab_size", k2p40).dump());
  e = test::error_of([&] { io::open_pretrained(dir.path().string()); });
  CHECK_MESSAGE(e.find("vocab_size 1099511627776 exceeds the limit") != std::string::npos, e);
}

TEST_CASE("bounds: an HDF5 checkpoint whose config attribute has 2^61 positions is refused") {
  test::TempDir dir;
  const std::string path = dir.file("huge.h5");
  {
    io::CheckpointWriter w(path);
    w.write_string_attr("/model", "config", tiny_json("max_position_embeddings", k2p61).dump());
    w.write_string_attr("/model", "head", "lm");
    w.commit();
  }
  std::string e = test::error_of([&] { io::load_model_config_hdf5(path); });
  CHECK_MESSAGE(e.find(path + ":/model") != std::string::npos, e);
  CHECK_MESSAGE(e.find("max_position_embeddings 2305843009213693952 exceeds the limit 16777216") !=
                    std::string::npos,
                e);
  e = test::error_of([&] { io::open_pretrained(path); });
  CHECK_MESSAGE(
      e.find("max_position_embeddings 2305843009213693952 exceeds the limit") != std::string::npos,
      e);
}

TEST_CASE("bounds: a GGUF with a context of 2^32 - 1 positions is refused by its key") {
  io::GgufWriter g;
  g.add_string("general.architecture", "llama");
  g.add_u32("llama.embedding_length", 8);
  g.add_u32("llama.block_count", 1);
  g.add_u32("llama.feed_forward_length", 16);
  g.add_u32("llama.attention.head_count", 2);
  g.add_u32("llama.context_length", 0xFFFFFFFFu);
  g.add_tensor("token_embd.weight", {8, 16}, io::DType::kF32,
               [](float* out) { std::fill(out, out + 8 * 16, 0.5f); });
  const std::string bytes = g.to_bytes();
  const io::GgufFile f = io::parse_gguf(io::blob_from_string(bytes, "ctx.gguf"));
  const std::string e = test::error_of([&] { io::gguf_model_config(f); });
  CHECK_MESSAGE(e.find("ctx.gguf: GGUF metadata llama.context_length = 4294967295 exceeds the "
                       "limit 16777216 (max_position_embeddings)") != std::string::npos,
                e);
  // And from a file, as --pretrain opens it.
  test::TempDir dir;
  const std::string path = dir.write("ctx.gguf", bytes);
  const std::string e2 = test::error_of([&] { io::open_pretrained(path); });
  CHECK_MESSAGE(e2.find("llama.context_length = 4294967295 exceeds the limit") != std::string::npos,
                e2);
}

TEST_CASE("bounds: a llama2.c header past the model limits is refused by its field name") {
  // v1 header: magic, version, dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab, seq_len,
  // shared flag; dim 2^18 passes the format's own plausibility range but not hidden_size's bound,
  // which is checked before the file size.
  std::string s;
  auto put = [&](auto v) { s.append(reinterpret_cast<const char*>(&v), sizeof(v)); };
  put(io::kLlama2cMagic);
  put(int32_t{1});
  for (int32_t v : {1 << 18, 16, 1, 2, 2, 8, 16}) put(v);
  put(uint8_t{1});
  s.resize(256);
  const std::string e =
      test::error_of([&] { io::parse_llama2c_header(io::blob_from_string(s, "big.bin")); });
  CHECK_MESSAGE(e.find("big.bin: llama2.c header: dim 262144 exceeds the limit 131072 "
                       "(hidden_size)") != std::string::npos,
                e);
}

TEST_CASE(
    "bounds: every limit is accepted, one past it refused, and the largest model's sizes fit") {
  model::ModelConfig c;
  c.hidden_size = model::kMaxHiddenSize;
  c.intermediate_size = model::kMaxIntermediateSize;
  c.num_hidden_layers = model::kMaxHiddenLayers;
  c.num_attention_heads = model::kMaxAttentionHeads;
  c.num_key_value_heads = model::kMaxAttentionHeads;
  c.head_dim = model::kMaxAttentionWidth / model::kMaxAttentionHeads;
  c.vocab_size = model::kMaxVocabSize;
  c.max_position_embeddings = model::kMaxPositionEmbeddings;
  c.tie_word_embeddings = false;
  c.attention_bias = true;
  c.validate("max.toml");
  // The largest products the code forms stay far below int64 (and size_t) overflow.
  const int64_t params = c.num_parameters();
  CHECK(params > 0);
  CHECK(params < (int64_t{1} << 53));
  CHECK(static_cast<double>(params) * 4 * 5 < 0x1p62);  // fp32 bytes of params, grads, AdamW
  CHECK(c.max_position_embeddings * (c.D() / 2) <= (int64_t{1} << 35));
  const model::ParamLayout layout(c, model::HeadKind::kLM);
  for (const auto& u : layout.units()) CHECK(u.numel > 0);

  struct Field {
    const char* name;
    int64_t model::ModelConfig::*field;
    int64_t limit;
  };
  const Field fields[] = {
      {"hidden_size", &model::ModelConfig::hidden_size, model::kMaxHiddenSize},
      {"intermediate_size", &model::ModelConfig::intermediate_size, model::kMaxIntermediateSize},
      {"num_hidden_layers", &model::ModelConfig::num_hidden_layers, model::kMaxHiddenLayers},
      {"vocab_size", &model::ModelConfig::vocab_size, model::kMaxVocabSize},
      {"max_position_embeddings", &model::ModelConfig::max_position_embeddings,
       model::kMaxPositionEmbeddings},
      {"head_dim", &model::ModelConfig::head_dim, model::kMaxHeadDim},
  };
  for (const Field& f : fields) {
    INFO(f.name);
    model::ModelConfig t;  // the defaults (a 288-wide llama) with one field past its limit
    t.head_dim = 48;
    t.*f.field = f.limit + (f.field == &model::ModelConfig::head_dim ? 2 : 1);
    const std::string e = test::error_of([&] { t.validate("cfg.toml"); });
    CHECK_MESSAGE(e.find(fmt::format("cfg.toml: {} {} exceeds the limit {}", f.name, t.*f.field,
                                     f.limit)) != std::string::npos,
                  e);
  }
  model::ModelConfig heads;
  heads.num_attention_heads = heads.num_key_value_heads = model::kMaxAttentionHeads * 2;
  heads.head_dim = 2;
  CHECK(test::error_of([&] {
          heads.validate("h.json");
        }).find("h.json: num_attention_heads 8192 exceeds the limit 4096") != std::string::npos);
  model::ModelConfig wide;
  wide.num_attention_heads = wide.num_key_value_heads = 1024;
  wide.head_dim = 2048;
  CHECK(test::error_of([&] {
          wide.validate("w.json");
        }).find("num_attention_heads x head dim 2097152 exceeds the limit 1048576") !=
        std::string::npos);
  model::ModelConfig implied;  // head dim hidden_size / heads = 8192
  implied.hidden_size = 8192;
  implied.num_attention_heads = implied.num_key_value_heads = 1;
  CHECK(test::error_of([&] {
          implied.validate("i.json");
        }).find("head dim (hidden_size / num_attention_heads) 8192 exceeds the limit 4096") !=
        std::string::npos);
}

TEST_CASE("checked_alloc: a failed allocation names what and how many bytes") {
  std::vector<float> v;
  // 2^60 floats (4 EiB): within max_size(), beyond any address space: std::bad_alloc inside.
  std::string e =
      test::error_of([&] { checked_resize(v, int64_t{1} << 60, "the RoPE cos table"); });
  CHECK_MESSAGE(e.find("cannot allocate 4611686018427387904 bytes") != std::string::npos, e);
  CHECK_MESSAGE(e.find("for the RoPE cos table: out of memory") != std::string::npos, e);
  // Past max_size() (no allocation attempted), and a negative (wrapped) size.
  e = test::error_of([&] { checked_assign(v, int64_t{1} << 62, 0.0f, "a unit shard"); });
  CHECK_MESSAGE(
      e.find("for a unit shard: more than the address space can hold") != std::string::npos, e);
  e = test::error_of([&] { checked_resize(v, -8, "the KV cache"); });
  CHECK_MESSAGE(e.find("for the KV cache: negative size") != std::string::npos, e);
  // Kept in a variable that outlives the call, so that the compiler cannot elide the
  // new[]/delete[].
  static std::unique_ptr<float[]> kept;
  e = test::error_of([&] { kept = checked_new_array<float>(int64_t{1} << 60, "the KV cache"); });
  CHECK_MESSAGE(e.find("cannot allocate 4611686018427387904 bytes") != std::string::npos, e);
  CHECK(v.empty());
  // Normal sizes work; grow never shrinks.
  checked_resize(v, 10, "x");
  CHECK(v.size() == 10);
  checked_grow(v, 4, "x");
  CHECK(v.size() == 10);
  checked_grow(v, 12, "x");
  CHECK(v.size() == 12);
  CHECK(checked_new_array<int>(3, "y") != nullptr);
}

TEST_CASE("prompts: an empty prompt file says it has no records; skipped prompts say why") {
  test::TempDir dir;
  model::ModelConfig c;
  c.vocab_size = 259;
  c.bos_token_id = 256;
  c.eos_token_id = 257;
  c.pad_token_id = 258;
  io::ByteTokenizer tok;
  rl::PromptOptions o;
  o.prompt_data = dir.write("empty.jsonl", "");
  std::string e = test::error_of([&] { rl::load_prompts(o, tok, c, 0); });
  CHECK_MESSAGE(e.find(o.prompt_data + ": the file has no prompt records") != std::string::npos, e);
  CHECK_MESSAGE(e.find("longer than") == std::string::npos, e);
  o.prompt_data = dir.write("long.jsonl", "{\"input\": \"a long prompt\"}\n");
  o.prompt_max_len = 2;
  e = test::error_of([&] { rl::load_prompts(o, tok, c, 0); });
  CHECK_MESSAGE(
      e.find("no usable prompt: all 1 are longer than --prompt_max_len 2") != std::string::npos, e);
}
