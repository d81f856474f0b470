// libFuzzer harness: GGUF parsing, metadata → ModelConfig, tensor reads with the Q/K
// un-permutation, and the embedded tokenizer (io/gguf.h, io/spm_tokenizer.h).
#include <memory>
#include <vector>

#include "io/gguf.h"
#include "io/spm_tokenizer.h"
#include "model/layout.h"
#include "tests/fuzz/fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  rlhf::fuzz::expect_only_rlhf_errors([&] {
    auto f = std::make_shared<rlhf::io::GgufFile>(rlhf::io::parse_gguf(
        rlhf::io::blob_from_string(rlhf::fuzz::bytes(data, size), "fuzz.gguf")));
    rlhf::fuzz::expect_only_rlhf_errors([&] {
      auto tok = rlhf::io::load_gguf_tokenizer(*f);
      if (tok) tok->decode(tok->encode("Once upon a time <s> 🙂", true, true), false);
    });
    const rlhf::model::ModelConfig c = rlhf::io::gguf_model_config(*f);
    auto t = rlhf::io::open_gguf_tensors(f, c);
    const rlhf::model::ParamLayout layout(c, rlhf::model::HeadKind::kLM);
    std::vector<float> buf;
    for (const auto& u : layout.units())
      for (const auto& ti : u.tensors) {
        if (!t->find(ti.name) || t->find(ti.name)->numel() > (int64_t{1} << 24)) continue;
        buf.resize(static_cast<size_t>(ti.numel));
        t->read_checked(ti.name, buf.data(), ti.shape);
      }
  });
  return 0;
}
