// libFuzzer harness: llama2.c tokenizer.bin parsing, then encode/decode (io/spm_tokenizer.h).
#include "io/spm_tokenizer.h"
#include "tests/fuzz/fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  rlhf::fuzz::expect_only_rlhf_errors([&] {
    auto tok = rlhf::io::load_llama2c_tokenizer(
        rlhf::io::blob_from_string(rlhf::fuzz::bytes(data, size), "fuzz.bin"));
    tok->decode(tok->encode("Once upon a time <s> 🙂", true, true), false);
    tok->decode(tok->encode(rlhf::fuzz::bytes(data, std::min<size_t>(size, 256)), false, false));
  });
  return 0;
}
