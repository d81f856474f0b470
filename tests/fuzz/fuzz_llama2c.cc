// libFuzzer harness: llama2.c checkpoint headers and tensor tables (io/llama2c.h).
#include <vector>

#include "io/llama2c.h"
#include "model/layout.h"
#include "tests/fuzz/fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  rlhf::fuzz::expect_only_rlhf_errors([&] {
    const rlhf::io::Blob b = rlhf::io::blob_from_string(rlhf::fuzz::bytes(data, size), "fuzz.bin");
    (void)rlhf::io::looks_like_llama2c(b);
    (void)rlhf::io::looks_like_llama2c(b, false);
    const rlhf::io::Llama2cHeader h = rlhf::io::parse_llama2c_header(b);
    auto t = rlhf::io::open_llama2c_tensors(b, h);
    const rlhf::model::ParamLayout layout(rlhf::io::llama2c_model_config(h),
                                          rlhf::model::HeadKind::kLM);
    std::vector<float> buf;
    for (const auto& u : layout.units())
      for (const auto& ti : u.tensors) {
        buf.resize(static_cast<size_t>(ti.numel));
        t->read_checked(ti.name, buf.data(), ti.shape);
      }
  });
  return 0;
}
