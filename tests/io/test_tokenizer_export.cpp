// Tokenizers written by export (io/tokenizer_export.h), for every kind we can load: the byte
// tokenizer; tokenizer.json fixtures (tests/fixtures/tokenizers); and from ../shared/data (skipped
// with a message when absent) llama2.c tok512.bin and Llama 2's tokenizer.bin (llama2c), Llama 2's
// tokenizer.model (sentencepiece), the Llama 2 GGUF vocabulary (gguf, llama), SmolLM2's GGUF
// vocabulary (gguf, gpt2: byte-level BPE with merges and a chat template) and TinyStories-656K's
// tokenizer.json (hf).
//  - the Hugging Face files, loaded back by our HfTokenizer, give the source's ids on a varied
//    text (ASCII, Unicode, runs of spaces, digits, special tokens written in the text);
//  - the GGUF metadata, read back by load_gguf_tokenizer, gives the same ids and chat template,
//    and a whole-model GGUF export carries <arch>.vocab_size and re-imports with the tokenizer;
//  - tokenizer_config.json names the right special tokens and carries the chat template.
// The reference for the ids is the source tokenizer, which tests/io/test_hf_tokenizer.cpp,
// test_spm_tokenizer.cpp and test_gguf.cpp check against transformers / SentencePiece / llama2.c.
#include "io/tokenizer_export.h"

#include <nlohmann/json.hpp>

#include <filesystem>
#include <functional>

#include "io/bytes.h"
#include "io/gguf.h"
#include "io/hf_tokenizer.h"
#include "io/pretrained.h"
#include "io/regex.h"
#include "io/sp_tokenizer.h"
#include "io/spm_tokenizer.h"
#include "tests/io/io_test_util.h"
#include "tests/test_util.h"

using namespace rlhf;

namespace {

const std::string kFixtures = std::string(RLHF_SOURCE_DIR) + "/tests/fixtures/tokenizers";

// Texts unlike the probe text the writers check themselves with.
std::vector<std::string> texts(const io::Tokenizer& t) {
  std::vector<std::string> out = {
      "Hello world",
      " leading space and trailing space ",
      "Tom   and\tJerry\n\n\nran  home.",
      "The year 1999 had 365 days; 3.14159 != 22/7 (x^2 + y^2 = 1000000).",
      "na\xC3\xAFve r\xC3\xA9sum\xC3\xA9, Stra\xC3\x9F"
      "e, \xD0\x9F\xD1\x80\xD0\xB8\xD0\xB2\xD0\xB5\xD1\x82 "
      "\xE4\xBD\xA0\xE5\xA5\xBD\xE4\xB8\x96\xE7\x95\x8C \xF0\x9F\x98\x80\xF0\x9F\x8E\x89!",
      "def f(x):\n    return x * 2  # comment\n",
      "",
  };
  for (int32_t id : {t.bos_id(), t.eos_id()}) {
    if (id < 0) continue;
    const std::string name = t.id_to_token(id);
    if (name.find('\n') != std::string::npos) continue;  // llama2.c's "\n<s>\n"
    out.push_back(name + "Once upon a time" + name + " there " + name);
  }
  return out;
}

void check_same_ids(const io::Tokenizer& ref, const io::Tokenizer& got) {
  for (const std::string& text : texts(ref)) {
    INFO("text: " << text);
    CHECK(got.encode(text, false, false) == ref.encode(text, false, false));
    CHECK(got.encode(text, true, false) == ref.encode(text, true, false));
  }
}

struct Source {
  std::string label;
  std::function<std::unique_ptr<io::Tokenizer>()> load;
};

// Every tokenizer available here; `skipped` gets a line for each one that is not.
std::vector<Source> sources(std::vector<std::string>& skipped) {
  std::vector<Source> out;
  out.push_back({"byte", [] { return io::make_tokenizer("byte"); }});
  const bool regex = io::regex_available();
  const auto fixture = [&](const std::string& name, bool byte_level) {
    if (byte_level && !regex) {
      skipped.push_back(name + " (no PCRE2)");
      return;
    }
    out.push_back({name, [name] { return io::make_tokenizer(kFixtures + "/" + name); }});
  };
  fixture("bytelevel_gpt2.json", true);
  fixture("bytelevel_llama3.json", true);
  fixture("spm_bytefallback.json", false);
  fixture("spm_metaspace.json", false);
  const auto shared = [&](const std::string& rel, bool needs_regex, bool needs_sp) {
    const std::string p = test::shared_data_path(rel);
    if (p.empty() || (needs_regex && !regex) || (needs_sp && !io::sentencepiece_available())) {
      skipped.push_back(rel);
      return;
    }
    out.push_back({rel, [p] { return io::make_tokenizer(p); }});
  };
  shared("stories260K/tok512.bin", false, false);
  shared("llama2-tokenizer/tokenizer.bin", false, false);
  shared("llama2-tokenizer/tokenizer.model", false, true);
  shared("llama-2-tiny-random-gguf/llama-2-tiny-random.gguf", false, false);
  shared("smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf", true, false);
  shared("tinystories-656k/bf16_upstream/tokenizer.json", false, false);
  return out;
}

std::string file_of(const std::vector<io::TokenizerFile>& files, const std::string& name) {
  for (const auto& f : files)
    if (f.name == name) return f.bytes;
  FAIL_CHECK("no " << name << " among the written files");
  return "";
}

}  // namespace

TEST_CASE("tokenizer export: the Hugging Face files of every kind give the same ids") {
  std::vector<std::string> skipped;
  std::set<std::string> kinds;
  for (const Source& s : sources(skipped)) {
    INFO("tokenizer " << s.label);
    const std::unique_ptr<io::Tokenizer> t = s.load();
    kinds.insert(t->kind());
    const std::vector<io::TokenizerFile> files = io::hf_tokenizer_files(*t, 2048);
    const auto back = io::hf_tokenizer_from_files(files, "exported");
    check_same_ids(*t, *back);
    CHECK(back->bos_id() == t->bos_id());
    CHECK(back->eos_id() == t->eos_id());
    CHECK(back->chat_template() == t->chat_template());
    const auto cfg = nlohmann::json::parse(file_of(files, "tokenizer_config.json"));
    if (t->bos_id() >= 0 && cfg.contains("bos_token") && cfg["bos_token"].is_string())
      CHECK(back->token_to_id(cfg["bos_token"].get<std::string>()) == t->bos_id());
    if (t->kind() != "hf") {  // generated configs
      CHECK(cfg.at("model_max_length") == 2048);
      CHECK(cfg.at("tokenizer_class") == "PreTrainedTokenizerFast");
    }
  }
  for (const std::string& s : skipped) MESSAGE("skipped: not available here: " << s);
  CHECK(kinds.count("byte") == 1);
  CHECK(kinds.count("hf") == 1);
}

TEST_CASE("tokenizer export: the byte tokenizer as tokenizer.json keeps \"<s>\" in text as bytes") {
  io::ByteTokenizer t;
  const auto files = io::hf_tokenizer_files(t, 512);
  const auto tj = nlohmann::json::parse(file_of(files, "tokenizer.json"));
  CHECK(tj.at("model").at("vocab").size() == 259);
  CHECK(tj.at("model").at("vocab").at("<0x41>") == 0x41);
  CHECK(tj.at("model").at("vocab").at("</s>") == 257);
  CHECK(nlohmann::json::parse(file_of(files, "tokenizer_config.json")).at("split_special_tokens"));
  const auto back = io::hf_tokenizer_from_files(files, "exported");
  CHECK(back->encode("<s>A", true, false) == std::vector<int32_t>{256, '<', 's', '>', 'A'});
  CHECK(back->pad_id() == 258);
}

TEST_CASE("tokenizer export: GGUF metadata of every kind reads back as the same tokenizer") {
  std::vector<std::string> skipped;
  for (const Source& s : sources(skipped)) {
    INFO("tokenizer " << s.label);
    const std::unique_ptr<io::Tokenizer> t = s.load();
    io::GgufWriter w;
    io::write_gguf_tokenizer(w, *t, t->vocab_size() + 3);  // 3 unused rows of padding
    const io::GgufFile g = io::parse_gguf(io::blob_from_string(w.to_bytes(), "test.gguf"));
    const std::string model = g.metadata.at("tokenizer.ggml.model").get<std::string>();
    CHECK((model == "gpt2" || model == "llama"));
    CHECK(g.metadata.at("tokenizer.ggml.tokens").size() == size_t(t->vocab_size() + 3));
    if (model == "gpt2") CHECK(g.metadata.contains("tokenizer.ggml.merges"));
    if (model == "llama") CHECK(g.metadata.contains("tokenizer.ggml.scores"));
    CHECK(g.metadata.contains("tokenizer.ggml.add_bos_token"));
    const auto back = io::load_gguf_tokenizer(g);
    REQUIRE(back != nullptr);
    check_same_ids(*t, *back);
    CHECK(back->chat_template() == t->chat_template());
    CHECK(back->eos_id() == t->eos_id());
  }
  for (const std::string& s : skipped) MESSAGE("skipped: not available here: " << s);
}

TEST_CASE("tokenizer export: SmolLM2's GGUF vocabulary as tokenizer.json and GGUF") {
  const std::string p =
      test::shared_data_path("smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf");
  if (p.empty() || !io::regex_available()) {
    MESSAGE("skipped: SmolLM2 GGUF or PCRE2 not available");
    return;
  }
  const auto t = io::make_tokenizer(p);
  const auto files = io::hf_tokenizer_files(*t, 8192);
  const auto tj = nlohmann::json::parse(file_of(files, "tokenizer.json"));
  CHECK(tj.at("model").at("merges").size() > 40000);
  CHECK(tj.at("pre_tokenizer").dump().find("\"individual_digits\":true") != std::string::npos);
  const auto cfg = nlohmann::json::parse(file_of(files, "tokenizer_config.json"));
  CHECK(cfg.at("eos_token") == "<|im_end|>");
  CHECK(cfg.at("chat_template").get<std::string>().find("<|im_start|>") != std::string::npos);
  // ChatML text with the special tokens written in it.
  const std::string chat = "<|im_start|>user\nWhat is 12+30?<|im_end|>\n<|im_start|>assistant\n";
  const auto back = io::hf_tokenizer_from_files(files, "exported");
  CHECK(back->encode(chat, true, false) == t->encode(chat, true, false));
  CHECK(t->encode(chat, false, false).front() == t->token_to_id("<|im_start|>"));
}

TEST_CASE("tokenizer export: whole-model GGUF export carries vocab_size and the tokenizer") {
  const std::string p = test::shared_data_path("stories260K/stories260K.bin");
  if (p.empty()) {
    MESSAGE("skipped: ../shared/data not found (set RLHF_SHARED_DATA): stories260K");
    return;
  }
  test::TempDir dir;
  const io::PretrainedModel m = io::open_pretrained(p);
  REQUIRE(m.tokenizer != nullptr);
  CHECK(m.tokenizer->kind() == "llama2c");
  const std::string out = dir.file("s.gguf");
  io::export_gguf(out, m, io::DType::kF32);
  const io::GgufFile g = io::open_gguf(out);
  CHECK(g.metadata.at("llama.vocab_size") == 512);
  CHECK(g.metadata.at("tokenizer.ggml.model") == "llama");
  CHECK(g.metadata.at("tokenizer.ggml.tokens")[1] == "<s>");
  const io::PretrainedModel back = io::open_pretrained(out);
  REQUIRE(back.tokenizer != nullptr);
  CHECK(back.tokenizer->kind() == "gguf");
  check_same_ids(*m.tokenizer, *back.tokenizer);
  // The Hugging Face folder carries a tokenizer.json that tokenizes the same.
  io::export_hf_folder(dir.file("hf"), m, io::DType::kF32);
  for (const char* f : {"tokenizer.json", "tokenizer_config.json", "generation_config.json"})
    CHECK(std::filesystem::exists(dir.file("hf") + "/" + f));
  const io::PretrainedModel hf = io::open_pretrained(dir.file("hf"));
  REQUIRE(hf.tokenizer != nullptr);
  CHECK(hf.tokenizer->kind() == "hf");
  check_same_ids(*m.tokenizer, *hf.tokenizer);
  const auto gen = nlohmann::json::parse(test::slurp(dir.file("hf") + "/generation_config.json"));
  CHECK(gen.at("bos_token_id") == 1);
  CHECK(gen.at("eos_token_id") == 2);
}

namespace {

// A tokenizer of any kind with given files (no encoding).
class Fake final : public io::Tokenizer {
 public:
  Fake(std::string kind, std::vector<io::TokenizerFile> files)
      : kind_(std::move(kind)), files_(std::move(files)) {}
  std::vector<int32_t> encode(std::string_view, bool, bool) const override { return {}; }
  std::string decode(std::span<const int32_t>, bool) const override { return ""; }
  int32_t bos_id() const override { return 1; }
  int32_t eos_id() const override { return 2; }
  int32_t pad_id() const override { return 0; }
  int64_t vocab_size() const override { return 3; }
  bool is_special(int32_t) const override { return false; }
  std::string name() const override { return "fake"; }
  std::string kind() const override { return kind_; }
  std::vector<io::TokenizerFile> files() const override { return files_; }

 private:
  std::string kind_;
  std::vector<io::TokenizerFile> files_;
};

// A protobuf length-delimited field.
std::string proto_bytes(int field, const std::string& payload) {
  return std::string(1, char(field << 3 | 2)) + char(payload.size()) + payload;
}

}  // namespace

TEST_CASE("tokenizer export: a tokenizer that cannot be written is an error naming its kind") {
  const Fake unknown("tiktoken", {});
  RLHF_CHECK_CONTAINS(test::error_of([&] { io::hf_tokenizer_files(unknown, 16); }),
                      "kind 'tiktoken'");
  io::GgufWriter w;
  RLHF_CHECK_CONTAINS(test::error_of([&] { io::write_gguf_tokenizer(w, unknown, 3); }),
                      "kind 'tiktoken'");
  // A SentencePiece unigram model (TrainerSpec.model_type = 1) has no BPE merges to write.
  std::string model;
  for (const char* piece : {"<unk>", "<s>", "</s>"})
    model += proto_bytes(1, proto_bytes(1, piece) + "\x15" + std::string(4, '\0') + "\x18\x03");
  model += proto_bytes(2, "\x18\x01");
  const Fake unigram("sentencepiece", {{"tokenizer.model", model}});
  const std::string e = test::error_of([&] { io::hf_tokenizer_files(unigram, 16); });
  RLHF_CHECK_CONTAINS(e, "tokenizer kind 'sentencepiece'");
  RLHF_CHECK_CONTAINS(e, "model type unigram");
  // The same model as BPE (model_type = 2) with Llama's normalizer is accepted by the reader.
  const std::string bpe = model.substr(0, model.size() - 4) + proto_bytes(2, "\x18\x02") +
                          proto_bytes(3, proto_bytes(1, "identity") + std::string("\x20\x00", 2));
  const io::ScoreVocab v = io::sentencepiece_score_vocab(Fake("sentencepiece", {{"m", bpe}}));
  CHECK(v.pieces == std::vector<std::string>{"<unk>", "<s>", "</s>"});
  CHECK(v.types[1] == io::TokenType::kControl);
}

TEST_CASE("tokenizer export: a GGUF llama vocabulary keeps its tokenizer.chat_template") {
  const std::string p = test::shared_data_path("llama2-tokenizer/tokenizer.bin");
  if (!std::filesystem::exists(p)) {
    MESSAGE("skipped: ../shared/data not found (set RLHF_SHARED_DATA): llama2-tokenizer");
    return;
  }
  const std::unique_ptr<io::Tokenizer> t = io::make_tokenizer(p);
  io::GgufWriter w;
  io::write_gguf_tokenizer(w, *t, t->vocab_size());
  const std::string tmpl = "{% for m in messages %}[INST] {{ m['content'] }} [/INST]{% endfor %}";
  w.add_string("tokenizer.chat_template", tmpl);
  const io::GgufFile g = io::parse_gguf(io::blob_from_string(w.to_bytes(), "llama.gguf"));
  REQUIRE(g.metadata.at("tokenizer.ggml.model").get<std::string>() == "llama");
  const auto back = io::load_gguf_tokenizer(g);
  REQUIRE(back != nullptr);
  CHECK(back->kind() == "gguf");
  CHECK(back->chat_template() == tmpl);
}
