// doctest runner for the single-process unit tests.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <filesystem>

#include "core/openblas_core.h"
#include "tests/test_guard.h"
#include "tests/test_util.h"

namespace rlhf::test {
std::string shared_data_dir() {
  if (const char* env = std::getenv("RLHF_SHARED_DATA")) return env;
  std::filesystem::path p = std::filesystem::path(RLHF_SOURCE_DIR) / ".." / "shared" / "data";
  return std::filesystem::exists(p) ? std::filesystem::canonical(p).string() : std::string();
}
}  // namespace rlhf::test

int main(int argc, char** argv) {
  rlhf::reexec_for_openblas_core(argv);  // OpenBLAS's own kernels for this CPU, as `rlhf` runs
  rlhf::test::guard::install();          // fail, never hang (tests/test_guard.h)
  doctest::Context ctx;
  ctx.applyCommandLine(argc, argv);
  return ctx.run();
}
