// Chat templates: render_chat_template against transformers' apply_chat_template on real model
// templates (tests/fixtures/chat_templates, written by scripts/make_chat_template_fixtures.py),
// render_chat through tokenizers that carry a template (tokenizer_config.json, the SmolLM2 GGUF),
// raise_exception / strftime_now / error reporting, the built-in fallback formats, and the
// OpenRLHF-style prompt/response split used by the SFT and reward-model datasets.
#include "io/chat_template.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <ctime>
#include <filesystem>
#include <fstream>

#include "io/hdf5_ckpt.h"
#include "io/hf_tokenizer.h"
#include "io/jsonl.h"
#include "io/preference_dataset.h"
#include "io/regex.h"
#include "io/sft_dataset.h"
#include "io/tokenizer_hdf5.h"
#include "tests/io/io_test_util.h"
#include "tests/test_util.h"

using namespace rlhf;
using nlohmann::json;

namespace {

const std::string kFixtures = std::string(RLHF_SOURCE_DIR) + "/tests/fixtures/chat_templates";

json load_fixture(const std::string& name) {
  return io::parse_json_file(kFixtures + "/" + name + ".json");
}

// The same, keys in file order (tool schemas and arguments are rendered in that order).
nlohmann::ordered_json load_ordered(const std::string& path) {
  std::ifstream f(path);
  REQUIRE(f.good());
  return nlohmann::ordered_json::parse(f);
}

// The templates of tests/fixtures/chat_templates (scripts/make_chat_template_fixtures.py).
const char* const kTemplates[] = {"smollm2-135m-instruct",
                                  "qwen2.5-instruct",
                                  "qwen3",
                                  "llama3.1-instruct",
                                  "deepseek-r1-distill-qwen",
                                  "mistral-nemo-instruct-2407",
                                  "gemma-2-it",
                                  "phi-3.5-mini-instruct",
                                  "hermes-3-llama-3.1-tool-use"};

std::optional<std::string> opt_string(const json& fx, const char* key) {
  if (!fx.contains(key) || fx[key].is_null()) return std::nullopt;
  return fx[key].get<std::string>();
}

io::ChatTemplateTokens fixture_tokens(const json& fx) {
  return {opt_string(fx, "bos_token"), opt_string(fx, "eos_token"), opt_string(fx, "pad_token"),
          opt_string(fx, "unk_token")};
}

std::vector<io::ChatMessage> fixture_messages(const json& c) {
  return io::chat_messages_from_json(c.at("messages"), c.at("name").get<std::string>());
}

// The fixture case `name` ("user_only/add_generation_prompt=true", ...).
const json& fixture_case(const json& fx, const std::string& name) {
  for (const json& c : fx.at("cases"))
    if (c.at("name") == name) return c;
  FAIL("no case " << name);
  static const json none;
  return none;
}

// A folder with the byte-level BPE test tokenizer (has <|im_start|>, <|im_end|>) and a
// tokenizer_config.json holding `config`.
std::string tokenizer_folder(const test::TempDir& dir, const json& config) {
  std::filesystem::copy_file(
      std::string(RLHF_SOURCE_DIR) + "/tests/fixtures/tokenizers/bytelevel_gpt2.json",
      dir.file("tokenizer.json"));
  dir.write("tokenizer_config.json", config.dump());
  return dir.path().string();
}

}  // namespace

TEST_CASE("chat template: real templates render exactly as transformers' apply_chat_template") {
  // Every case: the bytes transformers rendered, or, where transformers raised, an error (the
  // template's own raise_exception message where it raised one).
  int files = 0, rendered = 0, refused = 0;
  for (const char* name : kTemplates) {
    const nlohmann::ordered_json fx = load_ordered(kFixtures + "/" + name + ".json");
    ++files;
    const std::string tmpl = fx.at("template").get<std::string>();
    const io::ChatTemplateTokens tokens = fixture_tokens(json::parse(fx.dump()));
    for (const auto& c : fx.at("cases")) {
      const std::string label = std::string(name) + ": " + c.at("name").get<std::string>();
      nlohmann::ordered_json extra = c.at("kwargs");
      if (!c.at("tools").is_null()) extra["tools"] = c.at("tools");
      auto render = [&] {
        return io::render_chat_template_json(tmpl, label, tokens, c.at("messages"),
                                             c.at("add_generation_prompt").get<bool>(), extra);
      };
      INFO(label);
      if (c.contains("expected")) {
        CHECK(render() == c.at("expected").get<std::string>());
        ++rendered;
      } else {
        const std::string msg = test::error_of(render);
        const std::string error = c.at("error").get<std::string>();
        if (c.at("raised").get<bool>()) {
          CHECK(msg == label + ": the template refused the conversation: " +
                           error.substr(error.find(": ") + 2));
        } else {
          RLHF_CHECK_CONTAINS(msg, label + ": cannot render the Jinja template: line ");
        }
        ++refused;
      }
    }
  }
  CHECK(files == 9);
  CHECK(rendered == 158);
  CHECK(refused == 22);
}

TEST_CASE("chat template: defaults and special tokens come from the template, as in transformers") {
  const json smol = load_fixture("smollm2-135m-instruct");
  const json qwen = load_fixture("qwen2.5-instruct");
  const json llama = load_fixture("llama3.1-instruct");
  const std::vector<io::ChatMessage> hi = {{"user", "Hello!"}};
  // Default system prompts when none is given.
  CHECK(io::render_chat_template(smol.at("template"), "smollm2", fixture_tokens(smol), hi, true) ==
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
        "Face<|im_end|>\n<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n");
  CHECK(io::render_chat_template(qwen.at("template"), "qwen", fixture_tokens(qwen), hi, false)
            .starts_with("<|im_start|>system\nYou are Qwen, created by Alibaba Cloud."));
  // Llama 3.1: bos_token written by the template, date_string's default, contents trimmed.
  const std::string l = io::render_chat_template(llama.at("template"), "llama",
                                                 fixture_tokens(llama), {{"user", "  hi  "}}, true);
  CHECK(l.starts_with("<|begin_of_text|><|start_header_id|>system<|end_header_id|>"));
  CHECK(l.find("Today Date: 26 Jul 2024") != std::string::npos);
  CHECK(
      l.ends_with("user<|end_header_id|>\n\nhi<|eot_id|><|start_header_id|>assistant"
                  "<|end_header_id|>\n\n"));
  // Without a bos_token the template sees it undefined (renders as "").
  io::ChatTemplateTokens no_bos = fixture_tokens(llama);
  no_bos.bos_token.reset();
  CHECK(io::render_chat_template(llama.at("template"), "llama", no_bos, hi, true)
            .starts_with("<|start_header_id|>system"));
}

TEST_CASE("chat template: raise_exception, strftime_now and errors name the template") {
  const io::ChatTemplateTokens none;
  const std::string gemma_like =
      "{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') "
      "}}{% endif %}{% for m in messages %}{{ m['content'] }}{% endfor %}";
  CHECK(io::render_chat_template(gemma_like, "t", none, {{"user", "ok"}}, false) == "ok");
  std::string msg = test::error_of([&] {
    io::render_chat_template(gemma_like, "chat template of x.json", none,
                             {{"system", "s"}, {"user", "u"}}, false);
  });
  CHECK(msg ==
        "chat template of x.json: the template refused the conversation: System role not "
        "supported");
  // strftime_now: local time, as transformers' datetime.now().strftime.
  char today[64];
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  std::strftime(today, sizeof today, "%d %b %Y", &local);
  CHECK(io::render_chat_template("{{ strftime_now('%d %b %Y') }}", "t", none, {{"user", "x"}},
                                 false) == today);
  // Llama 3.2 style: strftime_now is defined, date_string is not.
  CHECK(io::render_chat_template("{% if strftime_now is defined and date_string is not defined "
                                 "%}yes{% endif %}",
                                 "t", none, {{"user", "x"}}, false) == "yes");
  // A parse error and a render error carry the template's name, the row and column.
  msg = test::error_of([&] {
    io::render_chat_template("{% for m in %}{% endfor %}", "tmpl A", none, {{"user", "x"}}, true);
  });
  RLHF_CHECK_CONTAINS(msg, "tmpl A: cannot parse the Jinja template");
  msg = test::error_of([&] {
    io::render_chat_template("line 1\n{{ no_such_function(1) }}", "tmpl B", none, {{"user", "x"}},
                             true);
  });
  CHECK(msg ==
        "tmpl B: cannot render the Jinja template: line 2, column 4: 'no_such_function' is "
        "undefined (not a known function) (near `{{ no_such_function(1) }}`)");
  // Constructs the engine does not have fail at parse time, naming their line.
  msg = test::error_of([&] {
    io::render_chat_template("{% for m in messages %}\n{% include 'other.jinja' %}{% endfor %}",
                             "tmpl C", none, {{"user", "x"}}, true);
  });
  CHECK(msg ==
        "tmpl C: cannot parse the Jinja template: line 2, column 1: the 'include' tag is not "
        "supported (near `{% include 'other.jinja' %}{% endfor %}`)");
}

TEST_CASE("chat template: render_chat uses the tokenizer's template and special tokens") {
  if (!io::regex_available()) return;
  const json smol = load_fixture("smollm2-135m-instruct");
  test::TempDir dir;
  const std::string folder = tokenizer_folder(dir, {{"chat_template", smol.at("template")},
                                                    {"bos_token", "<|im_start|>"},
                                                    {"eos_token", "<|im_end|>"}});
  const auto tok = io::make_tokenizer(folder);
  REQUIRE(tok->chat_template() == smol.at("template").get<std::string>());
  const io::ChatTemplateTokens t = io::chat_template_tokens(*tok);
  CHECK(t.bos_token == "<|im_start|>");
  CHECK(t.eos_token == "<|im_end|>");
  for (const json& c : smol.at("cases"))
    CHECK(io::render_chat(*tok, "llama", fixture_messages(c), c.at("add_generation_prompt")) ==
          c.at("expected").get<std::string>());
  // The rendered specials encode as single tokens.
  const std::string text = io::render_chat(*tok, "llama", {{"user", "Hi"}}, true);
  const auto ids = tok->encode(text, false, false);
  CHECK(ids.front() == tok->token_to_id("<|im_start|>"));
  CHECK(std::count(ids.begin(), ids.end(), tok->token_to_id("<|im_end|>")) == 2);
  // A checkpoint keeps the template with its tokenizer (/tokenizer/tokenizer_config.json).
  {
    io::CheckpointWriter w(dir.file("ckpt.h5"));
    io::write_tokenizer_hdf5(w, *tok);
    w.commit();
  }
  const auto stored = io::read_tokenizer_hdf5(io::CheckpointReader(dir.file("ckpt.h5")));
  REQUIRE(stored != nullptr);
  CHECK(stored->chat_template() == tok->chat_template());
  CHECK(io::render_chat(*stored, "llama", {{"user", "Hi"}}, true) == text);
  // A tokenizer without a template: the built-in fallback.
  const io::ByteTokenizer bytes;
  CHECK(io::render_chat(bytes, "llama", {{"user", "Hi"}}, true) == "<s>[INST] Hi [/INST]");
  CHECK(io::render_chat(bytes, "qwen2", {{"user", "Hi"}}, true) ==
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
}

TEST_CASE("chat template: the SmolLM2 GGUF's own template gives its default system prompt") {
  const std::string gguf =
      test::shared_data_path("smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf");
  if (gguf.empty() || !io::regex_available()) {
    MESSAGE("skipped: ../shared/data/smollm2-135m-instruct not found (set RLHF_SHARED_DATA)");
    return;
  }
  const json smol = load_fixture("smollm2-135m-instruct");
  const auto tok = io::make_tokenizer(gguf);
  CHECK(tok->chat_template() == smol.at("template").get<std::string>());
  const json& c = fixture_case(smol, "user_only/add_generation_prompt=true");
  const std::string text = io::render_chat(*tok, "llama", fixture_messages(c), true);
  CHECK(text == c.at("expected").get<std::string>());
  CHECK(text.starts_with(
      "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"));
  CHECK(tok->encode(text, false, false).front() == 1);  // <|im_start|>
}

TEST_CASE("chat template: built-in ChatML and Llama 2 fallback formats") {
  const std::vector<io::ChatMessage> conv = {
      {"system", "Be brief."}, {"user", "Hi!"}, {"assistant", "Hello."}, {"user", "2+2?"}};
  CHECK(io::apply_fallback_chat_format(conv, io::ChatFormat::kChatML, true) ==
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n"
        "<|im_start|>assistant\nHello.<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n"
        "<|im_start|>assistant\n");
  CHECK(io::apply_fallback_chat_format(conv, io::ChatFormat::kLlama2, true) ==
        "<s>[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi! [/INST] Hello. </s><s>[INST] 2+2? [/INST]");
  CHECK(io::apply_fallback_chat_format({{"user", "Hi"}}, io::ChatFormat::kChatML, false) ==
        "<|im_start|>user\nHi<|im_end|>\n");
  RLHF_CHECK_CONTAINS(
      test::error_of([] {
        io::apply_fallback_chat_format({{"bot", "x"}}, io::ChatFormat::kChatML, true);
      }),
      "unknown role 'bot'");
  RLHF_CHECK_CONTAINS(test::error_of([] {
                        io::apply_fallback_chat_format({{"user", "a"}, {"system", "b"}},
                                                       io::ChatFormat::kChatML, true);
                      }),
                      "a system message must come first");
  RLHF_CHECK_CONTAINS(test::error_of([] {
                        io::apply_fallback_chat_format({{"user", "a"}, {"user", "b"}},
                                                       io::ChatFormat::kLlama2, true);
                      }),
                      "alternating user/assistant");
  const io::ByteTokenizer bytes;
  CHECK(io::fallback_chat_format(bytes, "llama") == io::ChatFormat::kLlama2);
  CHECK(io::fallback_chat_format(bytes, "qwen2") == io::ChatFormat::kChatML);
  // Llama 2: "<s>" in the text is BOS for the Llama-2 vocabulary.
  const std::string p = test::shared_data_path("llama2-tokenizer/tokenizer.bin");
  if (p.empty()) {
    MESSAGE("skipped: ../shared/data not found (set RLHF_SHARED_DATA)");
    return;
  }
  auto llama = io::make_tokenizer(p);
  const auto lids = llama->encode(
      io::render_chat(*llama, "llama", {{"user", "Hi"}, {"assistant", "Yo"}}, true), false, false);
  CHECK(lids.front() == 1);
  CHECK(lids.back() == 2);
  CHECK(std::count(lids.begin(), lids.end(), 1) == 1);
}

TEST_CASE("chat template: messages from JSON") {
  CHECK(io::chat_messages_from_json("hi", "w").at(0).role == "user");
  const auto m = io::chat_messages_from_json(
      json::parse(R"([{"role":"system","content":"s"},{"role":"user","content":"u"}])"), "w");
  REQUIRE(m.size() == 2);
  CHECK((m[1].role == "user" && m[1].content == "u"));
  RLHF_CHECK_CONTAINS(test::error_of([] { io::chat_messages_from_json(json::array(), "f:3"); }),
                      "f:3: must be a non-empty string (or chat messages)");
  RLHF_CHECK_CONTAINS(test::error_of([] {
                        io::chat_messages_from_json(json::parse(R"([{"role":"user"}])"), "f:4");
                      }),
                      "f:4: chat messages must be objects with string role and content");
}

TEST_CASE("chat template: SFT and reward-model samples split as OpenRLHF's datasets do") {
  if (!io::regex_available()) return;
  const json smol = load_fixture("smollm2-135m-instruct");
  test::TempDir dir;
  const std::string folder = tokenizer_folder(dir, {{"chat_template", smol.at("template")},
                                                    {"bos_token", "<|im_start|>"},
                                                    {"eos_token", "<|im_end|>"}});
  const auto tok = io::make_tokenizer(folder);
  const std::string sys =
      "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
      "Face<|im_end|>\n";
  const std::string prompt = sys + "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n";
  auto enc = [&](const std::string& s) { return tok->encode(s, false, false); };
  auto cat = [](std::vector<int32_t> a, const std::vector<int32_t>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
  };
  // SFT: prompt = render(input, generation prompt), response = the rest of render(input + output)
  // with its trailing newline dropped; the response ends with <|im_end|> = EOS, so no extra EOS.
  const std::string data =
      dir.write("sft.jsonl",
                "{\"input\": \"Hi\", \"output\": \"Yo\"}\n"
                "{\"input\": [{\"role\": \"user\", \"content\": \"Hi\"}, {\"role\": \"assistant\", "
                "\"content\": \"Yo\"}]}\n");
  io::SftDatasetOptions o;
  o.max_len = 200;
  o.apply_chat_template = true;
  const io::SftDataset ds = io::build_sft_dataset(data, *tok, o);
  REQUIRE(ds.samples.size() == 2);
  for (const io::SftSample& s : ds.samples) {
    CHECK(s.tokens == cat(enc(prompt), enc("Yo<|im_end|>")));
    CHECK(s.prompt_len == int32_t(enc(prompt).size()));
  }
  const std::string bad = dir.write("bad.jsonl", "{\"input\": \"Hi\"}\n");
  RLHF_CHECK_CONTAINS(test::error_of([&] { io::build_sft_dataset(bad, *tok, o); }),
                      bad + ":1: missing key 'output' (--output_key)");
  // Reward model: each side is render(prompt + side), EOS = its closing <|im_end|>.
  const std::string pairs = dir.write(
      "rm.jsonl", "{\"prompt\": \"Hi\", \"chosen\": \"Yo\", \"rejected\": \"Go away\"}\n");
  io::PreferenceDatasetOptions po;
  po.prompt_key = "prompt";
  po.apply_chat_template = true;
  const io::PreferenceDataset pd = io::build_preference_dataset(pairs, *tok, po);
  REQUIRE(pd.pairs.size() == 1);
  CHECK(pd.pairs[0].chosen == enc(prompt + "Yo<|im_end|>"));
  CHECK(pd.pairs[0].rejected == enc(prompt + "Go away<|im_end|>"));
  po.prompt_key = "";
  RLHF_CHECK_CONTAINS(test::error_of([&] { io::build_preference_dataset(pairs, *tok, po); }),
                      "each side must be a conversation");
  // A template whose full render does not start with the prompt render cannot be split.
  test::TempDir dir2;
  const auto odd = io::make_tokenizer(tokenizer_folder(
      dir2, {{"chat_template",
              "{% for m in messages %}{{ m.content }}{% endfor %}{% if add_generation_prompt "
              "%}<gen>{% endif %}"}}));
  RLHF_CHECK_CONTAINS(
      test::error_of([&] {
        io::render_chat_split(*odd, "llama", {{"user", "Hi"}}, {{"assistant", "Yo"}}, "f:1");
      }),
      "f:1: --apply_chat_template: the conversation rendered in full does not "
      "start with its prompt");
}
