// Small file helpers for writers: a file written to "<path>.tmp" and renamed on commit (so a crash
// never leaves a half-written file under the final name), and whole-file reads.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

namespace rlhf::io {

/// A binary output file that becomes visible under `path` only on commit(): data goes to
/// `<path>.tmp` (parent directories are created); commit() flushes, fsyncs and renames it.
/// Destroying it without commit() removes the .tmp. Every method throws rlhf::Error naming the
/// file on an I/O failure (disk full, permissions).
class AtomicFile {
 public:
  explicit AtomicFile(std::string path);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void write(const void* data, size_t n);
  /// Bytes written so far.
  uint64_t tell() const { return written_; }
  void commit();
  const std::string& path() const { return path_; }

 private:
  std::string path_, tmp_;
  std::FILE* f_ = nullptr;
  uint64_t written_ = 0;
};

/// The whole file as bytes; "cannot open <path>: <strerror>" on failure.
std::string read_binary_file(const std::string& path);

/// Writes `bytes` to `path` atomically (AtomicFile).
void write_binary_file(const std::string& path, const std::string& bytes);

}  // namespace rlhf::io
