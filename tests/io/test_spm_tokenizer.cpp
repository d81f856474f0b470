// Score-based SentencePiece-style BPE (llama2.c tokenizer.bin, GGUF "llama" vocabularies) on the
// real files: the Llama-2 vocabulary encodes the README sentence to the README ids through
// tokenizer.bin, the GGUF-embedded vocabulary and (reference) SentencePiece's tokenizer.model;
// byte fallback round trips; tok512.bin; corrupt files.
#include "io/spm_tokenizer.h"

#include <filesystem>

#include "io/gguf.h"
#include "io/sp_tokenizer.h"
#include "tests/io/corrupt_util.h"
#include "tests/io/io_test_util.h"
#include "tests/test_util.h"

using namespace rlhf;

namespace {

// ../shared/data/README.md: "Once upon a time, there was a little girl named Lily." →
const std::vector<int32_t> kLilyIds = {9038, 2501, 263,  931,  29892, 727,  471,
                                       263,  2217, 7826, 4257, 365,   2354, 29889};
const std::string kLily = "Once upon a time, there was a little girl named Lily.";

bool have(const std::string& p) {
  if (test::shared_data_dir().empty() || !std::filesystem::exists(p)) {
    MESSAGE("skipped: ../shared/data not found (set RLHF_SHARED_DATA)");
    return false;
  }
  return true;
}

// Text that exercises byte fallback (characters outside the vocabulary), newlines, spaces.
const std::string kOdd =
    "Line one\n  two spaces; tab\there. Emoji 🙂🚀, Ωμέγα, 世界, ∮ e⋅da";

}  // namespace

TEST_CASE("llama2.c tokenizer.bin (Llama-2 vocabulary) encodes the README sentence") {
  const std::string p = test::shared_data_dir() + "/llama2-tokenizer/tokenizer.bin";
  if (!have(p)) return;
  auto tok = io::load_llama2c_tokenizer(io::map_file(p));
  CHECK(tok->vocab_size() == 32000);
  CHECK(tok->kind() == "llama2c");
  CHECK(tok->encode(kLily, false, false) == kLilyIds);
  std::vector<int32_t> with = {1};
  with.insert(with.end(), kLilyIds.begin(), kLilyIds.end());
  with.push_back(2);
  CHECK(tok->encode(kLily, true, true) == with);
  CHECK(tok->decode(with) == kLily);
  CHECK(tok->decode(with, false) == "<s>" + kLily + "</s>");
  // Byte fallback: the emoji are not pieces, their UTF-8 bytes are (<0xF0> ...).
  const auto ids = tok->encode(kOdd, true, false);
  int bytes = 0;
  for (int32_t id : ids) bytes += id >= 3 && id < 259;
  CHECK(bytes >= 8);
  CHECK(tok->decode(ids) == kOdd);
  // "<s>" written in the text is BOS, as in Hugging Face's Llama tokenizer.
  CHECK(tok->encode("<s>", false, false) == std::vector<int32_t>{1});
  CHECK(tok->token_to_id("▁Once") == 9038);
  CHECK(tok->id_to_token(9038) == "▁Once");
}

TEST_CASE("GGUF-embedded Llama-2 vocabulary encodes like tokenizer.bin") {
  const std::string p =
      test::shared_data_dir() + "/llama-2-tiny-random-gguf/llama-2-tiny-random.gguf";
  if (!have(p)) return;
  const io::GgufFile f = io::open_gguf(p);
  auto tok = io::load_gguf_tokenizer(f);
  REQUIRE(tok != nullptr);
  CHECK(tok->kind() == "gguf");
  CHECK(tok->vocab_size() == 32000);
  CHECK(tok->bos_id() == 1);
  CHECK(tok->eos_id() == 2);
  CHECK(tok->encode(kLily, false, false) == kLilyIds);
  CHECK(tok->decode(tok->encode(kOdd, true, true)) == kOdd);
  // Its stored form (a tokenizer-only GGUF) rebuilds the same tokenizer.
  auto again = io::make_tokenizer_from_files("gguf", tok->files(), "stored");
  CHECK(again->encode(kOdd, true, true) == tok->encode(kOdd, true, true));
}

TEST_CASE(
    "SentencePiece tokenizer.model (libsentencepiece) agrees with the README and tokenizer.bin") {
  const std::string root = test::shared_data_dir();
  const std::string p = root + "/llama2-tokenizer/tokenizer.model";
  if (!have(p)) return;
  if (!io::sentencepiece_available()) {
    MESSAGE("skipped: this build has no libsentencepiece");
    return;
  }
  auto sp = io::make_tokenizer(p);
  CHECK(sp->kind() == "sentencepiece");
  CHECK(sp->vocab_size() == 32000);
  CHECK(sp->encode(kLily, false, false) == kLilyIds);
  CHECK(sp->decode(sp->encode(kOdd, true, true)) == kOdd);
  // Our score-BPE over the same pieces gives SentencePiece's ids on harder text too.
  auto bin = io::load_llama2c_tokenizer(io::map_file(root + "/llama2-tokenizer/tokenizer.bin"));
  for (const std::string& text : {kOdd, std::string("  leading spaces"), std::string("trailing  "),
                                  std::string("I'm sure they'll say we've done it, isn't it?"),
                                  std::string("Numbers 12345 and 3.14159 and 2024-05-27.")}) {
    INFO("text: '" << text << "'");
    CHECK(bin->encode(text, true, false) == sp->encode(text, true, false));
  }
}

TEST_CASE("llama2.c tok512.bin: 512 pieces, round trips TinyStories text") {
  const std::string p = test::shared_data_dir() + "/stories260K/tok512.bin";
  if (!have(p)) return;
  auto tok = io::make_tokenizer(p);
  CHECK(tok->vocab_size() == 512);
  CHECK(tok->name() == "llama2.c tok512.bin (vocab 512)");
  const std::string text =
      "Once upon a time, there was a little girl named Lily. She loved to play.";
  const auto ids = tok->encode(text, true, true);
  CHECK(ids.front() == 1);
  CHECK(ids.back() == 2);
  CHECK(ids.size() < text.size() / 2);  // merges happened
  CHECK(tok->decode(ids) == text);
  CHECK(tok->decode(tok->encode(kOdd, false, false)) == kOdd);
}

TEST_CASE("llama2.c tokenizer.bin: truncated or corrupt files are clear errors") {
  test::TempDir dir;
  auto entry = [](float score, const std::string& s) {
    std::string e(reinterpret_cast<const char*>(&score), 4);
    const int32_t n = static_cast<int32_t>(s.size());
    e.append(reinterpret_cast<const char*>(&n), 4);
    return e + s;
  };
  auto header = [](int32_t max_len) {
    return std::string(reinterpret_cast<const char*>(&max_len), 4);
  };
  const std::string good =
      header(8) + entry(0, "<unk>") + entry(0, "\n<s>\n") + entry(0, "\n</s>\n") + entry(-1, "a");
  auto load = [&](const std::string& bytes) {
    return test::error_of(
        [&] { io::load_llama2c_tokenizer(io::map_file(dir.write("t.bin", bytes))); });
  };
  CHECK(io::load_llama2c_tokenizer(io::map_file(dir.write("ok.bin", good)))->vocab_size() == 4);
  RLHF_CHECK_CONTAINS(load(""), "truncated or corrupt: max_token_length");
  RLHF_CHECK_CONTAINS(load(header(0)), "max_token_length 0 is not in");
  RLHF_CHECK_CONTAINS(load(header(1 << 30)), "max_token_length 1073741824 is not in");
  RLHF_CHECK_CONTAINS(load(good.substr(0, good.size() - 1)), "truncated or corrupt: token bytes");
  RLHF_CHECK_CONTAINS(load(good.substr(0, good.size() - 3)), "truncated or corrupt: token length");
  RLHF_CHECK_CONTAINS(load(good + "xyz"), "truncated or corrupt: token score");
  RLHF_CHECK_CONTAINS(load(header(8) + entry(0, "<unk>")), "needs at least 3 tokens");
  RLHF_CHECK_CONTAINS(load(header(2) + entry(0, "abc")),
                      "length 3 is not in [0, max_token_length 2]");
  std::string neg = header(8) + entry(0, "ab");
  const int32_t minus = -5;
  std::memcpy(neg.data() + 8, &minus, 4);
  RLHF_CHECK_CONTAINS(load(neg), "length -5 is not in");
  RLHF_CHECK_CONTAINS(load(header(8) + entry(std::nanf(""), "a")), "score is nan");
}

TEST_CASE(
    "llama2.c tokenizer.bin and SentencePiece tokenizer.model: truncated and bit-flipped copies") {
  const std::string root = test::shared_data_dir();
  if (!have(root + "/stories260K/tok512.bin")) return;
  for (const std::string& p :
       {root + "/stories260K/tok512.bin", root + "/llama2-tokenizer/tokenizer.bin"}) {
    INFO(p);
    const std::string bytes = test::slurp(p);
    const int64_t n = io::load_llama2c_tokenizer(io::blob_from_string(bytes, p))->vocab_size();
    // The file has no token count: as open_pretrained does, the count must match the model's.
    auto load = [n](const std::string& b) {
      auto tok = io::load_llama2c_tokenizer(io::blob_from_string(b, "mutant.bin"));
      RLHF_CHECK(tok->vocab_size() == n, "{} tokens, expected {}", tok->vocab_size(), n);
      tok->decode(
          tok->encode("Once upon a time, there was a little girl named Lily. 🙂", true, true));
    };
    test::check_truncations(load, bytes, p.find("tok512") != std::string::npos ? 40 : 15);
    test::check_bit_flips(load, bytes, bytes.size(),
                          p.find("tok512") != std::string::npos ? 200 : 40, 9);
  }
  if (!io::sentencepiece_available()) return;
  const std::string model = test::slurp(root + "/llama2-tokenizer/tokenizer.model");
  auto load_sp = [](const std::string& b) {
    auto tok = io::load_sentencepiece(b, "tokenizer.model", "mutant.model");
    tok->decode(tok->encode("Once upon a time 🙂", true, true));
  };
  test::check_truncations(load_sp, model, 10);
}
