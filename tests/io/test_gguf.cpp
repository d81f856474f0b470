// GGUF: the real llama-2-tiny-random.gguf loads with the metadata and shapes the README states;
// a GGUF we write from a known model reads back identical (F32 bitwise, F16/BF16 to their
// rounding); quantised Q8_0/Q4_0/Q4_1 blocks dequantise per ggml's formulas; truncated and
// bit-flipped copies are clear errors.
#include "io/gguf.h"

#include <cmath>
#include <cstring>
#include <filesystem>

#include "io/pretrained.h"
#include "io/spm_tokenizer.h"
#include "model/layout.h"
#include "model/local_provider.h"
#include "model/transformer.h"
#include "tests/io/corrupt_util.h"
#include "tests/io/io_test_util.h"
#include "tests/test_util.h"

using namespace rlhf;

namespace {

std::string data_path(const std::string& rel) {
  return test::shared_data_path(rel);
}
const char* const kGguf = "llama-2-tiny-random-gguf/llama-2-tiny-random.gguf";

// Everything a GGUF model load does, from bytes: parse, config, every tensor, the tokenizer.
void load_all(const std::string& bytes) {
  auto f =
      std::make_shared<io::GgufFile>(io::parse_gguf(io::blob_from_string(bytes, "mutant.gguf")));
  const model::ModelConfig c = io::gguf_model_config(*f);
  auto t = io::open_gguf_tensors(f, c);
  const model::ParamLayout layout(c, model::HeadKind::kLM);
  std::vector<float> buf;
  for (const auto& u : layout.units())
    for (const auto& ti : u.tensors) {
      buf.resize(size_t(ti.numel));
      t->read_checked(ti.name, buf.data(), ti.shape);
    }
  auto tok = io::load_gguf_tokenizer(*f);
  if (tok) tok->decode(tok->encode("Once upon a time", true, true));
}

// A minimal GGUF with one tensor of `type` (ggml id) holding `data`, ne = {n}.
std::string one_tensor_gguf(uint32_t type, uint64_t n, const std::string& data) {
  std::string s;
  auto put = [&](auto v) { s.append(reinterpret_cast<const char*>(&v), sizeof(v)); };
  auto str = [&](const std::string& x) {
    put(uint64_t(x.size()));
    s += x;
  };
  put(io::kGgufMagic);
  put(uint32_t(3));
  put(uint64_t(1));  // tensors
  put(uint64_t(0));  // kv
  str("t");
  put(uint32_t(1));
  put(n);
  put(type);
  put(uint64_t(0));
  while (s.size() % 32) s.push_back('\0');
  return s + data;
}

}  // namespace

TEST_CASE("gguf: llama-2-tiny-random loads with the README's metadata and shapes") {
  const std::string path = data_path(kGguf);
  if (path.empty()) {
    MESSAGE("skipped: ../shared/data not found (set RLHF_SHARED_DATA)");
    return;
  }
  const io::GgufFile f = io::open_gguf(path);
  CHECK(f.version == 3);
  CHECK(f.tensors.size() == 12);
  int f16 = 0, f32 = 0;
  for (const auto& [name, info] : f.tensors) {
    f16 += info.type == io::DType::kF16;
    f32 += info.type == io::DType::kF32;
  }
  CHECK(f16 == 9);  // README: 9 F16 + 3 F32 tensors
  CHECK(f32 == 3);
  CHECK(f.metadata.at("general.architecture") == "llama");
  CHECK(f.metadata.at("tokenizer.ggml.model") == "llama");
  CHECK(f.metadata.at("tokenizer.ggml.tokens").size() == 32000);
  CHECK(f.tensor_order.front() == "token_embd.weight");

  const io::PretrainedModel m = io::open_pretrained(path);
  CHECK(m.format == "gguf");
  CHECK(m.detail == "GGUF v3 (F16+F32)");
  const model::ModelConfig& c = m.config;
  CHECK(c.hidden_size == 8);  // embedding 8, 1 block, 2 heads, ffn 32
  CHECK(c.num_hidden_layers == 1);
  CHECK(c.num_attention_heads == 2);
  CHECK(c.num_key_value_heads == 2);
  CHECK(c.intermediate_size == 32);
  CHECK(c.vocab_size == 32000);
  CHECK(c.max_position_embeddings == 4096);
  CHECK(c.rms_norm_eps == 1e-5);       // stored as f32; read back as the shortest decimal
  CHECK_FALSE(c.tie_word_embeddings);  // untied output
  CHECK(c.rope_style == model::RopeStyle::kRotateHalf);
  CHECK(m.tensors->find("model.embed_tokens.weight")->shape == std::vector<int64_t>{32000, 8});
  CHECK(m.tensors->find("lm_head.weight")->shape == std::vector<int64_t>{32000, 8});
  CHECK(m.tensors->find("model.layers.0.mlp.gate_proj.weight")->shape ==
        std::vector<int64_t>{32, 8});
  CHECK(m.tensors->find("model.layers.0.mlp.down_proj.weight")->shape ==
        std::vector<int64_t>{8, 32});
  CHECK(m.tensors->find("model.layers.0.self_attn.q_proj.weight")->dtype == "F16");
  CHECK(m.tensors->find("model.norm.weight")->dtype == "F32");
  // Q rows come back in HF order: llama.cpp's permutation undone.
  std::vector<float> raw(64), hf(64);
  f.read_f32("blk.0.attn_q.weight", raw.data());
  m.tensors->read_checked("model.layers.0.self_attn.q_proj.weight", hf.data(), {8, 8});
  io::permute_qk_rows(hf.data(), 2, 4, 8, /*to_interleaved=*/true);
  CHECK(hf == raw);
  // The model runs: finite logits.
  model::ParamLayout layout(c, m.head);
  model::LocalParams<float> p(layout);
  for (int u = 0; u < layout.num_units(); ++u) io::load_pretrained_unit(m, layout, u, p.params(u));
  const auto ids = m.tokenizer->encode("Once upon a time", true, false);
  std::vector<float> logits(ids.size() * 32000);
  model::Transformer<float>(layout).forward_logits(p, ids.data(), 1, int64_t(ids.size()),
                                                   logits.data());
  int64_t finite = 0;
  for (float x : logits) finite += std::isfinite(x);
  CHECK(finite == int64_t(logits.size()));
}

TEST_CASE("gguf: a GGUF we write from a known model reads back identical") {
  const std::string src = data_path("tinystories-656k/bf16_upstream");
  if (src.empty()) {
    MESSAGE("skipped: ../shared/data not found (set RLHF_SHARED_DATA)");
    return;
  }
  test::TempDir dir;
  const io::PretrainedModel m = io::open_pretrained(src);
  const model::ParamLayout layout(m.config, m.head);
  for (io::DType dt : {io::DType::kF32, io::DType::kF16, io::DType::kBF16}) {
    INFO("dtype " << io::to_string(dt));
    const std::string out = dir.file(std::string("ts_") + io::to_string(dt) + ".gguf");
    io::export_gguf(out, m, dt);
    const io::PretrainedModel g = io::open_pretrained(out);
    CHECK(g.format == "gguf");
    CHECK(g.config.to_json() == m.config.to_json());  // eps 1e-6 survives the f32 metadata
    std::vector<float> a, b;
    for (const auto& u : layout.units()) {
      for (const auto& t : u.tensors) {
        a.resize(size_t(t.numel));
        b.resize(size_t(t.numel));
        m.tensors->read_checked(t.name, a.data(), t.shape);
        g.tensors->read_checked(t.name, b.data(), t.shape);
        // Norms stay F32; matrices are stored as dt. The source weights are bf16 values, which
        // F16 represents exactly only within its range: compare with the rounding applied.
        if (t.shape.size() == 2 && dt == io::DType::kF16)
          for (float& x : a) x = io::f16_to_float(io::float_to_f16(x));
        INFO("tensor " << t.name);
        CHECK(std::memcmp(a.data(), b.data(), a.size() * 4) == 0);
      }
    }
  }
}

TEST_CASE("gguf: quantised blocks dequantise per ggml (Q8_0, Q4_0, Q4_1)") {
  auto h = [](float x) {
    const uint16_t v = io::float_to_f16(x);
    return std::string(reinterpret_cast<const char*>(&v), 2);
  };
  // Q8_0: d = 0.5, q = -16..15  → x = 0.5 q
  std::string q8 = h(0.5f);
  for (int j = 0; j < 32; ++j) q8.push_back(static_cast<char>(int8_t(j - 16)));
  // Q4_0: d = 0.25, byte j = (lo = j % 16, hi = 15 - j % 16) → x[j] = 0.25 (lo - 8), x[16+j] = 0.25
  // (hi - 8)
  std::string q40 = h(0.25f);
  for (int j = 0; j < 16; ++j) q40.push_back(static_cast<char>((j % 16) | ((15 - j) << 4)));
  // Q4_1: d = 2, m = -3: x[j] = 2 lo - 3, x[16+j] = 2 hi - 3
  std::string q41 = h(2.0f) + h(-3.0f);
  for (int j = 0; j < 16; ++j) q41.push_back(static_cast<char>(j | ((15 - j) << 4)));
  struct Case {
    uint32_t type;
    std::string data;
    std::function<float(int)> want;
  };
  const Case cases[] = {
      {8, q8, [](int j) { return 0.5f * float(j - 16); }},
      {2, q40,
       [](int j) { return j < 16 ? 0.25f * float(j - 8) : 0.25f * float(15 - (j - 16) - 8); }},
      {3, q41,
       [](int j) { return j < 16 ? 2.0f * float(j) - 3.0f : 2.0f * float(15 - (j - 16)) - 3.0f; }},
  };
  for (const Case& c : cases) {
    const io::GgufFile f =
        io::parse_gguf(io::blob_from_string(one_tensor_gguf(c.type, 32, c.data), "q.gguf"));
    std::vector<float> out(32);
    f.read_f32("t", out.data());
    for (int j = 0; j < 32; ++j) CHECK(out[size_t(j)] == c.want(j));
  }
  // Unsupported types and partial blocks are named.
  RLHF_CHECK_CONTAINS(test::error_of([&] {
                        io::parse_gguf(io::blob_from_string(
                            one_tensor_gguf(12, 256, std::string(144, 0)), "k.gguf"));
                      }),
                      "type Q4_K, which is not supported");
  RLHF_CHECK_CONTAINS(test::error_of([&] {
                        io::parse_gguf(io::blob_from_string(one_tensor_gguf(8, 16, q8), "p.gguf"));
                      }),
                      "not a multiple of the Q8_0 block size");
}

TEST_CASE("gguf: truncated and bit-flipped copies of the real file are clear errors") {
  const std::string path = data_path(kGguf);
  if (path.empty()) {
    MESSAGE("skipped: ../shared/data not found (set RLHF_SHARED_DATA)");
    return;
  }
  const std::string bytes = test::slurp(path);
  load_all(bytes);  // the original loads
  const io::GgufFile f = io::open_gguf(path);
  test::check_truncations(load_all, bytes, 20, {size_t(f.data_offset), size_t(f.data_offset) - 1});
  // Flips in the header, metadata and tensor infos; the magic must always fail.
  test::check_bit_flips(load_all, bytes, size_t(f.data_offset), 60, 7, {0, 1, 2, 3});
  // Hand-made corruptions with their messages.
  std::string s = bytes;
  const uint64_t huge = uint64_t(1) << 60;
  std::memcpy(s.data() + 8, &huge, 8);
  RLHF_CHECK_CONTAINS(test::error_of([&] { load_all(s); }), "tensor infos cannot fit");
  s = bytes;
  std::memcpy(s.data() + 16, &huge, 8);
  RLHF_CHECK_CONTAINS(test::error_of([&] { load_all(s); }), "metadata entries cannot fit");
  s = bytes;
  const uint32_t v1 = 1;
  std::memcpy(s.data() + 4, &v1, 4);
  RLHF_CHECK_CONTAINS(test::error_of([&] { load_all(s); }), "GGUF version 1 is not supported");
}
