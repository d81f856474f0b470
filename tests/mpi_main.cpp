// doctest runner for the MPI tests (Debian's doctest 2.4.9 ships no doctest_mpi.h). Every rank runs
// the same test cases in the same order (so their collectives match); rank 0 prints doctest's
// report, the other ranks only their failures (--minimal). The failure flags are summed over ranks
// and every rank exits non-zero if any rank failed.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>
#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "core/error.h"
#include "core/openblas_core.h"
#include "tests/test_guard.h"

namespace rlhf::test {
std::string shared_data_dir() {  // declared in tests/test_util.h
  if (const char* env = std::getenv("RLHF_SHARED_DATA")) return env;
  std::filesystem::path p = std::filesystem::path(RLHF_SOURCE_DIR) / ".." / "shared" / "data";
  return std::filesystem::exists(p) ? std::filesystem::canonical(p).string() : std::string();
}
}  // namespace rlhf::test

int main(int argc, char** argv) {
  rlhf::reexec_for_openblas_core(argv);  // OpenBLAS's own kernels for this CPU, as `rlhf` runs
  int provided = 0;
  if (MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS) return 2;
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  int rank = 0, size = 1, len = 0;
  char host[MPI_MAX_PROCESSOR_NAME] = {0};
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  MPI_Get_processor_name(host, &len);
  rlhf::set_error_context(rank, host);
  rlhf::test::guard::install();  // fail, never hang (tests/test_guard.h)

  doctest::Context ctx;
  ctx.applyCommandLine(argc, argv);
  if (rank != 0) {
    ctx.setOption("minimal", true);
    ctx.setOption("no-colors", true);
  }
  int failed = ctx.run() != 0 ? 1 : 0;
  int failed_ranks = 0;
  MPI_Allreduce(&failed, &failed_ranks, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (rank == 0 && failed_ranks > 0)
    std::printf("rlhf_mpi_tests: %d of %d ranks had failures\n", failed_ranks, size);
  MPI_Finalize();
  return failed_ranks > 0 ? 1 : 0;
}
