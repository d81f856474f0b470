// Real models through io::open_pretrained (../shared/data; skipped with a message when absent):
//  - stories260K (llama2.c): the legacy and v1 files give bitwise identical logits, and greedy
//    decoding from BOS for 200 tokens gives llama2.c's text (reference: the NumPy port of run.c in
//    scripts/reference_models.py, `stories260k`);
//  - TinyStories-656K (HF, BF16): the mean NLL of the model card story matches Hugging Face
//    transformers run in float64 (`tinystories_nll`), and the F32 copy, which stores the tied
//    matrix as lm_head.weight, gives the same logits;
//  - RoPE conventions: a rotate-half model equals its Q/K-permuted interleaved twin;
//  - export → import is bitwise (safetensors F32, HDF5), tokenizers travel with the model.
#include "io/pretrained.h"

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstring>
#include <filesystem>

#include "io/gguf.h"
#include "io/hdf5_ckpt.h"
#include "model/local_provider.h"
#include "model/transformer.h"
#include "tests/io/io_test_util.h"
#include "tests/test_util.h"

using namespace rlhf;

namespace {

std::string data_path(const std::string& rel) {
  return test::shared_data_path(rel);
}

#define REQUIRE_DATA(var, rel)                                                 \
  const std::string var = data_path(rel);                                      \
  if (var.empty()) {                                                           \
    MESSAGE("skipped: ../shared/data not found (set RLHF_SHARED_DATA): " rel); \
    return;                                                                    \
  }

// Loads every unit of `m` into a LocalParams.
std::unique_ptr<model::LocalParams<float>> load(const io::PretrainedModel& m,
                                                std::unique_ptr<model::ParamLayout>& layout) {
  layout = std::make_unique<model::ParamLayout>(m.config, m.head);
  auto p = std::make_unique<model::LocalParams<float>>(*layout);
  for (int u = 0; u < layout->num_units(); ++u)
    io::load_pretrained_unit(m, *layout, u, p->params(u));
  return p;
}

std::vector<float> logits_of(const io::PretrainedModel& m, const std::vector<int32_t>& tokens) {
  std::unique_ptr<model::ParamLayout> layout;
  auto p = load(m, layout);
  model::Transformer<float> net(*layout);
  std::vector<float> logits(tokens.size() * static_cast<size_t>(m.config.vocab_size));
  net.forward_logits(*p, tokens.data(), 1, static_cast<int64_t>(tokens.size()), logits.data());
  return logits;
}

// Every tensor of the layout, bitwise.
void check_same_tensors(const io::PretrainedModel& a, const io::PretrainedModel& b) {
  const model::ParamLayout layout(a.config, a.head);
  std::vector<float> x, y;
  int n = 0;
  for (const auto& u : layout.units()) {
    for (const auto& t : u.tensors) {
      x.resize(size_t(t.numel));
      y.resize(size_t(t.numel));
      a.tensors->read_checked(t.name, x.data(), t.shape);
      b.tensors->read_checked(t.name, y.data(), t.shape);
      INFO("tensor " << t.name);
      CHECK(std::memcmp(x.data(), y.data(), x.size() * 4) == 0);
      ++n;
    }
  }
  CHECK(n > 0);
}

// stories260K greedy from BOS, 200 steps: `python3 scripts/reference_models.py stories260k`.
const std::vector<int32_t> kStoriesGreedy = {
    403, 407, 261, 378, 432, 383, 286, 261, 376, 298, 315, 421, 395, 317, 426, 338, 401, 396, 267,
    337, 410, 408, 419, 292, 411, 322, 265, 282, 295, 433, 426, 385, 328, 432, 358, 394, 261, 370,
    432, 352, 266, 268, 388, 426, 338, 391, 266, 267, 337, 335, 312, 432, 398, 312, 286, 267, 414,
    270, 333, 415, 426, 13,  438, 310, 439, 419, 357, 336, 432, 313, 438, 310, 432, 278, 316, 439,
    419, 298, 414, 267, 265, 282, 295, 433, 426, 436, 317, 286, 296, 418, 269, 279, 292, 416, 439,
    413, 409, 416, 327, 263, 415, 294, 267, 400, 426, 338, 336, 432, 313, 442, 391, 267, 337, 335,
    364, 420, 268, 388, 432, 398, 359, 280, 303, 439, 413, 272, 417, 264, 312, 426, 436, 13,  438,
    310, 286, 296, 418, 269, 279, 292, 416, 439, 413, 409, 416, 327, 263, 415, 294, 267, 400, 426,
    338, 336, 432, 313, 442, 439, 423, 262, 304, 420, 422, 432, 317, 426, 359, 279, 292, 416, 439,
    413, 409, 416, 327, 263, 415, 294, 267, 400, 426, 436, 13,  438, 310, 279, 292, 416, 439, 413,
    391, 267, 281, 421, 427, 311, 357, 432, 384, 358};
const char* const kStoriesText =
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the park. "
    "One day, she saw a big, red ball. She wanted to play with it, but it was too high.\nLily's "
    "mom said, \"Lily, let's go to the park.\" Lily was sad and didn't know what to do. She said, "
    "\"I want to play with your ball, but I can't find it.\"\nLily was sad and didn't know what to "
    "do. She said, \"I'm sorry, Lily. I didn't know what to do.\"\nLily didn't want to help her "
    "mom, so she";

// TinyStories-656K, model card story (145 tokens with <|start_story|>): transformers in float64,
// `python3 scripts/reference_models.py tinystories_nll` printed
//   mean NLL (nats/token): 1.7564290762
//   first logits (pos 0, ids 0..4): [0.02913035, -0.20105176, -0.44712189, 1.91639221, -2.5786674]
constexpr double kTinyStoriesNll = 1.7564290762;
const double kTinyStoriesLogits0[5] = {0.02913035, -0.20105176, -0.44712189, 1.91639221,
                                       -2.5786674};

std::string model_card_story() {
  const auto j = nlohmann::json::parse(
      test::slurp(std::string(RLHF_SOURCE_DIR) + "/tests/fixtures/tokenizers/expected.json"));
  return j.at("model_card_story").get<std::string>();
}

}  // namespace

TEST_CASE("pretrained: stories260K legacy and v1 give identical logits") {
  REQUIRE_DATA(legacy_path, "stories260K/stories260K.bin");
  REQUIRE_DATA(v1_path, "stories260K/stories260K.v1.bin");
  const io::PretrainedModel legacy = io::open_pretrained(legacy_path);
  const io::PretrainedModel v1 = io::open_pretrained(v1_path);
  CHECK(legacy.format == "llama2c");
  CHECK(legacy.detail == "llama2.c checkpoint (legacy)");
  CHECK(v1.detail == "llama2.c checkpoint (v1)");
  const model::ModelConfig& c = legacy.config;
  CHECK(c.hidden_size == 64);
  CHECK(c.num_hidden_layers == 5);
  CHECK(c.num_attention_heads == 8);
  CHECK(c.num_key_value_heads == 4);
  CHECK(c.intermediate_size == 172);
  CHECK(c.vocab_size == 512);
  CHECK(c.max_position_embeddings == 512);
  CHECK(c.tie_word_embeddings);
  CHECK(c.rope_style == model::RopeStyle::kInterleaved);
  CHECK(c.to_json() == v1.config.to_json());
  REQUIRE(legacy.tokenizer != nullptr);  // tok512.bin next to the checkpoint
  CHECK(legacy.tokenizer->vocab_size() == 512);
  check_same_tensors(legacy, v1);
  const std::vector<int32_t> tokens = legacy.tokenizer->encode(
      "Once upon a time, there was a little girl named Lily.", true, false);
  const auto a = logits_of(legacy, tokens), b = logits_of(v1, tokens);
  REQUIRE(a.size() == b.size());
  CHECK(std::memcmp(a.data(), b.data(), a.size() * 4) == 0);
}

TEST_CASE("pretrained: stories260K greedy decoding from BOS gives llama2.c's text") {
  REQUIRE_DATA(path, "stories260K/stories260K.bin");
  REQUIRE_DATA(tok_path, "stories260K/tok512.bin");
  const io::PretrainedModel m = io::open_pretrained(path, tok_path);
  std::unique_ptr<model::ParamLayout> layout;
  auto p = load(m, layout);
  model::Transformer<float> net(*layout);
  const int64_t V = m.config.vocab_size;
  auto argmax = [V](const float* row) {
    int32_t best = 0;
    for (int32_t v = 1; v < V; ++v)
      if (row[v] > row[best]) best = v;  // first maximum, as llama2.c's argmax
    return best;
  };
  // Greedy decoding by repeated forward_logits on the growing prefix (the first 40 steps: the
  // cost grows with the square of the length).
  std::vector<int32_t> seq = {1};
  std::vector<float> logits;
  for (int step = 0; step < 40; ++step) {
    const int64_t T = static_cast<int64_t>(seq.size());
    logits.resize(size_t(T * V));
    net.forward_logits(*p, seq.data(), 1, T, logits.data());
    const int32_t next = argmax(logits.data() + (T - 1) * V);
    if (next == 1) break;  // llama2.c stops at BOS
    seq.push_back(next);
  }
  CHECK(std::vector<int32_t>(seq.begin() + 1, seq.end()) ==
        std::vector<int32_t>(kStoriesGreedy.begin(), kStoriesGreedy.begin() + 40));
  // All 200 steps at once: with causal attention the logits at position t depend only on tokens
  // 0..t, so greedy decoding produces the reference exactly when, fed BOS + the reference, the
  // argmax at every position t is reference token t+1.
  std::vector<int32_t> full = {1};
  full.insert(full.end(), kStoriesGreedy.begin(), kStoriesGreedy.end());
  const int64_t T = static_cast<int64_t>(full.size());
  logits.resize(size_t(T * V));
  net.forward_logits(*p, full.data(), 1, T, logits.data());
  int agree = 0;
  for (int64_t t = 0; t + 1 < T; ++t) agree += argmax(logits.data() + t * V) == full[size_t(t + 1)];
  CHECK(agree == 200);
  // tok512.bin decodes it to the text llama2.c prints.
  CHECK(m.tokenizer->decode(full) == kStoriesText);
  CHECK(
      std::string(kStoriesText)
          .rfind(
              "Once upon a time, there was a little girl named Lily. She loved to play outside in "
              "the park.",
              0) == 0);
}

TEST_CASE("pretrained: TinyStories-656K NLL of the model card story matches transformers") {
  REQUIRE_DATA(bf16_path, "tinystories-656k/bf16_upstream");
  REQUIRE_DATA(fp32_path, "tinystories-656k/fp32_learning-lm-rs");
  const io::PretrainedModel bf16 = io::open_pretrained(bf16_path);
  const io::PretrainedModel fp32 = io::open_pretrained(fp32_path);
  CHECK(bf16.format == "safetensors");
  CHECK(bf16.detail == "Hugging Face safetensors (BF16, 1 file)");
  CHECK(fp32.detail == "Hugging Face safetensors (F32, 1 file)");
  CHECK(bf16.config.rope_style == model::RopeStyle::kRotateHalf);
  CHECK(bf16.config.tie_word_embeddings);
  CHECK(bf16.config.rms_norm_eps == 1e-6);
  // The F32 copy stores the tied matrix as lm_head.weight; it is read as the embedding.
  CHECK(fp32.tensors->find("model.embed_tokens.weight").has_value());
  CHECK(fp32.tensors->find("model.embed_tokens.weight")->dtype == "F32");
  REQUIRE(bf16.tokenizer != nullptr);
  const std::vector<int32_t> ids = bf16.tokenizer->encode(model_card_story(), true, false);
  REQUIRE(ids.size() == 145);
  // Mean NLL with forward_lm (targets = next tokens).
  std::unique_ptr<model::ParamLayout> layout;
  auto p = load(bf16, layout);
  model::Transformer<float> net(*layout);
  const int64_t T = static_cast<int64_t>(ids.size());
  std::vector<int32_t> targets(ids.begin() + 1, ids.end());
  targets.push_back(-1);
  std::vector<float> lp(static_cast<size_t>(T));
  net.forward_lm(*p, ids.data(), targets.data(), 1, T, lp.data(), nullptr, false);
  double nll = 0;
  for (int64_t t = 0; t + 1 < T; ++t) nll -= lp[size_t(t)];
  nll /= double(T - 1);
  MESSAGE("TinyStories-656K mean NLL " << nll << " (transformers float64: " << kTinyStoriesNll
                                       << ")");
  // fp32 forward vs a float64 reference: agreement to ~1e-6 relative is expected; 1e-4 absolute
  // leaves room for the summation order while a wrong convention (RoPE pairing, eps, tying)
  // changes the NLL by > 0.1.
  CHECK(std::abs(nll - kTinyStoriesNll) < 1e-4);
  const auto logits = logits_of(bf16, ids);
  for (int v = 0; v < 5; ++v) CHECK(std::abs(logits[size_t(v)] - kTinyStoriesLogits0[v]) < 1e-4);
  // bf16 and fp32 copies: the fp32 file is the exact upcast, so every weight, and therefore every
  // logit, agrees bitwise (far inside bf16 precision, 2^-8 relative).
  check_same_tensors(bf16, fp32);
  const auto logits32 = logits_of(fp32, ids);
  CHECK(std::memcmp(logits.data(), logits32.data(), logits.size() * 4) == 0);
}

TEST_CASE("pretrained: a rotate-half model equals its Q/K-permuted interleaved twin") {
  REQUIRE_DATA(path, "tinystories-656k/bf16_upstream");
  const io::PretrainedModel m = io::open_pretrained(path);
  std::unique_ptr<model::ParamLayout> layout;
  auto p = load(m, layout);
  model::ModelConfig twin_cfg = m.config;
  twin_cfg.rope_style = model::RopeStyle::kInterleaved;
  model::ParamLayout twin_layout(twin_cfg, m.head);
  model::LocalParams<float> twin(twin_layout);
  for (int u = 0; u < layout->num_units(); ++u)
    std::copy(p->params(u), p->params(u) + layout->unit(u).numel, twin.params(u));
  const int64_t C = m.config.hidden_size, D = m.config.D();
  for (int l = 0; l < m.config.num_hidden_layers; ++l) {
    const std::string pre = "model.layers." + std::to_string(l) + ".self_attn.";
    io::permute_qk_rows(twin.param(pre + "q_proj.weight"), m.config.num_attention_heads, D, C,
                        /*to_interleaved=*/true);
    io::permute_qk_rows(twin.param(pre + "k_proj.weight"), m.config.num_key_value_heads, D, C,
                        /*to_interleaved=*/true);
  }
  const std::vector<int32_t> ids =
      m.tokenizer->encode("Once upon a time, there was a cat.", true, false);
  const int64_t T = static_cast<int64_t>(ids.size()), V = m.config.vocab_size;
  std::vector<float> a(static_cast<size_t>(T * V)), b(static_cast<size_t>(T * V));
  model::Transformer<float>(*layout).forward_logits(*p, ids.data(), 1, T, a.data());
  model::Transformer<float>(twin_layout).forward_logits(twin, ids.data(), 1, T, b.data());
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, double(std::abs(a[i] - b[i])));
  CHECK(worst < 1e-4);
  // And the permutation is llama.cpp's: interleaved row h·D + 2i + j is HF row h·D + j·D/2 + i.
  std::vector<float> rows(2 * 8);
  for (size_t r = 0; r < rows.size(); ++r) rows[r] = float(r);
  io::permute_qk_rows(rows.data(), 2, 8, 1, true);
  CHECK(rows == std::vector<float>{0, 4, 1, 5, 2, 6, 3, 7, 8, 12, 9, 13, 10, 14, 11, 15});
  io::permute_qk_rows(rows.data(), 2, 8, 1, false);
  for (size_t r = 0; r < rows.size(); ++r) CHECK(rows[r] == float(r));
}

TEST_CASE("pretrained: export -> import is bitwise, tokenizers travel along") {
  REQUIRE_DATA(ts_path, "tinystories-656k/bf16_upstream");
  REQUIRE_DATA(s_path, "stories260K/stories260K.v1.bin");
  test::TempDir dir;
  for (const std::string& src : {ts_path, s_path}) {
    INFO("source " << src);
    const io::PretrainedModel orig = io::open_pretrained(src);
    // x = import(source): our checkpoint, with the tokenizer under /tokenizer.
    const std::string x_path = dir.file("x.h5");
    io::export_hdf5(x_path, orig);
    const io::PretrainedModel x = io::open_pretrained(x_path);
    CHECK(x.format == "hdf5");
    CHECK(x.config.to_json() == orig.config.to_json());
    check_same_tensors(orig, x);
    REQUIRE(x.tokenizer != nullptr);
    CHECK(x.tokenizer->kind() == orig.tokenizer->kind());
    const std::string text = "Once upon a time, there was a little girl named Lily.";
    CHECK(x.tokenizer->encode(text, true, true) == orig.tokenizer->encode(text, true, true));
    // export(x) as a Hugging Face folder, import again: bitwise x.
    const std::string hf = dir.file("hf");
    io::export_hf_folder(hf, x, io::DType::kF32);
    CHECK(std::filesystem::exists(hf + "/config.json"));
    CHECK(std::filesystem::exists(hf + "/model.safetensors"));
    const io::PretrainedModel y = io::open_pretrained(hf);
    CHECK(y.config.to_json() == x.config.to_json());
    check_same_tensors(x, y);
    REQUIRE(y.tokenizer != nullptr);
    CHECK(y.tokenizer->encode(text, true, true) == x.tokenizer->encode(text, true, true));
    const std::string y_path = dir.file("y.h5");
    io::export_hdf5(y_path, y);
    check_same_tensors(x, io::open_pretrained(y_path));
    // The interleaved llama2.c model is written in HF's rotate-half row order (so transformers
    // computes the same function) and marked, so that the import undoes it.
    const auto cfg = nlohmann::json::parse(test::slurp(hf + "/config.json"));
    CHECK(cfg.at("rope_style") == "rotate_half");
    CHECK(cfg.contains(io::kRopePermutedKey) ==
          (orig.config.rope_style == model::RopeStyle::kInterleaved));
    std::filesystem::remove_all(hf);
  }
}

TEST_CASE("pretrained: format detection and clear errors for what is not a model") {
  test::TempDir dir;
  RLHF_CHECK_CONTAINS(test::error_of([&] { io::open_pretrained(dir.file("nope.bin")); }),
                      "no such file or folder");
  RLHF_CHECK_CONTAINS(test::error_of([&] { io::open_pretrained(dir.path().string()); }),
                      "a folder without model.h5 or config.json");
  RLHF_CHECK_CONTAINS(test::error_of([&] { io::open_pretrained(dir.write("x.txt", "hello")); }),
                      "unrecognised model format");
  RLHF_CHECK_CONTAINS(
      test::error_of([&] { io::open_pretrained(dir.write("x.bin", std::string(100, 'a'))); }),
      "not a llama2.c checkpoint");
  // A Hugging Face folder without weights, and one whose index names a missing shard.
  const std::string cfg =
      R"({"model_type": "llama", "hidden_size": 8, "intermediate_size": 16, "num_hidden_layers": 1,
          "num_attention_heads": 2, "vocab_size": 16})";
  std::filesystem::create_directories(dir.file("hf"));
  dir.write("hf/config.json", cfg);
  RLHF_CHECK_CONTAINS(test::error_of([&] { io::open_pretrained(dir.file("hf")); }),
                      "no model.safetensors and no model.safetensors.index.json");
  dir.write("hf/pytorch_model.bin", "x");
  RLHF_CHECK_CONTAINS(test::error_of([&] { io::open_pretrained(dir.file("hf")); }),
                      "convert pytorch_model.bin");
  dir.write("hf/model.safetensors.index.json",
            R"({"weight_map": {"model.norm.weight": "model-00001-of-00002.safetensors"}})");
  RLHF_CHECK_CONTAINS(
      test::error_of([&] { io::open_pretrained(dir.file("hf")); }),
      "shard 'model-00001-of-00002.safetensors' is listed in the index but missing");
  dir.write("hf/model.safetensors.index.json", R"({"weight_map": {"a": "../x"}})");
  RLHF_CHECK_CONTAINS(test::error_of([&] { io::open_pretrained(dir.file("hf")); }),
                      "is not a file name in the folder");
}
