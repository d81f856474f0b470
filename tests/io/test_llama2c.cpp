// llama2.c checkpoints: header parsing (legacy with tied/untied classifier, v1), the tensor table
// against a file we build by hand, and truncated / bit-flipped copies of stories260K (legacy and
// v1): a clear error naming the file each time.
#include "io/llama2c.h"

#include <cstring>
#include <filesystem>

#include "io/pretrained.h"
#include "tests/io/corrupt_util.h"
#include "tests/io/io_test_util.h"
#include "tests/test_util.h"

using namespace rlhf;

namespace {

template <typename T>
void put(std::string& s, T v) {
  s.append(reinterpret_cast<const char*>(&v), sizeof(T));
}

// A legacy file: dim 4, hidden 6, 1 layer, 2 heads, 1 kv head, vocab 5 (negative = untied),
// seq 3; weight i holds the float i (so every tensor's position in the file is visible).
std::string legacy_file(bool tied) {
  std::string s;
  for (int32_t v : {4, 6, 1, 2, 1, tied ? 5 : -5, 3}) put(s, v);
  const int64_t n = 5 * 4 + 4 + 16 + 8 + 8 + 16 + 4 + 24 + 24 + 24 + 4 + 3 * 2 + (tied ? 0 : 20);
  for (int64_t i = 0; i < n; ++i) put(s, float(i));
  return s;
}

void load_all(const std::string& bytes) {
  const io::Blob b = io::blob_from_string(bytes, "m.bin");
  const io::Llama2cHeader h = io::parse_llama2c_header(b);
  auto t = io::open_llama2c_tensors(b, h);
  const model::ParamLayout layout(io::llama2c_model_config(h), model::HeadKind::kLM);
  std::vector<float> buf;
  for (const auto& u : layout.units())
    for (const auto& ti : u.tensors) {
      buf.resize(size_t(ti.numel));
      t->read_checked(ti.name, buf.data(), ti.shape);
    }
}

}  // namespace

TEST_CASE("llama2.c: legacy tensor table, tied and untied classifier") {
  for (bool tied : {true, false}) {
    const std::string bytes = legacy_file(tied);
    const io::Blob b = io::blob_from_string(bytes, "tiny.bin");
    CHECK(io::looks_like_llama2c(b));
    const io::Llama2cHeader h = io::parse_llama2c_header(b);
    CHECK(h.version == 0);
    CHECK(h.shared_classifier == tied);
    CHECK(h.vocab_size == 5);
    const model::ModelConfig c = io::llama2c_model_config(h);
    CHECK(c.tie_word_embeddings == tied);
    CHECK(c.num_key_value_heads == 1);
    CHECK(c.rope_style == model::RopeStyle::kInterleaved);
    auto t = io::open_llama2c_tensors(b, h);
    std::vector<float> x(24);
    t->read_checked("model.embed_tokens.weight", x.data(), {5, 4});
    CHECK(x[0] == 0.0f);
    t->read_checked("model.layers.0.input_layernorm.weight", x.data(), {4});
    CHECK(x[0] == 20.0f);
    t->read_checked("model.layers.0.self_attn.k_proj.weight", x.data(), {2, 4});  // kv_dim 2
    CHECK(x[0] == 40.0f);
    t->read_checked("model.layers.0.mlp.gate_proj.weight", x.data(), {6, 4});  // w1
    CHECK(x[0] == 76.0f);
    t->read_checked("model.layers.0.mlp.down_proj.weight", x.data(), {4, 6});  // w2
    CHECK(x[0] == 100.0f);
    t->read_checked("model.layers.0.mlp.up_proj.weight", x.data(), {6, 4});  // w3
    CHECK(x[0] == 124.0f);
    t->read_checked("model.norm.weight", x.data(), {4});
    CHECK(x[0] == 148.0f);
    CHECK(t->find("lm_head.weight").has_value() == !tied);
    if (!tied) {
      t->read_checked("lm_head.weight", x.data(), {5, 4});
      CHECK(x[0] == 158.0f);  // after the 6 unused RoPE floats
    }
    RLHF_CHECK_CONTAINS(
        test::error_of([&] { t->read_checked("model.norm.weight", x.data(), {5}); }),
        "tensor 'model.norm.weight' has shape [4], the model config needs [5]");
  }
}

TEST_CASE("llama2.c: header errors name the file and the field") {
  auto err = [](std::string bytes) {
    return test::error_of(
        [&] { io::parse_llama2c_header(io::blob_from_string(bytes, "bad.bin")); });
  };
  std::string s = legacy_file(true);
  RLHF_CHECK_CONTAINS(err(s.substr(0, 10)), "bad.bin: truncated or corrupt: header");
  RLHF_CHECK_CONTAINS(err(s.substr(0, s.size() - 4)),
                      "implies 660 bytes, the file has 656 (truncated?)");
  RLHF_CHECK_CONTAINS(err(s + "xxxx"), "(not a llama2.c file?)");
  std::string heads = s;
  put<int32_t>(heads, 0);
  const int32_t three = 3;
  std::memcpy(heads.data() + 12, &three, 4);
  RLHF_CHECK_CONTAINS(err(heads), "n_heads 3 does not divide dim 4");
  std::string v2;
  put<uint32_t>(v2, io::kLlama2cMagic);
  put<int32_t>(v2, 2);
  v2.resize(256);
  RLHF_CHECK_CONTAINS(err(v2), "version 2 is not supported");
  std::string huge = s;
  const int32_t big = 1 << 30;
  std::memcpy(huge.data(), &big, 4);
  RLHF_CHECK_CONTAINS(err(huge), "dim 1073741824 is not in [1, 2^24)");
  CHECK_FALSE(
      io::looks_like_llama2c(io::blob_from_string("hello world, not a model at all....", "x")));
}

TEST_CASE("llama2.c: truncated and bit-flipped stories260K files are clear errors") {
  const std::string root = test::shared_data_dir();
  const std::string dir = root + "/stories260K";
  if (root.empty() || !std::filesystem::exists(dir)) {
    MESSAGE("skipped: ../shared/data not found (set RLHF_SHARED_DATA)");
    return;
  }
  for (const char* name : {"stories260K.bin", "stories260K.v1.bin"}) {
    INFO(std::string(name));
    const std::string bytes = test::slurp(dir + "/" + name);
    load_all(bytes);
    test::check_truncations(load_all, bytes, 30, {28, 255, 256, 257});
    // Every header field that sizes the file must be caught when a bit flips (legacy: all 7
    // ints; v1: magic, version and the 6 ints that size the weights).
    std::vector<size_t> must;
    const bool v1 = std::string(name).find("v1") != std::string::npos;
    for (size_t i = 0; i < (v1 ? 32u : 28u); ++i) must.push_back(i);
    test::check_bit_flips(load_all, bytes, v1 ? 256 : 28, 100, 3, must);
  }
  // The tokenizer next to the model must have the model's vocabulary size.
  test::TempDir tmp;
  std::filesystem::copy_file(dir + "/stories260K.bin", tmp.file("m.bin"));
  const std::string tok = test::slurp(dir + "/tok512.bin");
  size_t last = 4;  // start of the last entry: a cut there leaves a well-formed 511-token file
  for (size_t at = 4; at + 8 <= tok.size();) {
    int32_t len = 0;
    std::memcpy(&len, tok.data() + at + 4, 4);
    last = at;
    at += 8 + size_t(len);
  }
  RLHF_CHECK_CONTAINS(
      test::error_of(
          [&] { io::open_pretrained(tmp.file("m.bin"), tmp.write("t.bin", tok.substr(0, last))); }),
      "has 511 tokens, the model's vocab_size is 512");
}
