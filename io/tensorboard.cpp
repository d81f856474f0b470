#include "io/tensorboard.h"

#include <fmt/format.h>
#include <unistd.h>
#include <nlohmann/json.hpp>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>

#include "core/error.h"

namespace rlhf::io {

namespace {

/// The byte-at-a-time table of the reflected Castagnoli polynomial.
constexpr std::array<uint32_t, 256> make_crc32c_table() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1u) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    t[i] = c;
  }
  return t;
}
constexpr std::array<uint32_t, 256> kCrc32cTable = make_crc32c_table();

// Protocol-buffer wire format (https://protobuf.dev/programming-guides/encoding/).
enum Wire : uint32_t { kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5 };

void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(char(uint8_t(v) | 0x80));
    v >>= 7;
  }
  out.push_back(char(v));
}
void put_tag(std::string& out, uint32_t field, Wire wire) {
  put_varint(out, (uint64_t(field) << 3) | wire);
}
template <class T>
void put_fixed(std::string& out, T v) {  // little endian, as every supported host is
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));
  out.append(b, sizeof(T));
}
void put_bytes(std::string& out, uint32_t field, std::string_view bytes) {
  put_tag(out, field, kLengthDelimited);
  put_varint(out, bytes.size());
  out.append(bytes);
}

/// Event{wall_time = 1, step = 2, summary = 5} around one encoded Summary.Value.
std::string event_with_value(double wall_time, int64_t step, const std::string& value) {
  std::string summary;
  put_bytes(summary, 1, value);  // Summary.value (repeated)
  std::string e;
  put_tag(e, 1, kFixed64);
  put_fixed(e, wall_time);
  put_tag(e, 2, kVarint);
  put_varint(e, uint64_t(step));
  put_bytes(e, 5, summary);
  return e;
}

double now_seconds() {
  using namespace std::chrono;
  return duration<double>(system_clock::now().time_since_epoch()).count();
}

}  // namespace

uint32_t crc32c(std::string_view data) {
  uint32_t c = 0xFFFFFFFFu;
  for (unsigned char b : data) c = kCrc32cTable[(c ^ b) & 0xFFu] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

uint32_t masked_crc32c(std::string_view data) {
  const uint32_t c = crc32c(data);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

std::string tfrecord_frame(std::string_view data) {
  std::string len;
  put_fixed(len, uint64_t(data.size()));
  std::string out = len;
  put_fixed(out, masked_crc32c(len));
  out.append(data);
  put_fixed(out, masked_crc32c(data));
  return out;
}

std::string scalar_event(double wall_time, int64_t step, std::string_view tag, float value) {
  std::string v;
  put_bytes(v, 1, tag);     // Summary.Value.tag
  put_tag(v, 2, kFixed32);  // Summary.Value.simple_value
  put_fixed(v, value);
  return event_with_value(wall_time, step, v);
}

std::string text_event(double wall_time, int64_t step, std::string_view tag,
                       std::string_view text) {
  std::string plugin;
  put_bytes(plugin, 1, "text");  // PluginData.plugin_name
  std::string metadata;
  put_bytes(metadata, 1, plugin);  // SummaryMetadata.plugin_data
  std::string tensor;
  put_tag(tensor, 1, kVarint);  // TensorProto.dtype = DT_STRING
  put_varint(tensor, 7);
  put_bytes(tensor, 2, "");    // TensorProto.tensor_shape: a scalar (no dims)
  put_bytes(tensor, 8, text);  // TensorProto.string_val
  std::string v;
  put_bytes(v, 1, tag);       // Summary.Value.tag
  put_bytes(v, 8, tensor);    // Summary.Value.tensor
  put_bytes(v, 9, metadata);  // Summary.Value.metadata
  return event_with_value(wall_time, step, v);
}

std::string file_version_event(double wall_time) {
  std::string e;
  put_tag(e, 1, kFixed64);
  put_fixed(e, wall_time);
  put_bytes(e, 3, "brain.Event:2");  // Event.file_version
  return e;
}

TensorBoardWriter::TensorBoardWriter(const std::string& dir) {
  RLHF_CHECK(!dir.empty(), "--use_tensorboard: empty directory");
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  RLHF_CHECK(!ec, "cannot create directory {}: {}", dir, ec.message());
  char host[256] = "localhost";
  gethostname(host, sizeof(host) - 1);
  const double t = now_seconds();
  path_ = (std::filesystem::path(dir) /
           fmt::format("events.out.tfevents.{}.{}.{}.rlhf", int64_t(t), host, ::getpid()))
              .string();
  file_ = std::fopen(path_.c_str(), "wb");
  RLHF_CHECK(file_ != nullptr, "cannot open {}: {}", path_, std::strerror(errno));
  append(file_version_event(t));
}

TensorBoardWriter::~TensorBoardWriter() {
  if (file_) std::fclose(file_);
}

void TensorBoardWriter::append(const std::string& event) {
  const std::string rec = tfrecord_frame(event);
  errno = 0;
  const bool ok =
      std::fwrite(rec.data(), 1, rec.size(), file_) == rec.size() && std::fflush(file_) == 0;
  RLHF_CHECK(ok, "cannot write {}: {}", path_, std::strerror(errno));
}

void TensorBoardWriter::add_scalar(std::string_view tag, int64_t step, double value) {
  append(scalar_event(now_seconds(), step, tag, float(value)));
}

void TensorBoardWriter::add_text(std::string_view tag, int64_t step, std::string_view text) {
  append(text_event(now_seconds(), step, tag, text));
}

void TensorBoardWriter::add_record(const nlohmann::json& record) {
  if (!record.is_object()) return;
  const auto s = record.find("step");
  if (s == record.end() || !s->is_number_integer()) return;
  const int64_t step = s->get<int64_t>();
  auto visit = [&](auto&& self, const nlohmann::json& obj, const std::string& prefix) -> void {
    for (auto it = obj.begin(); it != obj.end(); ++it) {
      const std::string tag = prefix + it.key();
      if (prefix.empty() && it.key() == "step") continue;
      if (it->is_object())
        self(self, *it, tag + "/");
      else if (it->is_boolean())
        add_scalar(tag, step, it->get<bool>() ? 1.0 : 0.0);
      else if (it->is_number())
        add_scalar(tag, step, it->get<double>());
    }
  };
  visit(visit, record, "");
}

}  // namespace rlhf::io
