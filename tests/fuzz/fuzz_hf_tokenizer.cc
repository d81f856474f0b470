// libFuzzer harness: Hugging Face tokenizer.json parsing, then encode/decode of a fixed text and of
// the input itself (io/hf_tokenizer.h).
#include <nlohmann/json.hpp>

#include "io/hf_tokenizer.h"
#include "tests/fuzz/fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  rlhf::fuzz::expect_only_rlhf_errors([&] {
    auto tok = rlhf::io::hf_tokenizer_from_files(
        {{"tokenizer.json", rlhf::fuzz::bytes(data, size)}}, "fuzz");
    tok->decode(
        tok->encode("Once upon a time, there was a little girl named Lily. 🙂 12", true, true),
        false);
    tok->decode(tok->encode(rlhf::fuzz::bytes(data, std::min<size_t>(size, 256)), false, false));
  });
  return 0;
}
