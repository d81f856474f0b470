// H5_CHECK: failures become rlhf::Error carrying the HDF5 error stack, and HDF5 prints nothing.
#include "io/h5_check.h"

#include <fcntl.h>
#include <unistd.h>

#include "tests/io/io_test_util.h"

using namespace rlhf;

namespace {

// Runs `f` with stderr redirected to a file and returns what was written to it.
std::string capture_stderr(const test::TempDir& dir, const std::function<void()>& f) {
  const std::string path = dir.file("stderr.txt");
  std::fflush(stderr);
  const int saved = ::dup(2);
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  ::dup2(fd, 2);
  ::close(fd);
  try {
    f();
  } catch (...) {
    std::fflush(stderr);
    ::dup2(saved, 2);
    ::close(saved);
    throw;
  }
  std::fflush(stderr);
  ::dup2(saved, 2);
  ::close(saved);
  return test::slurp(path);
}

}  // namespace

TEST_CASE("H5_CHECK throws rlhf::Error with the HDF5 error stack and prints nothing") {
  test::TempDir dir;
  const std::string missing = dir.file("missing.h5");
  std::string msg;
  const std::string printed = capture_stderr(dir, [&] {
    msg = test::error_of([&] { H5_CHECK(H5Fopen(missing.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT)); });
  });
  CHECK(printed.empty());
  RLHF_CHECK_CONTAINS(msg, "HDF5 error: returned -1: H5Fopen: unable to open file");
  // RLHF_CHECK_GEN stringifies the call after macro expansion (H5F_ACC_RDONLY is a macro).
  RLHF_CHECK_CONTAINS(msg, "in `H5Fopen(missing.c_str(), ");
  CHECK(msg.find('\n') == std::string::npos);
  RLHF_CHECK_CONTAINS(msg, "test_h5_check.cpp:");
  RLHF_CHECK_CONTAINS(msg, "No such file or directory");
  // The stack was consumed: nothing is left for the next failure to report.
  CHECK(io::h5_error_stack().empty());
}

TEST_CASE("H5_CHECK passes results through and H5Id closes what it owns") {
  test::TempDir dir;
  const std::string path = dir.file("f.h5");
  hid_t raw;
  {
    io::H5Id f(H5_CHECK(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT)));
    CHECK(f.valid());
    raw = f.get();
    CHECK(H5Iis_valid(raw) > 0);
    io::H5Id moved = std::move(f);
    CHECK_FALSE(f.valid());
    CHECK(moved.get() == raw);
  }
  io::h5_init();
  CHECK(H5Iis_valid(raw) <= 0);
  // herr_t results: a failing close of an invalid id.
  RLHF_CHECK_CONTAINS(test::error_of([] { H5_CHECK(H5Dclose(H5I_INVALID_HID)); }), "HDF5 error");
}
