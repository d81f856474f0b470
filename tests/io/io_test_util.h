// Helpers for the io tests: unique temporary directories and error-message capture.
#pragma once

#include <doctest/doctest.h>
#include <fmt/format.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <string>

#include "core/error.h"

namespace rlhf::test {

/// A fresh directory under temp_directory_path() (pid + counter + random suffix), removed with
/// everything in it on destruction.
class TempDir {
 public:
  TempDir() {
    static std::atomic<int> counter{0};
    std::random_device rd;
    path_ = std::filesystem::temp_directory_path() /
            fmt::format("rlhf_io_test_{}_{}_{:08x}", ::getpid(), counter++, rd());
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::filesystem::path& path() const { return path_; }
  /// Path of `name` inside the directory (not created).
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  /// Writes `content` (bytes) to `name` and returns its path.
  std::string write(const std::string& name, const std::string& content) const {
    const std::string p = file(name);
    std::ofstream f(p, std::ios::binary);
    f << content;
    return p;
  }

 private:
  std::filesystem::path path_;
};

/// The message of the rlhf::Error that `f` throws; a failed check (and "") if it throws nothing
/// or something else.
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const rlhf::Error& e) {
    return e.what();
  } catch (const std::exception& e) {
    FAIL_CHECK("expected rlhf::Error, got another exception: " << e.what());
    return "";
  }
  FAIL_CHECK("expected rlhf::Error, nothing was thrown");
  return "";
}

/// True if `haystack` contains `needle`.
inline bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

/// CHECK that `msg` contains `needle`, printing both on failure.
#define RLHF_CHECK_CONTAINS(msg, needle)            \
  do {                                              \
    INFO("message: " << (msg));                     \
    INFO("expected to contain: " << (needle));      \
    CHECK(::rlhf::test::contains((msg), (needle))); \
  } while (0)

/// Reads a whole file as bytes.
inline std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

}  // namespace rlhf::test
