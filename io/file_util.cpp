#include "io/file_util.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "core/error.h"

namespace rlhf::io {

namespace fs = std::filesystem;

AtomicFile::AtomicFile(std::string path) : path_(std::move(path)), tmp_(path_ + ".tmp") {
  RLHF_CHECK(!path_.empty(), "empty output path");
  const fs::path parent = fs::path(path_).parent_path();
  if (!parent.empty()) {
    std::error_code ec;
    fs::create_directories(parent, ec);
    RLHF_CHECK(!ec, "cannot create directory {}: {}", parent.string(), ec.message());
  }
  f_ = std::fopen(tmp_.c_str(), "wb");
  RLHF_CHECK(f_ != nullptr, "cannot create {}: {}", tmp_, std::strerror(errno));
}

AtomicFile::~AtomicFile() {
  if (f_ != nullptr) {
    std::fclose(f_);
    std::error_code ec;
    fs::remove(tmp_, ec);
  }
}

void AtomicFile::write(const void* data, size_t n) {
  RLHF_CHECK(f_ != nullptr, "{}: write after commit", path_);
  if (n == 0) return;
  RLHF_CHECK(std::fwrite(data, 1, n, f_) == n, "cannot write {}: {}", tmp_, std::strerror(errno));
  written_ += n;
}

void AtomicFile::commit() {
  RLHF_CHECK(f_ != nullptr, "{}: commit twice", path_);
  const bool ok = std::fflush(f_) == 0 && ::fsync(::fileno(f_)) == 0;
  const int err = errno;
  const bool closed = std::fclose(f_) == 0;
  f_ = nullptr;
  if (!ok || !closed) {
    std::error_code ec;
    fs::remove(tmp_, ec);
    RLHF_FAIL("cannot write {}: {}", tmp_, std::strerror(err));
  }
  std::error_code ec;
  fs::rename(tmp_, path_, ec);
  if (ec) {
    fs::remove(tmp_, ec);
    RLHF_FAIL("cannot rename {} to {}: {}", tmp_, path_, ec.message());
  }
}

std::string read_binary_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  RLHF_CHECK(f.good() && !fs::is_directory(path), "cannot open {}: {}", path,
             fs::is_directory(path) ? "is a directory" : std::strerror(errno));
  std::string s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  RLHF_CHECK(!f.bad(), "cannot read {}: {}", path, std::strerror(errno));
  return s;
}

void write_binary_file(const std::string& path, const std::string& bytes) {
  AtomicFile f(path);
  f.write(bytes.data(), bytes.size());
  f.commit();
}

}  // namespace rlhf::io
