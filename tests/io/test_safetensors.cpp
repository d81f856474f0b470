// safetensors: write → read round trips (F32 bitwise, BF16/F16 to their rounding), the header
// checks (length, JSON, dtype, shape, offsets, overlap), sharded Hugging Face folders with an
// index, and truncated / bit-flipped copies of the real TinyStories-656K file.
#include "io/safetensors.h"

#include <nlohmann/json.hpp>

#include <cstring>
#include <filesystem>

#include "io/pretrained.h"
#include "tests/io/corrupt_util.h"
#include "tests/io/io_test_util.h"
#include "tests/test_util.h"

using namespace rlhf;
using json = nlohmann::json;

namespace {

// A safetensors blob from a header JSON and data bytes.
std::string make_file(const json& header, const std::string& data) {
  const std::string h = header.dump();
  const uint64_t n = h.size();
  return std::string(reinterpret_cast<const char*>(&n), 8) + h + data;
}

std::string parse_error(const std::string& bytes) {
  return test::error_of(
      [&] { io::parse_safetensors(io::blob_from_string(bytes, "t.safetensors")); });
}

// Parse + read every tensor (what loading a model does).
void load_all(const std::string& bytes) {
  const io::SafetensorsFile f = io::parse_safetensors(io::blob_from_string(bytes, "m.safetensors"));
  std::vector<float> buf;
  for (const auto& [name, e] : f.tensors) {
    buf.resize(size_t(e.numel));
    f.read_f32(name, buf.data());
  }
}

}  // namespace

TEST_CASE("safetensors: write then read, F32 bitwise, BF16/F16 rounded, header padded") {
  test::TempDir dir;
  std::vector<float> a = {1.0f, -2.5f, 3.14159f, 1e-8f, 65504.0f, -0.0f};
  std::vector<float> b(12);
  for (size_t i = 0; i < b.size(); ++i) b[i] = float(i) * 0.1f - 0.3f;
  const std::vector<io::SafetensorsWriteItem> items = {
      {"a", {2, 3}, [&](float* o) { std::copy(a.begin(), a.end(), o); }},
      {"model.layers.0.b", {12}, [&](float* o) { std::copy(b.begin(), b.end(), o); }},
      {"empty", {0, 4}, [](float*) {}}};
  for (io::DType dt : {io::DType::kF32, io::DType::kBF16, io::DType::kF16}) {
    const std::string p = dir.file(std::string("x_") + io::to_string(dt) + ".safetensors");
    io::write_safetensors(p, items, dt, {{"format", "pt"}});
    const std::string bytes = test::slurp(p);
    uint64_t n = 0;
    std::memcpy(&n, bytes.data(), 8);
    CHECK(n % 8 == 0);
    const io::SafetensorsFile f = io::open_safetensors(p);
    CHECK(f.metadata.at("format") == "pt");
    REQUIRE(f.tensors.size() == 3);
    CHECK(f.tensors.at("a").shape == std::vector<int64_t>{2, 3});
    CHECK(f.tensors.at("a").dtype == dt);
    CHECK(f.tensors.at("empty").numel == 0);
    std::vector<float> ra(6), rb(12);
    f.read_f32("a", ra.data());
    f.read_f32("model.layers.0.b", rb.data());
    for (size_t i = 0; i < a.size(); ++i) {
      float want = a[i];
      if (dt == io::DType::kBF16) want = io::bf16_to_float(io::float_to_bf16(a[i]));
      if (dt == io::DType::kF16) want = io::f16_to_float(io::float_to_f16(a[i]));
      CHECK(std::memcmp(&ra[i], &want, 4) == 0);
    }
    if (dt == io::DType::kF32) CHECK(rb == b);
  }
}

TEST_CASE("safetensors: header checks name the file and the tensor") {
  const std::string f32x2(8, '\0');
  CHECK(parse_error("abc").find("truncated or corrupt: header length") != std::string::npos);
  std::string big(8, '\0');
  big[7] = 1;  // 2^56
  RLHF_CHECK_CONTAINS(parse_error(big), "exceeds the 100000000 byte limit");
  std::string claims(8, '\0');
  claims[0] = 100;
  RLHF_CHECK_CONTAINS(parse_error(claims + "{}"), "the header claims 100 bytes");
  RLHF_CHECK_CONTAINS(parse_error(make_file("x", "")), "not a JSON object");
  std::string bad = make_file(json::object(), "");
  bad[8] = '[';
  RLHF_CHECK_CONTAINS(parse_error(bad), "not JSON");
  auto entry = [](const char* dt, json shape, json off) {
    return json{{"t", {{"dtype", dt}, {"shape", shape}, {"data_offsets", off}}}};
  };
  CHECK(
      io::parse_safetensors(io::blob_from_string(make_file(entry("F32", {2}, {0, 8}), f32x2), "ok"))
          .tensors.size() == 1);
  RLHF_CHECK_CONTAINS(parse_error(make_file(entry("I64", {1}, {0, 8}), f32x2)),
                      "tensor 't': dtype I64 is not supported");
  RLHF_CHECK_CONTAINS(parse_error(make_file(entry("F32", {3}, {0, 8}), f32x2)),
                      "8 bytes for 3 F32 elements (expected 12)");
  RLHF_CHECK_CONTAINS(parse_error(make_file(entry("F32", {2}, {0, 16}), f32x2)),
                      "data_offsets [0, 16] outside the 8 data bytes");
  RLHF_CHECK_CONTAINS(parse_error(make_file(entry("F32", {2}, {8, 0}), f32x2)), "outside");
  RLHF_CHECK_CONTAINS(parse_error(make_file(entry("F32", {-2}, {0, 8}), f32x2)), "corrupt shape");
  RLHF_CHECK_CONTAINS(
      parse_error(make_file(entry("F32", {uint64_t(1) << 40, uint64_t(1) << 40}, {0, 8}), f32x2)),
      "element count overflows");
  RLHF_CHECK_CONTAINS(parse_error(make_file(json{{"t", {{"dtype", "F32"}}}}, f32x2)),
                      "corrupt entry (needs dtype, shape, data_offsets)");
  json two = entry("F32", {2}, {0, 8});
  two["u"] = {{"dtype", "F32"}, {"shape", {1}}, {"data_offsets", {4, 8}}};
  RLHF_CHECK_CONTAINS(parse_error(make_file(two, f32x2)), "tensor data ranges overlap");
}

TEST_CASE("safetensors: a sharded Hugging Face folder with an index reads like one file") {
  const std::string root = test::shared_data_dir();
  const std::string src = root + "/tinystories-656k/bf16_upstream";
  if (root.empty() || !std::filesystem::exists(src)) {
    MESSAGE("skipped: ../shared/data not found (set RLHF_SHARED_DATA)");
    return;
  }
  test::TempDir dir;
  const io::PretrainedModel m = io::open_pretrained(src);
  // Split the tensors over two shards, as save_pretrained(max_shard_size=...) does.
  const std::vector<std::string> names = m.tensors->names();
  std::vector<io::SafetensorsWriteItem> shard[2];
  json weight_map = json::object();
  for (size_t i = 0; i < names.size(); ++i) {
    const int s = i < names.size() / 2 ? 0 : 1;
    const std::string file = fmt::format("model-0000{}-of-00002.safetensors", s + 1);
    const auto meta = *m.tensors->find(names[i]);
    shard[s].push_back(
        {names[i], meta.shape, [&m, n = names[i]](float* o) { m.tensors->read(n, o); }});
    weight_map[names[i]] = file;
  }
  const std::string hf = dir.file("sharded");
  std::filesystem::create_directories(hf);
  for (int s = 0; s < 2; ++s)
    io::write_safetensors(fmt::format("{}/model-0000{}-of-00002.safetensors", hf, s + 1), shard[s],
                          io::DType::kBF16, {});
  dir.write("sharded/model.safetensors.index.json", json{{"weight_map", weight_map}}.dump());
  std::filesystem::copy_file(src + "/config.json", hf + "/config.json");
  const io::PretrainedModel sh = io::open_pretrained(hf);
  CHECK(sh.detail == "Hugging Face safetensors (BF16, 2 files)");
  CHECK(sh.tokenizer == nullptr);  // no tokenizer files copied
  std::vector<float> a, b;
  for (const std::string& n : names) {
    const auto meta = *m.tensors->find(n);
    a.resize(size_t(meta.numel()));
    b.resize(size_t(meta.numel()));
    m.tensors->read(n, a.data());
    sh.tensors->read(n, b.data());
    CHECK(a == b);
  }
}

TEST_CASE("safetensors: truncated and bit-flipped copies of the real file are clear errors") {
  const std::string root = test::shared_data_dir();
  const std::string p = root + "/tinystories-656k/bf16_upstream/model.safetensors";
  if (root.empty() || !std::filesystem::exists(p)) {
    MESSAGE("skipped: ../shared/data not found (set RLHF_SHARED_DATA)");
    return;
  }
  const std::string bytes = test::slurp(p);
  load_all(bytes);
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  test::check_truncations(load_all, bytes, 40, {size_t(8 + n), size_t(8 + n) - 1, 8, 9});
  // Flips in the length field and the JSON header; the 8 length bytes and the opening brace must
  // always fail.
  test::check_bit_flips(load_all, bytes, size_t(8 + n), 300, 11, {0, 1, 2, 3, 4, 5, 6, 7, 8});
}
