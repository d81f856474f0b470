// bench comm on a tiny sweep: one row per (op, size, impl), nothing wrong, busbw = algbw · factor.
#include <doctest/doctest.h>
#include <mpi.h>

#include <vector>

#include "bench/bench_comm.h"
#include "parallel/mpi_check.h"

TEST_CASE("bench comm: tiny sweep, both implementations, rows on rank 0") {
  rlhf::bench::BenchCommOptions o;
  o.min_bytes = 1024;
  o.max_bytes = 16384;
  o.factor = 4;
  o.warmup = 1;
  o.iters = 2;
  o.min_iters = 1;
  std::vector<nlohmann::json> rows;
  rlhf::bench::run_bench_comm(o, [&](const nlohmann::json& r) { rows.push_back(r); });
  const int me = rlhf::parallel::comm_rank(MPI_COMM_WORLD);
  const int n = rlhf::parallel::comm_size(MPI_COMM_WORLD);
  if (me != 0) {
    CHECK(rows.empty());
    return;
  }
  CHECK(rows.size() == 3 * 3 * 2);  // ops × sizes (1, 4, 16 KiB) × impls
  for (const auto& r : rows) {
    INFO(r.dump());
    CHECK(r["wrong"] == 0);
    CHECK(r["n"] == n);
    const double f = n == 1 ? 0.0 : r["op"] == "all_reduce" ? 2.0 * (n - 1) / n : (n - 1.0) / n;
    CHECK(r["busbw_GBps"].get<double>() == doctest::Approx(r["algbw_GBps"].get<double>() * f));
    CHECK(r["algbw_GBps"].get<double>() ==
          doctest::Approx(r["bytes"].get<double>() / r["time_us"].get<double>() * 1e-3));
    CHECK(r["time_max_us"].get<double>() >= r["time_us"].get<double>() * 0.999);
    CHECK(!rlhf::bench::bench_comm_row_text(r).empty());
  }
  CHECK(rows[0]["op"] == "all_gather");
  CHECK(rows[0]["impl"] == "mpi");
  CHECK(rows[1]["impl"] == "shm");
}
