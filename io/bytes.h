// Bounded access to untrusted binary files: a read-only memory map (or an in-memory copy) and a
// cursor that checks every read against the end of the data, so a truncated or corrupt file is an
// rlhf::Error naming the file and the field, never an out-of-bounds read or a huge allocation.
// Used by every model/tokenizer parser in io/ (safetensors, llama2.c, GGUF, tokenizer.bin).
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>

#include "core/error.h"

namespace rlhf::io {

static_assert(std::endian::native == std::endian::little,
              "the binary readers assume a little-endian host (x86-64, aarch64)");

/// Immutable bytes with a name for messages ("<file>" or "<file>:<what>"). `owner` keeps the
/// storage (a mapping or a string) alive; copies share it.
struct Blob {
  std::shared_ptr<const void> owner;
  const uint8_t* data = nullptr;
  size_t size = 0;
  std::string source;  ///< file name (or a description) used in every error message

  std::string_view view() const { return {reinterpret_cast<const char*>(data), size}; }
};

/// Maps `path` read-only (MAP_PRIVATE). Throws rlhf::Error "cannot open <path>: <strerror>" when
/// the file is missing/unreadable, and for a directory. An empty file gives an empty Blob.
Blob map_file(const std::string& path);

/// A Blob holding a copy of `bytes` (tests, fuzzers, tokenizers restored from a checkpoint).
Blob blob_from_string(std::string bytes, std::string source);

/// Checked a*b and a+b for sizes computed from untrusted headers: throw rlhf::Error ("<source>:
/// <what> overflows") instead of wrapping.
int64_t checked_mul(int64_t a, int64_t b, const std::string& source, const char* what);
int64_t checked_add(int64_t a, int64_t b, const std::string& source, const char* what);

/// A cursor over [data, data + size). Every read checks the remaining size first and throws
/// rlhf::Error "<source>: truncated or corrupt: <what> at byte <pos> needs <n> bytes, only <m>
/// remain" otherwise. Values are little-endian.
class ByteReader {
 public:
  explicit ByteReader(const Blob& blob) : ByteReader(blob.data, blob.size, blob.source) {}
  ByteReader(const uint8_t* data, size_t size, std::string source)
      : data_(data), size_(size), source_(std::move(source)) {}

  /// Reads a trivially copyable T (uint32_t, float, ...).
  template <typename T>
  T read(const char* what) {
    static_assert(std::is_trivially_copyable_v<T>);
    T v;
    std::memcpy(&v, take(sizeof(T), what), sizeof(T));
    return v;
  }
  /// Pointer to the next n bytes, and advances past them.
  const uint8_t* take(uint64_t n, const char* what);
  /// n bytes as a string.
  std::string read_string(uint64_t n, const char* what) {
    const uint8_t* p = take(n, what);
    return std::string(reinterpret_cast<const char*>(p), static_cast<size_t>(n));
  }
  void skip(uint64_t n, const char* what) { take(n, what); }
  /// Moves to absolute offset `pos` (<= size).
  void seek(uint64_t pos, const char* what);

  size_t pos() const { return pos_; }
  size_t size() const { return size_; }
  size_t remaining() const { return size_ - pos_; }
  bool at_end() const { return pos_ == size_; }
  const std::string& source() const { return source_; }
  const uint8_t* data() const { return data_; }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
  std::string source_;
};

}  // namespace rlhf::io
