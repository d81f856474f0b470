// HDF5 checkpoints: bitwise save → load round trips (whole model and unit by unit), the generic
// writer/reader, shape / missing-dataset errors, atomic commit, and truncated / garbage / corrupt
// files (every one must raise rlhf::Error, never crash or return different numbers).
#include "io/hdf5_ckpt.h"

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <random>

#include "tests/io/io_test_util.h"
#include "tests/test_util.h"

using namespace rlhf;
namespace fs = std::filesystem;

namespace {

model::ModelConfig small_config() {
  model::ModelConfig c;
  c.hidden_size = 16;
  c.intermediate_size = 24;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.vocab_size = 37;
  c.max_position_embeddings = 64;
  c.rms_norm_eps = 1e-6;
  c.rope_theta = 12345.5;
  c.tie_word_embeddings = false;
  c.rope_style = model::RopeStyle::kInterleaved;
  c.bos_token_id = 1;
  c.eos_token_id = 2;
  c.pad_token_id = 0;
  return c;
}

// Unit buffers of numel + `extra` elements (a caller's buffer may be longer than the unit, e.g.
// padded for ZeRO-3) with random tensors and a sentinel in every gap and past the unit.
struct Model {
  std::vector<std::vector<float>> units;
  Model(const model::ParamLayout& layout, uint64_t seed, float fill = 777.0f, int64_t extra = 0) {
    for (int u = 0; u < layout.num_units(); ++u) {
      const auto& ul = layout.unit(u);
      std::vector<float> buf(static_cast<size_t>(ul.numel + extra), fill);
      for (const auto& t : ul.tensors) {
        auto r = test::random_vec<float>(t.numel, seed * 1000 + static_cast<uint64_t>(t.offset));
        std::copy(r.begin(), r.end(), buf.begin() + t.offset);
      }
      units.push_back(std::move(buf));
    }
  }
  std::vector<const float*> cptrs() const {
    std::vector<const float*> p;
    for (const auto& u : units) p.push_back(u.data());
    return p;
  }
  std::vector<float*> ptrs() {
    std::vector<float*> p;
    for (auto& u : units) p.push_back(u.data());
    return p;
  }
};

// Tensor elements equal bit for bit; every gap of `loaded` is +0.0, and elements past the unit
// still hold `tail` (loaders write [0, numel) only).
void check_unit_equal(const model::UnitLayout& ul, const std::vector<float>& saved,
                      const std::vector<float>& loaded, float tail) {
  REQUIRE(loaded.size() == saved.size());
  std::vector<char> is_tensor(saved.size(), 0);
  for (const auto& t : ul.tensors) {
    INFO(t.name);
    CHECK(std::memcmp(saved.data() + t.offset, loaded.data() + t.offset,
                      static_cast<size_t>(t.numel) * sizeof(float)) == 0);
    std::fill(is_tensor.begin() + t.offset, is_tensor.begin() + t.offset + t.numel, 1);
  }
  int64_t bad_pad = 0;
  for (size_t i = 0; i < loaded.size(); ++i) {
    uint32_t bits;
    std::memcpy(&bits, &loaded[i], 4);
    if (int64_t(i) >= ul.numel)
      bad_pad += loaded[i] != tail;
    else if (!is_tensor[i] && bits != 0)
      ++bad_pad;
  }
  INFO(ul.name);
  CHECK(bad_pad == 0);
}

void round_trip(const model::ModelConfig& cfg, model::HeadKind head, int64_t extra_elems) {
  const model::ParamLayout layout(cfg, head);
  test::TempDir dir;
  const std::string path = dir.file("sub/ckpt.h5");
  const Model saved(layout, 3, 777.0f, extra_elems);
  const nlohmann::json extra = {
      {"step", 12}, {"note", "hello"}, {"lr", 1e-3}, {"flag", true}, {"list", {1, 2}}};
  io::save_model_hdf5(path, layout, saved.cptrs(), extra);
  CHECK(fs::exists(path));
  CHECK_FALSE(fs::exists(path + ".tmp"));

  // Whole model.
  Model loaded(layout, 99, 12345.0f, extra_elems);
  io::load_model_hdf5(path, layout, loaded.ptrs());
  for (int u = 0; u < layout.num_units(); ++u)
    check_unit_equal(layout.unit(u), saved.units[u], loaded.units[u], 12345.0f);

  // Unit by unit, in reverse order, from one reader.
  io::CheckpointReader reader(path);
  for (int u = layout.num_units() - 1; u >= 0; --u) {
    std::vector<float> buf(static_cast<size_t>(layout.unit(u).numel + extra_elems), -5.0f);
    io::load_model_unit_hdf5(reader, layout, u, buf.data());
    check_unit_equal(layout.unit(u), saved.units[u], buf, -5.0f);
  }

  // Config and head.
  const io::StoredModelConfig stored = io::load_model_config_hdf5(path);
  CHECK(stored.config.to_json() == cfg.to_json());
  CHECK(stored.head == head);

  // What an h5py user sees.
  CHECK(reader.read_string_attr("/", "format") == "rlhf-checkpoint");
  CHECK(reader.read_int_attr("/", "format_version") == 1);
  CHECK(reader.read_int_attr("/", "step") == 12);
  CHECK(reader.read_string_attr("/", "note") == "hello");
  CHECK(reader.read_float_attr("/", "lr") == 1e-3);
  CHECK(reader.read_int_attr("/", "flag") == 1);
  CHECK(reader.read_string_attr("/", "list") == "[1,2]");
  CHECK(reader.read_string_attr("/model", "head") == model::to_string(head));
  CHECK(nlohmann::json::parse(reader.read_string_attr("/model", "config")) == cfg.to_json());
  CHECK(reader.read_int_attr("/model", "hidden_size") == cfg.hidden_size);
  CHECK(reader.read_float_attr("/model", "rope_theta") == cfg.rope_theta);
  CHECK(reader.read_float_attr("/model", "rms_norm_eps") == cfg.rms_norm_eps);
  CHECK(reader.read_string_attr("/model", "rope_style") == model::to_string(cfg.rope_style));
  CHECK(reader.read_int_attr("/model", "tie_word_embeddings") == (cfg.tie_word_embeddings ? 1 : 0));
  std::vector<std::string> names;
  for (const auto& u : layout.units())
    for (const auto& t : u.tensors) {
      names.push_back(t.name);
      CHECK(reader.shape("/model/" + t.name) == t.shape);
    }
  std::sort(names.begin(), names.end());
  CHECK(reader.list_datasets("/model") == names);
  CHECK(reader.list_groups("/").size() == 1);
}

std::string save_small(const test::TempDir& dir, const std::string& name,
                       const model::ParamLayout& layout, uint64_t seed = 3) {
  const std::string path = dir.file(name);
  const Model m(layout, seed);
  io::save_model_hdf5(path, layout, m.cptrs(), nullptr);
  return path;
}

}  // namespace

TEST_CASE("hdf5 model round trip is bitwise, whole and per unit") {
  SUBCASE("untied LM head, buffers longer than the units") {
    round_trip(small_config(), model::HeadKind::kLM, 100);
  }
  SUBCASE("tied LM head, qwen2 biases") {
    auto c = small_config();
    c.tie_word_embeddings = true;
    c.model_type = "qwen2";
    round_trip(c, model::HeadKind::kLM, 0);
  }
  SUBCASE("reward head, attention_bias, explicit head_dim") {
    auto c = small_config();
    c.attention_bias = true;
    c.head_dim = 6;
    round_trip(c, model::HeadKind::kReward, 7);
  }
  SUBCASE("value head") {
    round_trip(small_config(), model::HeadKind::kValue, 0);
  }
}

TEST_CASE("hdf5 model load: shape mismatch, missing dataset, config and head mismatch") {
  test::TempDir dir;
  const model::ParamLayout layout(small_config(), model::HeadKind::kLM);
  const std::string path = save_small(dir, "m.h5", layout);
  io::CheckpointReader reader(path);

  // A reader-level mismatch names the file, dataset, expected and actual shape.
  std::vector<float> buf(16 * 24);
  std::string msg = test::error_of([&] {
    reader.read_dataset<float>("/model/model.layers.0.mlp.gate_proj.weight", buf.data(), {16, 24});
  });
  RLHF_CHECK_CONTAINS(msg, path);
  RLHF_CHECK_CONTAINS(msg, "/model/model.layers.0.mlp.gate_proj.weight");
  RLHF_CHECK_CONTAINS(msg, "has shape [24, 16], expected [16, 24]");

  // Loading a layer unit of a model with another intermediate size: the first tensor that differs.
  auto other = small_config();
  other.intermediate_size = 32;
  const model::ParamLayout other_layout(other, model::HeadKind::kLM);
  std::vector<float> unit(static_cast<size_t>(other_layout.unit(1).numel));
  msg = test::error_of([&] { io::load_model_unit_hdf5(reader, other_layout, 1, unit.data()); });
  RLHF_CHECK_CONTAINS(msg,
                      "model.layers.0.mlp.gate_proj.weight has shape [24, 16], expected [32, 16]");

  // Whole-model load compares configs first and lists the differing fields.
  Model m(other_layout, 1);
  msg = test::error_of([&] { io::load_model_hdf5(path, other_layout, m.ptrs()); });
  RLHF_CHECK_CONTAINS(msg, "intermediate_size = 24 (model: 32)");

  // Missing dataset: an untied layout reading a tied checkpoint.
  auto tied = small_config();
  tied.tie_word_embeddings = true;
  const model::ParamLayout tied_layout(tied, model::HeadKind::kLM);
  const std::string tied_path = save_small(dir, "tied.h5", tied_layout);
  io::CheckpointReader tied_reader(tied_path);
  std::vector<float> head(static_cast<size_t>(layout.unit(layout.head_unit()).numel));
  msg = test::error_of(
      [&] { io::load_model_unit_hdf5(tied_reader, layout, layout.head_unit(), head.data()); });
  RLHF_CHECK_CONTAINS(msg, tied_path);
  RLHF_CHECK_CONTAINS(msg, "dataset /model/lm_head.weight not found");
  msg = test::error_of([&] { reader.read_dataset<float>("model/nope.weight", buf.data(), {1}); });
  RLHF_CHECK_CONTAINS(msg, "dataset /model/nope.weight not found");

  // Head mismatch: a reward layout on an LM checkpoint (same config) is refused as a whole ...
  const model::ParamLayout reward(small_config(), model::HeadKind::kReward);
  Model r(reward, 2);
  msg = test::error_of([&] { io::load_model_hdf5(path, reward, r.ptrs()); });
  RLHF_CHECK_CONTAINS(msg, "the checkpoint has a 'lm' head");
  // ... but its shared units load one by one (starting a reward model from an SFT checkpoint).
  const Model saved(layout, 3);
  for (int u = 0; u < reward.head_unit(); ++u) {
    io::load_model_unit_hdf5(reader, reward, u, r.units[u].data());
    check_unit_equal(reward.unit(u), saved.units[u], r.units[u], 0.0f);
  }

  // Wrong number of unit buffers.
  msg = test::error_of([&] { io::load_model_hdf5(path, layout, {}); });
  RLHF_CHECK_CONTAINS(msg, "0 unit buffers for 4 units");
}

TEST_CASE("hdf5 generic writer and reader: types, groups, attributes") {
  test::TempDir dir;
  const std::string path = dir.file("generic.h5");
  const auto d = test::random_vec<double>(6, 1);
  const std::vector<int64_t> i64 = {-3, std::numeric_limits<int64_t>::max(), 0};
  const std::vector<uint64_t> u64 = {std::numeric_limits<uint64_t>::max(), 1};
  const std::vector<int32_t> i32 = {7, -8};
  const std::vector<uint8_t> u8 = {0, 255, 128};
  const float scalar = 2.5f;
  // A multi-chunk float dataset (chunks of 2^20 elements).
  const auto big = test::random_vec<float>(3 * 700001, 5);
  {
    io::CheckpointWriter w(path);
    CHECK(w.tmp_path() == path + ".tmp");
    w.write_dataset<double>("/optimizer/unit.0/m", d.data(), {2, 3});
    w.write_dataset<int64_t>("trainer/data_position", i64.data(), {3});
    w.write_dataset<uint64_t>("/trainer/rng/state", u64.data(), {2});
    w.write_dataset<int32_t>("/trainer/i32", i32.data(), {2});
    w.write_dataset<uint8_t>("/trainer/bytes", u8.data(), {3});
    w.write_dataset<float>("/trainer/scalar", &scalar, {});
    w.write_dataset<float>("/trainer/empty", nullptr, {0, 5});
    w.write_dataset<float>("/big", big.data(), {3, 700001});
    w.create_group("/optimizer/unit.1");
    w.create_group("/optimizer/unit.1");  // idempotent
    w.write_int_attr("/trainer", "step", 41);
    w.write_int_attr("/trainer", "step", 42);  // replaced
    w.write_float_attr("/optimizer/unit.0/m", "beta1", 0.9);
    w.write_string_attr("/new/group", "empty", "");
    w.write_string_attr("/", "utf8", "héllo ✓");
    RLHF_CHECK_CONTAINS(
        test::error_of([&] { w.write_dataset<double>("/optimizer/unit.0/m", d.data(), {6}); }),
        "written twice");
    RLHF_CHECK_CONTAINS(test::error_of([&] { w.create_group("/big"); }),
                        "a dataset of that name exists");
    RLHF_CHECK_CONTAINS(test::error_of([&] { w.write_dataset<float>("/a//b", &scalar, {}); }),
                        "invalid HDF5 object path");
    w.commit();
    CHECK(w.committed());
    RLHF_CHECK_CONTAINS(test::error_of([&] { w.write_int_attr("/", "x", 1); }), "after commit()");
    RLHF_CHECK_CONTAINS(test::error_of([&] { w.commit(); }), "after commit()");
  }
  io::CheckpointReader r(path);
  std::vector<int64_t> shape;
  CHECK(r.read_dataset_vector<double>("/optimizer/unit.0/m", &shape) == d);
  CHECK(shape == std::vector<int64_t>{2, 3});
  CHECK(r.read_dataset_vector<int64_t>("/trainer/data_position") == i64);
  CHECK(r.read_dataset_vector<uint64_t>("/trainer/rng/state") == u64);
  CHECK(r.read_dataset_vector<int32_t>("/trainer/i32") == i32);
  CHECK(r.read_dataset_vector<uint8_t>("/trainer/bytes") == u8);
  CHECK(r.read_dataset_vector<float>("/trainer/scalar", &shape) == std::vector<float>{2.5f});
  CHECK(shape.empty());
  CHECK(r.read_dataset_vector<float>("/trainer/empty", &shape).empty());
  CHECK(shape == std::vector<int64_t>{0, 5});
  const auto big_back = r.read_dataset_vector<float>("/big");
  CHECK(std::memcmp(big_back.data(), big.data(), big.size() * sizeof(float)) == 0);
  // Lossless widening is allowed, narrowing is not.
  CHECK(r.read_dataset_vector<int64_t>("/trainer/i32") == std::vector<int64_t>{7, -8});
  CHECK(r.read_dataset_vector<int32_t>("/trainer/bytes") == std::vector<int32_t>{0, 255, 128});
  RLHF_CHECK_CONTAINS(test::error_of([&] { r.read_dataset_vector<float>("/optimizer/unit.0/m"); }),
                      "holds float64, which does not convert to float32 exactly");
  RLHF_CHECK_CONTAINS(
      test::error_of([&] { r.read_dataset_vector<int32_t>("/trainer/data_position"); }),
      "holds int64");
  RLHF_CHECK_CONTAINS(test::error_of([&] { r.read_dataset_vector<int64_t>("/trainer/rng/state"); }),
                      "holds uint64");
  CHECK(r.list_groups("/") == std::vector<std::string>{"new", "optimizer", "trainer"});
  CHECK(r.list_datasets("/") == std::vector<std::string>{"big"});
  CHECK(r.list_groups("/optimizer") == std::vector<std::string>{"unit.0", "unit.1"});
  CHECK(r.list_datasets("/trainer") ==
        std::vector<std::string>{"bytes", "data_position", "empty", "i32", "scalar"});
  CHECK(r.exists("/optimizer/unit.0/m"));
  CHECK(r.exists("/"));
  CHECK_FALSE(r.exists("/optimizer/unit.7"));
  CHECK_FALSE(r.exists("/nothing/at/all"));
  CHECK(r.read_int_attr("/trainer", "step") == 42);
  CHECK(r.read_float_attr("/trainer", "step") == 42.0);
  CHECK(r.read_float_attr("/optimizer/unit.0/m", "beta1") == 0.9);
  CHECK(r.read_string_attr("/new/group", "empty").empty());
  CHECK(r.read_string_attr("/", "utf8") == "héllo ✓");
  CHECK(r.has_attr("/trainer", "step"));
  CHECK_FALSE(r.has_attr("/trainer", "nope"));
  CHECK_FALSE(r.has_attr("/nope", "step"));
  CHECK(r.attr_names("/") == std::vector<std::string>{"format", "format_version", "utf8"});
  const nlohmann::json attrs = r.read_attrs("/");
  CHECK(attrs ==
        nlohmann::json{{"format", "rlhf-checkpoint"}, {"format_version", 1}, {"utf8", "héllo ✓"}});
  RLHF_CHECK_CONTAINS(test::error_of([&] { r.read_string_attr("/trainer", "step"); }),
                      "attribute 'step' on /trainer is int64, not a string");
  RLHF_CHECK_CONTAINS(test::error_of([&] { r.read_int_attr("/trainer", "missing"); }),
                      "attribute 'missing' not found on /trainer");
  RLHF_CHECK_CONTAINS(test::error_of([&] { r.list_datasets("/big"); }), "/big is not a group");
  RLHF_CHECK_CONTAINS(test::error_of([&] { r.list_datasets("/none"); }), "group /none not found");
  RLHF_CHECK_CONTAINS(test::error_of([&] { r.shape("/trainer"); }), "/trainer is not a dataset");
}

TEST_CASE("hdf5 commit is atomic: .tmp until commit, target untouched without it") {
  test::TempDir dir;
  const model::ParamLayout layout(small_config(), model::HeadKind::kLM);
  const std::string path = dir.file("ckpt.h5");
  const std::string tmp = path + ".tmp";
  const Model m(layout, 7);

  SUBCASE("no previous file, destroyed without commit: nothing is left") {
    {
      io::CheckpointWriter w(path);
      io::write_model_hdf5(w, layout, m.cptrs());
      CHECK(fs::exists(tmp));
      CHECK_FALSE(fs::exists(path));
    }
    CHECK_FALSE(fs::exists(tmp));
    CHECK_FALSE(fs::exists(path));
  }
  SUBCASE("previous checkpoint survives an uncommitted writer, and is replaced by a commit") {
    io::save_model_hdf5(path, layout, m.cptrs(), {{"step", 1}});
    const std::string before = test::slurp(path);
    {
      io::CheckpointWriter w(path);
      io::write_model_hdf5(w, layout, Model(layout, 8).cptrs());
      w.write_int_attr("/", "step", 2);
      CHECK(test::slurp(path) == before);
    }
    CHECK(test::slurp(path) == before);
    CHECK_FALSE(fs::exists(tmp));
    CHECK(io::CheckpointReader(path).read_int_attr("/", "step") == 1);
    {
      io::CheckpointWriter w(path);
      io::write_model_hdf5(w, layout, Model(layout, 8).cptrs());
      w.write_int_attr("/", "step", 2);
      CHECK(test::slurp(path) == before);  // not yet
      w.commit();
      CHECK_FALSE(fs::exists(tmp));
    }
    CHECK(io::CheckpointReader(path).read_int_attr("/", "step") == 2);
    CHECK_FALSE(fs::exists(tmp));
  }
  SUBCASE("a failing write leaves the target untouched") {
    io::save_model_hdf5(path, layout, m.cptrs(), nullptr);
    const std::string before = test::slurp(path);
    std::vector<const float*> ptrs = m.cptrs();
    ptrs[1] = nullptr;
    CHECK_THROWS_AS(io::save_model_hdf5(path, layout, ptrs, nullptr), Error);
    CHECK(test::slurp(path) == before);
    CHECK_FALSE(fs::exists(tmp));
  }
  SUBCASE("reserved and malformed extra attributes") {
    RLHF_CHECK_CONTAINS(test::error_of([&] {
                          io::save_model_hdf5(path, layout, m.cptrs(), {{"format", "x"}});
                        }),
                        "reserved");
    RLHF_CHECK_CONTAINS(test::error_of([&] {
                          io::save_model_hdf5(path, layout, m.cptrs(), {1, 2});
                        }),
                        "must be a JSON object");
    CHECK_FALSE(fs::exists(path));
    CHECK_FALSE(fs::exists(tmp));
  }
}

TEST_CASE("hdf5 truncated, garbage and foreign files give rlhf::Error") {
  test::TempDir dir;
  const model::ParamLayout layout(small_config(), model::HeadKind::kLM);
  const std::string good = save_small(dir, "good.h5", layout);
  const std::string bytes = test::slurp(good);
  Model out(layout, 1);

  for (double frac : {0.0, 0.001, 0.1, 0.5, 0.9, 0.999}) {
    const size_t n = static_cast<size_t>(frac * static_cast<double>(bytes.size()));
    const std::string p = dir.write("trunc.h5", bytes.substr(0, n));
    INFO("truncated to " << n << " of " << bytes.size() << " bytes");
    const std::string msg = test::error_of([&] { io::load_model_hdf5(p, layout, out.ptrs()); });
    RLHF_CHECK_CONTAINS(msg, p);
    CHECK_THROWS_AS(io::load_model_config_hdf5(p), Error);
  }
  {
    const std::string p = dir.write("trunc.h5", bytes.substr(0, bytes.size() / 2));
    RLHF_CHECK_CONTAINS(test::error_of([&] { io::load_model_hdf5(p, layout, out.ptrs()); }),
                        "truncated");
  }
  std::mt19937 rng(11);
  std::string garbage(4096, '\0');
  for (char& c : garbage) c = static_cast<char>(rng());
  const std::string g = dir.write("garbage.h5", garbage);
  std::string msg = test::error_of([&] { io::load_model_hdf5(g, layout, out.ptrs()); });
  RLHF_CHECK_CONTAINS(msg, "cannot open checkpoint");
  RLHF_CHECK_CONTAINS(msg, "hint:");
  CHECK_THROWS_AS(io::CheckpointReader(dir.write("text.h5", "just some text\n")), Error);
  RLHF_CHECK_CONTAINS(test::error_of([&] { io::CheckpointReader r(dir.file("missing.h5")); }),
                      "no such file");
  RLHF_CHECK_CONTAINS(test::error_of([&] { io::CheckpointReader r(dir.path().string()); }),
                      "is a directory");
  // A valid HDF5 file that is not a checkpoint: no format attribute.
  {
    io::CheckpointWriter w(dir.file("foreign.h5"));
    w.commit();
  }
  // (rewrite its root attributes away by writing a file whose format differs)
  {
    io::CheckpointWriter w(dir.file("other.h5"));
    w.write_string_attr("/", "format", "something-else");
    w.commit();
  }
  RLHF_CHECK_CONTAINS(test::error_of([&] { io::load_model_config_hdf5(dir.file("other.h5")); }),
                      "format 'something-else' is not 'rlhf-checkpoint'");
  RLHF_CHECK_CONTAINS(test::error_of([&] { io::load_model_config_hdf5(dir.file("foreign.h5")); }),
                      "no /model group");
}

TEST_CASE("hdf5 corrupt bytes: every flip raises rlhf::Error or changes nothing") {
  // Flip one byte at a time over the whole file (a sample of positions) and load. HDF5 1.10
  // metadata checksums and the Fletcher-32 filter on the data must turn every effective corruption
  // into an error; a flip that is not detected must leave the loaded model bit-identical (bytes in
  // unused space).
  test::TempDir dir;
  auto cfg = small_config();
  cfg.num_hidden_layers = 1;
  const model::ParamLayout layout(cfg, model::HeadKind::kLM);
  const Model saved(layout, 5);
  const std::string good = dir.file("good.h5");
  io::save_model_hdf5(good, layout, saved.cptrs(), {{"step", 3}});
  const std::string bytes = test::slurp(good);
  const size_t n_flips = 400;
  int errors = 0, unchanged = 0;
  for (size_t k = 0; k < n_flips; ++k) {
    const size_t pos = k * bytes.size() / n_flips + (k * 7919) % 13;
    if (pos >= bytes.size()) continue;
    std::string bad = bytes;
    bad[pos] = static_cast<char>(bad[pos] ^ 0x5a);
    const std::string p = dir.write("bad.h5", bad);
    Model out(layout, 9);
    INFO("flipped byte " << pos << " of " << bytes.size());
    try {
      const io::StoredModelConfig sc = io::load_model_config_hdf5(p);
      io::load_model_hdf5(p, layout, out.ptrs());
      CHECK(sc.config.to_json() == cfg.to_json());
      for (int u = 0; u < layout.num_units(); ++u)
        check_unit_equal(layout.unit(u), saved.units[u], out.units[u], 0.0f);
      ++unchanged;
    } catch (const Error&) {
      ++errors;
    }
  }
  MESSAGE("file of " << bytes.size() << " bytes: " << errors << " flips detected, " << unchanged
                     << " without effect");
  CHECK(errors > 0);
}
