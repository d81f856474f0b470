// Hugging Face tokenizer.json BPE against the `tokenizers` library: ids recorded by
// scripts/make_tokenizer_fixtures.py (tests/fixtures/tokenizers/expected.json) for two byte-level
// tokenizers we trained (GPT-2 and Llama-3 pipelines) and TinyStories-656K's SentencePiece-style
// tokenizer.json from ../shared/data; decode round trips; special tokens; corrupt files.
#include "io/hf_tokenizer.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>

#include "io/file_util.h"
#include "io/regex.h"
#include "tests/io/corrupt_util.h"
#include "tests/io/io_test_util.h"
#include "tests/test_util.h"

using namespace rlhf;
using json = nlohmann::json;

namespace {

const std::string kFixtures = std::string(RLHF_SOURCE_DIR) + "/tests/fixtures/tokenizers";

const json& expected() {
  static const json j = json::parse(io::read_binary_file(kFixtures + "/expected.json"));
  return j;
}

// Every recorded text encodes to the recorded ids and decodes back as `tokenizers` decodes it.
void check_against_reference(const io::Tokenizer& tok, const std::string& name) {
  const json& want = expected().at(name);
  const json& want_dec = expected().at(name + ":decode");
  int checked = 0;
  for (auto it = want.begin(); it != want.end(); ++it) {
    const std::string& text = it.key();
    const std::vector<int32_t> ids = tok.encode(text, /*add_bos=*/true, /*add_eos=*/false);
    const std::vector<int32_t> ref = it.value().get<std::vector<int32_t>>();
    INFO(name << " text: '" << text << "'");
    CHECK(ids == ref);
    CHECK(tok.decode(ids) == want_dec.at(text).get<std::string>());
    ++checked;
  }
  CHECK(checked >= 12);
}

}  // namespace

TEST_CASE("hf tokenizer: byte-level GPT-2 pipeline matches tokenizers") {
  if (!io::regex_available()) {
    MESSAGE("skipped: this build has no PCRE2 (byte-level BPE needs its regex)");
    return;
  }
  auto tok = io::load_hf_tokenizer(kFixtures + "/bytelevel_gpt2.json");
  CHECK(tok->byte_level());
  CHECK(tok->vocab_size() == 400);
  CHECK(tok->token_to_id("<|im_start|>") == 1);
  CHECK(tok->is_special(1));
  CHECK(tok->bos_id() == -1);  // no post-processor, no tokenizer_config.json
  check_against_reference(*tok, "bytelevel_gpt2");
  // Any bytes round-trip, invalid UTF-8 included (each byte has a byte-level character).
  std::string bytes;
  for (int b = 0; b < 256; ++b) bytes.push_back(static_cast<char>(b));
  bytes += "\xC3\x28 \xE2\x82 end";
  CHECK(tok->decode(tok->encode(bytes, false, false)) == bytes);
  // Special tokens written in the text are split out; with skip_special_tokens they disappear.
  const auto ids = tok->encode("<|im_start|>user\nHi<|im_end|>", false, false);
  CHECK(ids.front() == 1);
  CHECK(ids.back() == 2);
  CHECK(tok->decode(ids, false) == "<|im_start|>user\nHi<|im_end|>");
  CHECK(tok->decode(ids, true) == "user\nHi");
}

TEST_CASE("hf tokenizer: byte-level Llama-3 pipeline (Split + Digits + ByteLevel, template)") {
  if (!io::regex_available()) {
    MESSAGE("skipped: this build has no PCRE2 (byte-level BPE needs its regex)");
    return;
  }
  auto tok = io::load_hf_tokenizer(kFixtures + "/bytelevel_llama3.json");
  CHECK(tok->bos_id() == tok->token_to_id("<|begin_of_text|>"));
  CHECK(tok->encode("a", true, false).front() == tok->bos_id());
  CHECK(tok->encode("a", false, false).front() != tok->bos_id());
  check_against_reference(*tok, "bytelevel_llama3");
}

TEST_CASE("hf tokenizer: SentencePiece-style BPE with byte fallback (normalizer and Metaspace)") {
  for (const char* name : {"spm_bytefallback", "spm_metaspace"}) {
    auto tok = io::load_hf_tokenizer(kFixtures + "/" + name + ".json");
    CHECK_FALSE(tok->byte_level());
    CHECK(tok->bos_id() == tok->token_to_id("<s>"));
    check_against_reference(*tok, name);
  }
  // Byte fallback: characters outside the vocabulary become <0xXX> tokens and come back exactly.
  auto tok = io::load_hf_tokenizer(kFixtures + "/spm_bytefallback.json");
  const std::string odd = "Emoji 🙂 and Ωμέγα and 世界, \xff\xfe raw bytes";
  const auto ids = tok->encode(odd, false, false);
  int bytes = 0;
  for (int32_t id : ids) bytes += tok->id_to_token(id).rfind("<0x", 0) == 0;
  CHECK(bytes >= 10);
  CHECK(tok->decode(ids) == odd);
  CHECK(tok->decode(tok->encode(" x  y ", true, true)) == " x  y ");
}

TEST_CASE(
    "hf tokenizer: TinyStories-656K tokenizer.json matches tokenizers, round-trips its card") {
  const std::string root = test::shared_data_dir();
  const std::string p = root + "/tinystories-656k/bf16_upstream/tokenizer.json";
  if (root.empty() || !std::filesystem::exists(p)) {
    MESSAGE("skipped: ../shared/data not found (set RLHF_SHARED_DATA)");
    return;
  }
  auto tok = io::load_hf_tokenizer(p);
  CHECK_FALSE(tok->byte_level());
  CHECK(tok->vocab_size() == 2048);
  CHECK(tok->bos_id() == 1);  // the post-processor's <|start_story|>
  CHECK(tok->eos_id() == 2);  // tokenizer_config.json's <|end_story|>
  CHECK(tok->pad_id() == 0);  // <unk>
  CHECK(tok->id_to_token(1) == "<|start_story|>");
  check_against_reference(*tok, "tinystories_656k");
  // The model card story: 145 tokens with BOS (README), and an exact round trip.
  const std::string story = expected().at("model_card_story").get<std::string>();
  const auto ids = tok->encode(story, true, false);
  CHECK(ids.size() == 145);
  CHECK(tok->decode(ids) == story);
  // Its vocabulary has no <0xXX> tokens, so characters outside it become one fused <unk> (as in
  // `tokenizers`, checked above) and do not round-trip.
  const auto odd_ids = tok->encode("x 🙂🙂 y", false, false);
  CHECK(std::count(odd_ids.begin(), odd_ids.end(), 0) == 1);
  CHECK(tok->decode(tok->encode("  two leading spaces", false, false)) == "  two leading spaces");
}

TEST_CASE("hf tokenizer: stored files rebuild the same tokenizer") {
  auto tok = io::load_hf_tokenizer(kFixtures + "/bytelevel_gpt2.json");
  if (!io::regex_available()) return;
  auto again = io::make_tokenizer_from_files(tok->kind(), tok->files(), "stored");
  const std::string text = "Once upon a time, there was a little girl named Lily. 🙂";
  CHECK(again->encode(text, true, true) == tok->encode(text, true, true));
  CHECK(again->vocab_size() == tok->vocab_size());
}

TEST_CASE("hf tokenizer: corrupt and unsupported tokenizer.json files are clear errors") {
  test::TempDir dir;
  auto load = [&](const std::string& text) {
    return test::error_of([&] { io::load_hf_tokenizer(dir.write("tokenizer.json", text)); });
  };
  RLHF_CHECK_CONTAINS(load("{\"model\": "), "malformed JSON");
  RLHF_CHECK_CONTAINS(load("[1, 2]"), "not a tokenizer.json object");
  RLHF_CHECK_CONTAINS(load(R"({"model": {"type": "Unigram", "vocab": []}})"),
                      "tokenizer model type 'Unigram' is not supported");
  RLHF_CHECK_CONTAINS(load(R"({"model": {"type": "BPE", "vocab": {"a": -4}, "merges": []}})"),
                      "invalid id -4");
  RLHF_CHECK_CONTAINS(load(R"({"model": {"type": "BPE", "vocab": {"a": 99999999}, "merges": []}})"),
                      "invalid id");
  RLHF_CHECK_CONTAINS(
      load(R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1}, "merges": ["a b"]}})"),
      "refers to a token outside the vocabulary");
  RLHF_CHECK_CONTAINS(load(R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["a"]}})"),
                      "is not two tokens separated by one space");
  RLHF_CHECK_CONTAINS(
      load(R"({"model": {"type": "BPE", "vocab": {"a": 0}}, "normalizer": {"type": "NFKC"}})"),
      "normalizer 'NFKC' is not supported");
  RLHF_CHECK_CONTAINS(
      load(
          R"({"model": {"type": "BPE", "vocab": {"a": 0}}, "pre_tokenizer": {"type": "Whitespace"}})"),
      "pre-tokenizer 'Whitespace' is not supported");
  RLHF_CHECK_CONTAINS(load(R"({"model": {"type": "BPE", "vocab": {"a": 0}}, "post_processor":
      {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<s>"}}]}})"),
                      "not in its special_tokens");
  if (io::regex_available())
    RLHF_CHECK_CONTAINS(load(R"({"model": {"type": "BPE", "vocab": {"a": 0}}, "pre_tokenizer":
        {"type": "Split", "pattern": {"Regex": "(unclosed"}, "behavior": "Isolated"}})"),
                        "invalid regular expression");
  RLHF_CHECK_CONTAINS(test::error_of([&] { io::load_hf_tokenizer(dir.file("missing.json")); }),
                      "cannot open");
}

TEST_CASE("hf tokenizer: truncated and bit-flipped TinyStories-656K tokenizer.json") {
  const std::string root = test::shared_data_dir();
  const std::string p = root + "/tinystories-656k/bf16_upstream/tokenizer.json";
  if (root.empty() || !std::filesystem::exists(p)) {
    MESSAGE("skipped: ../shared/data not found (set RLHF_SHARED_DATA)");
    return;
  }
  const std::string bytes = test::slurp(p);
  auto load = [](const std::string& b) {
    auto tok = io::hf_tokenizer_from_files({{"tokenizer.json", b}}, "mutant");
    tok->decode(
        tok->encode("Once upon a time, there was a little girl named Lily. 🙂", true, true));
  };
  load(bytes);
  test::check_truncations(load, bytes, 40);
  test::check_bit_flips(load, bytes, bytes.size(), 150, 5, {0});
}
