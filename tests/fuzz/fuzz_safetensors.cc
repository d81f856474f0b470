// libFuzzer harness: safetensors header parsing and tensor conversion (io/safetensors.h).
#include <vector>

#include "io/safetensors.h"
#include "tests/fuzz/fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  rlhf::fuzz::expect_only_rlhf_errors([&] {
    const rlhf::io::SafetensorsFile f = rlhf::io::parse_safetensors(
        rlhf::io::blob_from_string(rlhf::fuzz::bytes(data, size), "fuzz.safetensors"));
    std::vector<float> buf;
    for (const auto& [name, e] : f.tensors) {
      if (e.numel > (int64_t{1} << 24)) continue;  // the data is in the file: size is bounded
      buf.resize(static_cast<size_t>(e.numel));
      f.read_f32(name, buf.data());
    }
  });
  return 0;
}
