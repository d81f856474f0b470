// ByteTokenizer: exact byte round trips (UTF-8 included), special tokens, range checks.
#include "io/tokenizer.h"

#include "tests/io/io_test_util.h"

using namespace rlhf;

TEST_CASE("byte tokenizer: ids are the bytes, round trip of UTF-8 and every byte value") {
  io::ByteTokenizer tok;
  CHECK(tok.vocab_size() == 259);
  CHECK(tok.bos_id() == 256);
  CHECK(tok.eos_id() == 257);
  CHECK(tok.pad_id() == 258);
  CHECK(tok.is_special(256));
  CHECK_FALSE(tok.is_special(255));
  CHECK(tok.name() == "byte (vocab 259)");

  CHECK(tok.encode("Hi!", false, false) == std::vector<int32_t>{72, 105, 33});
  CHECK(tok.encode("Hi", true, true) == std::vector<int32_t>{256, 72, 105, 257});
  CHECK(tok.encode("", true, false) == std::vector<int32_t>{256});

  // "é" is U+00E9 = C3 A9, "世" is E4 B8 96, "🙂" is F0 9F 99 82 in UTF-8.
  const std::string text = "caf\xC3\xA9 \xE4\xB8\x96 \xF0\x9F\x99\x82";
  const auto ids = tok.encode(text, true, true);
  CHECK(ids == std::vector<int32_t>{256, 99, 97, 102, 0xC3, 0xA9, 32, 0xE4, 0xB8, 0x96, 32, 0xF0,
                                    0x9F, 0x99, 0x82, 257});
  CHECK(tok.decode(ids) == text);
  CHECK(tok.decode(ids, false) == "<s>" + text + "</s>");

  std::string all;
  for (int b = 0; b < 256; ++b) all.push_back(static_cast<char>(b));
  const auto all_ids = tok.encode(all, false, false);
  REQUIRE(all_ids.size() == 256);
  for (int b = 0; b < 256; ++b) CHECK(all_ids[static_cast<size_t>(b)] == b);
  CHECK(tok.decode(all_ids) == all);

  const std::vector<int32_t> padded = {72, 257, 258, 258};
  CHECK(tok.decode(padded) == "H");
  CHECK(tok.decode(padded, false) == "H</s><pad><pad>");
  // A slice (span) of a longer sequence.
  CHECK(tok.decode(std::span<const int32_t>(ids).subspan(1, 3)) == "caf");
}

TEST_CASE("byte tokenizer: out-of-range ids and unknown tokenizer names are errors") {
  io::ByteTokenizer tok;
  RLHF_CHECK_CONTAINS(test::error_of([&] {
                        tok.decode(std::vector<int32_t>{65, 259});
                      }),
                      "token id 259 at position 1 is outside");
  RLHF_CHECK_CONTAINS(test::error_of([&] { tok.decode(std::vector<int32_t>{-1}); }), "token id -1");
  auto t = io::make_tokenizer("byte");
  CHECK(t->vocab_size() == 259);
  RLHF_CHECK_CONTAINS(test::error_of([] { io::make_tokenizer("gpt2"); }),
                      "unknown tokenizer 'gpt2'");
}
