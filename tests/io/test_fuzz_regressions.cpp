// Regression tests for what the libFuzzer harnesses (tests/fuzz/, scripts/fuzz.sh) found.
//
// fuzz_hdf5_ckpt: a checkpoint whose link (or attribute) heap is corrupt crashed inside HDF5 1.10
// when a group was listed in name order: H5Literate(H5_ITER_INC) over dense link storage first
// builds a table of as many links as the file claims, and when loading them fails part way HDF5
// frees the entries it never filled (H5G__link_release_table: a free of garbage). Listing now
// iterates in native order (no table) and sorts the names itself: a clear rlhf::Error.
#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "io/hdf5_ckpt.h"
#include "model/layout.h"
#include "tests/io/io_test_util.h"

using namespace rlhf;

namespace {

// A small model checkpoint: /model holds 20 datasets, more than HDF5 keeps in compact link storage,
// so its links live in a fractal heap ("FHDB" direct blocks), as do /model's many attributes.
std::string write_checkpoint(const test::TempDir& dir) {
  model::ModelConfig c;
  c.hidden_size = 8;
  c.intermediate_size = 16;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 2;
  c.num_key_value_heads = 1;
  c.vocab_size = 32;
  c.max_position_embeddings = 16;
  const model::ParamLayout layout(c, model::HeadKind::kLM);
  std::vector<std::vector<float>> units;
  std::vector<const float*> ptrs;
  for (const auto& u : layout.units()) units.emplace_back(static_cast<size_t>(u.numel), 0.25f);
  for (const auto& u : units) ptrs.push_back(u.data());
  const std::string path = dir.file("model.h5");
  io::save_model_hdf5(path, layout, ptrs, nullptr);
  return path;
}

}  // namespace

TEST_CASE("fuzz regression: a corrupt link heap is an error when a group is listed, not a crash") {
  test::TempDir dir;
  const std::string good = write_checkpoint(dir);
  std::string bytes = test::slurp(good);
  // Flip one byte in the payload of every fractal-heap direct block: their checksums now fail,
  // so loading a link (or attribute) message fails after the iteration has started.
  int blocks = 0;
  for (size_t at = bytes.find("FHDB"); at != std::string::npos; at = bytes.find("FHDB", at + 4)) {
    REQUIRE(at + 40 < bytes.size());
    bytes[at + 40] = static_cast<char>(bytes[at + 40] ^ 0x5a);
    ++blocks;
  }
  REQUIRE_MESSAGE(blocks > 0, "the checkpoint has no dense (fractal heap) storage any more");
  const std::string bad = dir.write("bad.h5", bytes);
  const io::CheckpointReader r(bad);
  int errors = 0;
  for (const char* group : {"/", "/model"}) {
    for (int what = 0; what < 3; ++what) {
      std::string e;  // "" when this listing does not touch a corrupt block
      try {
        if (what == 0) (void)r.list_datasets(group);
        if (what == 1) (void)r.list_groups(group);
        if (what == 2) (void)r.attr_names(group);
        continue;
      } catch (const Error& x) {
        e = x.what();
      }
      ++errors;
      CHECK_MESSAGE(e.find(bad) != std::string::npos, e);
    }
  }
  CHECK(errors > 0);
  CHECK_FALSE(test::error_of([&] { io::read_model_config_hdf5(r); }).empty());
}
