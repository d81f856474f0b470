// Chat templates: the ChatML and Llama 2 [INST] forms, their detection, and that the special
// tokens in the formatted text encode as single ids.
#include "io/chat_template.h"

#include <filesystem>

#include "io/hf_tokenizer.h"
#include "io/regex.h"
#include "tests/io/io_test_util.h"
#include "tests/test_util.h"

using namespace rlhf;

TEST_CASE("chat template: ChatML and Llama 2 forms") {
  const std::vector<io::ChatMessage> conv = {
      {"system", "Be brief."}, {"user", "Hi!"}, {"assistant", "Hello."}, {"user", "2+2?"}};
  CHECK(io::apply_chat_template(conv, io::ChatFormat::kChatML, true) ==
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n"
        "<|im_start|>assistant\nHello.<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n"
        "<|im_start|>assistant\n");
  CHECK(io::apply_chat_template(conv, io::ChatFormat::kLlama2, true) ==
        "<s>[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi! [/INST] Hello. </s><s>[INST] 2+2? [/INST]");
  CHECK(io::apply_chat_template({{"user", "Hi"}}, io::ChatFormat::kChatML, false) ==
        "<|im_start|>user\nHi<|im_end|>\n");
  RLHF_CHECK_CONTAINS(test::error_of([] {
                        io::apply_chat_template({{"bot", "x"}}, io::ChatFormat::kChatML, true);
                      }),
                      "unknown role 'bot'");
  RLHF_CHECK_CONTAINS(
      test::error_of([] {
        io::apply_chat_template({{"user", "a"}, {"system", "b"}}, io::ChatFormat::kChatML, true);
      }),
      "a system message must come first");
  RLHF_CHECK_CONTAINS(
      test::error_of([] {
        io::apply_chat_template({{"user", "a"}, {"user", "b"}}, io::ChatFormat::kLlama2, true);
      }),
      "alternating user/assistant");
}

TEST_CASE("chat template: detection, and the formatted specials encode as single tokens") {
  const std::string fx = std::string(RLHF_SOURCE_DIR) + "/tests/fixtures/tokenizers";
  io::ByteTokenizer bytes;
  CHECK(io::detect_chat_format(bytes, "llama") == io::ChatFormat::kLlama2);
  CHECK(io::detect_chat_format(bytes, "qwen2") == io::ChatFormat::kChatML);
  if (!io::regex_available()) return;
  auto tok = io::load_hf_tokenizer(fx + "/bytelevel_gpt2.json");  // has <|im_start|>
  CHECK(io::detect_chat_format(*tok, "llama") == io::ChatFormat::kChatML);
  const std::string text = io::apply_chat_template({{"user", "Hi"}}, io::ChatFormat::kChatML, true);
  const auto ids = tok->encode(text, false, false);
  CHECK(ids.front() == tok->token_to_id("<|im_start|>"));
  CHECK(std::count(ids.begin(), ids.end(), tok->token_to_id("<|im_end|>")) == 1);
  CHECK(tok->decode(ids, false) == text);
  // Llama 2: "<s>" in the text is BOS for the Llama-2 vocabulary.
  const std::string root = test::shared_data_dir();
  const std::string p = root + "/llama2-tokenizer/tokenizer.bin";
  if (root.empty() || !std::filesystem::exists(p)) {
    MESSAGE("skipped: ../shared/data not found (set RLHF_SHARED_DATA)");
    return;
  }
  auto llama = io::make_tokenizer(p);
  const auto lids = llama->encode(
      io::apply_chat_template({{"user", "Hi"}, {"assistant", "Yo"}}, io::ChatFormat::kLlama2, true),
      false, false);
  CHECK(lids.front() == 1);
  CHECK(lids.back() == 2);
  CHECK(std::count(lids.begin(), lids.end(), 1) == 1);
}
