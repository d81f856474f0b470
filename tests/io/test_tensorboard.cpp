// TensorBoard event files: CRC-32C against the published vectors, the TFRecord framing, and the
// Event protobufs read back by an independent decoder. (scripts/check_tensorboard.py reads the
// files with TensorBoard's own EventAccumulator where it is installed.)
#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "io/tensorboard.h"

namespace rlhf::io {

namespace {

/// A minimal protobuf reader: field number → raw values (varints as numbers in `ints`,
/// fixed32/64 and length-delimited fields as bytes in `bytes`).
struct Fields {
  std::multimap<uint32_t, uint64_t> ints;
  std::multimap<uint32_t, std::string> bytes;
};

uint64_t read_varint(const std::string& s, size_t& i) {
  uint64_t v = 0;
  for (int shift = 0;; shift += 7) {
    REQUIRE(i < s.size());
    const uint8_t b = uint8_t(s[i++]);
    v |= uint64_t(b & 0x7f) << shift;
    if (!(b & 0x80)) return v;
  }
}

Fields decode(const std::string& s) {
  Fields f;
  size_t i = 0;
  while (i < s.size()) {
    const uint64_t key = read_varint(s, i);
    const uint32_t field = uint32_t(key >> 3), wire = uint32_t(key & 7);
    if (wire == 0) {
      f.ints.emplace(field, read_varint(s, i));
    } else if (wire == 1 || wire == 5) {
      const size_t n = wire == 1 ? 8 : 4;
      REQUIRE(i + n <= s.size());
      f.bytes.emplace(field, s.substr(i, n));
      i += n;
    } else {
      REQUIRE(wire == 2);
      const uint64_t n = read_varint(s, i);
      REQUIRE(i + n <= s.size());
      f.bytes.emplace(field, s.substr(i, n));
      i += n;
    }
  }
  return f;
}

template <class T>
T fixed(const std::string& b) {
  REQUIRE(b.size() == sizeof(T));
  T v;
  std::memcpy(&v, b.data(), sizeof(T));
  return v;
}

/// Splits a TFRecord stream into its records, checking both CRCs of each.
std::vector<std::string> unframe(const std::string& s) {
  std::vector<std::string> out;
  size_t i = 0;
  while (i < s.size()) {
    REQUIRE(i + 12 <= s.size());
    const std::string len = s.substr(i, 8);
    const uint64_t n = fixed<uint64_t>(len);
    CHECK(fixed<uint32_t>(s.substr(i + 8, 4)) == masked_crc32c(len));
    REQUIRE(i + 12 + n + 4 <= s.size());
    const std::string data = s.substr(i + 12, n);
    CHECK(fixed<uint32_t>(s.substr(i + 12 + n, 4)) == masked_crc32c(data));
    out.push_back(data);
    i += 12 + n + 4;
  }
  return out;
}

}  // namespace

TEST_CASE("crc32c: RFC 3720 B.4 vectors and the check value") {
  CHECK(crc32c("123456789") == 0xE3069283u);
  CHECK(crc32c(std::string(32, '\0')) == 0x8A9136AAu);
  CHECK(crc32c(std::string(32, '\xff')) == 0x62A8AB43u);
  std::string asc(32, '\0');
  for (int i = 0; i < 32; ++i) asc[size_t(i)] = char(i);
  CHECK(crc32c(asc) == 0x46DD794Eu);
  std::string desc(32, '\0');
  for (int i = 0; i < 32; ++i) desc[size_t(i)] = char(31 - i);
  CHECK(crc32c(desc) == 0x113FDB5Cu);
  // mask(0) = 0xa282ead8 (TensorFlow's kMaskDelta); mask rotates right by 15 then adds it.
  CHECK(masked_crc32c("") == 0xa282ead8u);
  const uint32_t c = 0xE3069283u;
  CHECK(masked_crc32c("123456789") == uint32_t(((c >> 15) | (c << 17)) + 0xa282ead8u));
}

TEST_CASE("tfrecord_frame: length, its CRC, data, its CRC") {
  const std::string f = tfrecord_frame("abc");
  REQUIRE(f.size() == 8 + 4 + 3 + 4);
  CHECK(fixed<uint64_t>(f.substr(0, 8)) == 3);
  CHECK(f.substr(12, 3) == "abc");
  CHECK(unframe(f) == std::vector<std::string>{"abc"});
}

TEST_CASE("TensorBoardWriter: file version, scalars of a metrics record, text") {
  const auto dir = std::filesystem::temp_directory_path() / "rlhf_test_tensorboard";
  std::filesystem::remove_all(dir);
  std::string path;
  {
    TensorBoardWriter w(dir.string());
    path = w.path();
    w.add_record(nlohmann::json{
        {"step", 3}, {"loss", 0.5}, {"ok", true}, {"name", "x"}, {"eval", {{"accuracy", 0.25}}}});
    w.add_record(nlohmann::json{{"loss", 1.0}});  // no step: ignored
    w.add_text("completions", 3, "| a | b |");
  }
  CHECK(std::filesystem::path(path).filename().string().rfind("events.out.tfevents.", 0) == 0);
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::vector<std::string> events = unframe(ss.str());
  REQUIRE(events.size() == 1 + 3 + 1);  // version, loss, ok, eval/accuracy, text

  const Fields version = decode(events[0]);
  CHECK(version.bytes.find(3)->second == "brain.Event:2");
  CHECK(fixed<double>(version.bytes.find(1)->second) > 1.6e9);  // wall time in seconds

  std::map<std::string, float> scalars;
  for (size_t i = 1; i <= 3; ++i) {
    const Fields e = decode(events[i]);
    CHECK(e.ints.find(2)->second == 3);  // step
    const Fields summary = decode(e.bytes.find(5)->second);
    const Fields value = decode(summary.bytes.find(1)->second);
    scalars[value.bytes.find(1)->second] = fixed<float>(value.bytes.find(2)->second);
  }
  CHECK(scalars ==
        std::map<std::string, float>{{"loss", 0.5f}, {"ok", 1.0f}, {"eval/accuracy", 0.25f}});

  const Fields e = decode(events[4]);
  const Fields value = decode(decode(e.bytes.find(5)->second).bytes.find(1)->second);
  CHECK(value.bytes.find(1)->second == "completions");
  const Fields tensor = decode(value.bytes.find(8)->second);
  CHECK(tensor.ints.find(1)->second == 7);  // DT_STRING
  CHECK(tensor.bytes.find(8)->second == "| a | b |");
  const Fields plugin = decode(decode(value.bytes.find(9)->second).bytes.find(1)->second);
  CHECK(plugin.bytes.find(1)->second == "text");
  std::filesystem::remove_all(dir);
}

}  // namespace rlhf::io
