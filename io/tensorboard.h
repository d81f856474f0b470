// TensorBoard event files, written natively (--use_tensorboard DIR): a TFRecord stream of `Event`
// protocol buffers (tensorflow/core/util/event.proto, summary.proto), hand-encoded.
//
// TFRecord framing of each record: uint64 length (little endian), uint32 masked CRC-32C of those
// 8 bytes, the data, uint32 masked CRC-32C of the data; mask(c) = ((c >> 15) | (c << 17)) +
// 0xa282ead8. The first event carries file_version "brain.Event:2"; each later one a step, a wall
// time and a Summary with one Value: a scalar (simple_value) or a text (a DT_STRING tensor with
// plugin_data.plugin_name "text", as tensorboard.plugins.text writes it).
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>

namespace rlhf::io {

/// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78, init and final xor 0xFFFFFFFF) of
/// `data`: crc32c("123456789") = 0xE3069283 (RFC 3720, B.4).
uint32_t crc32c(std::string_view data);

/// TFRecord's masked CRC: ((crc >> 15) | (crc << 17)) + 0xa282ead8 (mod 2^32).
uint32_t masked_crc32c(std::string_view data);

/// One TFRecord: length, masked CRC of the length, `data`, masked CRC of the data.
std::string tfrecord_frame(std::string_view data);

/// An Event protobuf with wall_time and step and a Summary of one scalar value: tag `tag`,
/// simple_value `value` (a float32, as TensorBoard stores scalars).
std::string scalar_event(double wall_time, int64_t step, std::string_view tag, float value);

/// An Event protobuf with a Summary of one text value: a scalar DT_STRING tensor holding `text`
/// (Markdown) with plugin "text".
std::string text_event(double wall_time, int64_t step, std::string_view tag, std::string_view text);

/// An Event protobuf with wall_time and file_version "brain.Event:2" (the first of every file).
std::string file_version_event(double wall_time);

/// Appends events to `<dir>/events.out.tfevents.<unix seconds>.<host>.<pid>.rlhf` (a fresh file
/// per writer, as TensorBoard's writers do; it reads every file of the directory). Every add_*
/// writes one framed record and flushes, so a live TensorBoard sees finished steps.
class TensorBoardWriter {
 public:
  /// Creates `dir` (and parents) and the event file with its file_version event.
  /// Throws rlhf::Error "cannot create directory ..." / "cannot open <file>: <strerror>".
  explicit TensorBoardWriter(const std::string& dir);
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  /// One scalar (a non-finite value is written as is; TensorBoard shows NaN/Inf).
  void add_scalar(std::string_view tag, int64_t step, double value);
  /// One text (Markdown) value.
  void add_text(std::string_view tag, int64_t step, std::string_view text);
  /// Every number of a metrics.jsonl record (see MetricsWriter) as a scalar at the record's
  /// integer "step": nested objects give "outer/inner" tags, booleans 0/1; strings, arrays, nulls
  /// and "step" itself are skipped. A record without an integer "step" is ignored.
  void add_record(const nlohmann::json& record);
  /// The event file's path.
  const std::string& path() const { return path_; }

 private:
  void append(const std::string& event);
  std::string path_;
  std::FILE* file_ = nullptr;
};

}  // namespace rlhf::io
