// Failure injection under MPI: with RLHF_INJECT_FAILURE="<point>:<rank>", exactly that rank throws.
#include <doctest/doctest.h>
#include <mpi.h>

#include <cstdlib>

#include "core/error.h"
#include "parallel/failure_injection.h"
#include "parallel/mpi_check.h"

using namespace rlhf::parallel;

TEST_CASE("failure injection: only the named rank throws") {
  const int me = comm_rank(MPI_COMM_WORLD), n = comm_size(MPI_COMM_WORLD);
  const int target = n - 1;
  setenv("RLHF_INJECT_FAILURE", ("mpi_test_point:" + std::to_string(target)).c_str(), 1);
  int threw = 0;
  try {
    maybe_inject_failure("mpi_test_point", me);
    maybe_inject_failure("other_point", me);
  } catch (const rlhf::Error& e) {
    threw = 1;
    CHECK(std::string(e.what()) ==
          "injected failure at mpi_test_point on rank " + std::to_string(me));
  }
  unsetenv("RLHF_INJECT_FAILURE");
  CHECK(threw == (me == target ? 1 : 0));
  int total = 0;
  MPI_CHECK(MPI_Allreduce(&threw, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD));
  CHECK(total == 1);
}
