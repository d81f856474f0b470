// libFuzzer harness: an rlhf HDF5 checkpoint as --pretrain reads it (io/hdf5_ckpt.h,
// io/tokenizer_hdf5.h): the bytes are written to a file, opened with io::CheckpointReader, listed,
// then read_model_config_hdf5 (format, config JSON, head, the per-field attributes), every unit of
// the model through load_model_unit_hdf5 (units up to 2^22 floats: the weights are in the file, a
// larger unit means a larger file than the fuzzer makes), and the stored tokenizer.
// The HDF5 library is not instrumented (a system library): coverage is of our code, and a crash
// inside libhdf5 shows as a crash all the same. LeakSanitizer ignores libhdf5's own allocations
// (tests/fuzz/lsan.supp: the library leaks on some corrupt files); a handle of ours left open is
// caught here instead: no HDF5 object may stay open once the reader is gone.
#include <hdf5.h>
#include <unistd.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "io/hdf5_ckpt.h"
#include "io/tokenizer_hdf5.h"
#include "model/layout.h"
#include "tests/fuzz/fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = (std::filesystem::temp_directory_path() /
                                   ("rlhf_fuzz_hdf5_ckpt_" + std::to_string(::getpid()) + ".h5"))
                                      .string();
  {
    std::FILE* f = std::fopen(path.c_str(), "wb");
    if (f == nullptr) std::abort();
    if (size > 0 && std::fwrite(data, 1, size, f) != size) std::abort();
    std::fclose(f);
  }
  rlhf::fuzz::expect_only_rlhf_errors([&] {
    const rlhf::io::CheckpointReader r(path);
    rlhf::fuzz::expect_only_rlhf_errors([&] {
      (void)r.read_attrs("/");
      for (const std::string& g : r.list_groups("/")) {
        (void)r.read_attrs("/" + g);
        for (const std::string& d : r.list_datasets("/" + g)) (void)r.shape("/" + g + "/" + d);
      }
    });
    rlhf::fuzz::expect_only_rlhf_errors([&] {
      auto tok = rlhf::io::read_tokenizer_hdf5(r);
      if (tok) tok->decode(tok->encode("Once upon a time <s> 🙂", true, true), false);
    });
    const rlhf::io::StoredModelConfig s = rlhf::io::read_model_config_hdf5(r);
    const rlhf::model::ParamLayout layout(s.config, s.head);
    std::vector<float> buf;
    for (int u = 0; u < layout.num_units(); ++u) {
      if (layout.unit(u).numel > (int64_t{1} << 22)) continue;
      buf.assign(static_cast<size_t>(layout.unit(u).numel), -1.0f);
      rlhf::io::load_model_unit_hdf5(r, layout, u, buf.data());
    }
  });
  const ssize_t open = H5Fget_obj_count(H5F_OBJ_ALL, H5F_OBJ_ALL);
  if (open != 0) {
    std::fprintf(stderr, "%zd HDF5 objects left open after the input\n", open);
    std::abort();
  }
  return 0;
}
