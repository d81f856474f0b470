// bench sync on a tiny model: one row per (mode, model) on rank 0, every engine buffer right after
// the syncs (wrong == 0), the bytes of the padded units, busbw = algbw · factor, a skipped row for
// a placement with no training rank.
#include <doctest/doctest.h>
#include <mpi.h>

#include <vector>

#include "bench/bench_sync.h"
#include "model/layout.h"
#include "parallel/mpi_check.h"
#include "parallel/shard_layout.h"
#include "tests/mpi/train_util.h"

namespace {

// The rows run_bench_sync emits on this rank for the small model, buckets of 1 KiB (many
// buckets, slices of units), one timed round, the given placements.
std::vector<nlohmann::json> bench_rows(const std::vector<int>& gen_ranks, bool bf16) {
  rlhf::bench::BenchSyncOptions o;
  o.models = {{"small", rlhf::test::small_config(true)}};
  o.bucket_bytes = 1024;
  o.iters = 1;
  o.gen_ranks = gen_ranks;
  o.bf16 = bf16;
  std::vector<nlohmann::json> rows;
  rlhf::bench::run_bench_sync(o, [&](const nlohmann::json& r) { rows.push_back(r); });
  return rows;
}

}  // namespace

TEST_CASE("bench sync: tiny model, colocated and disaggregated, engines hold the weights") {
  using namespace rlhf;
  const int me = parallel::comm_rank(MPI_COMM_WORLD);
  const int n = parallel::comm_size(MPI_COMM_WORLD);
  const model::ModelConfig cfg = test::small_config(true);
  const std::vector<nlohmann::json> rows = bench_rows({0, n / 2, n}, false);  // n: skipped
  if (me != 0) {
    CHECK(rows.empty());
    return;
  }
  REQUIRE(rows.size() == 3);
  CHECK(rows[2].contains("skipped"));
  for (int k = 0; k < 2; ++k) {
    const nlohmann::json& r = rows[size_t(k)];
    INFO(r.dump());
    const int G = k == 0 ? 0 : n / 2;
    const int n_train = n - G;
    CHECK(r["mode"] == (G == 0 ? "colocated" : "disaggregated"));
    CHECK(r["wrong"] == 0);
    CHECK(r["train_ranks"] == n_train);
    CHECK(r["engines"] == (G == 0 ? n : G));
    const parallel::ShardLayout layout(model::ParamLayout(cfg, model::HeadKind::kLM), n_train);
    CHECK(r["bytes"] == layout.total_padded() * 4);
    CHECK(r["buckets"].get<int64_t>() > layout.num_units());
    const double f = G == 0 ? (n_train - 1.0) / n_train : 1.0;
    CHECK(r["sync_busbw_GBps"].get<double>() ==
          doctest::Approx(r["sync_algbw_GBps"].get<double>() * f));
    CHECK(r["ratio"].get<double>() ==
          doctest::Approx(r["allgather_s"].get<double>() / r["sync_s"].get<double>()));
    CHECK(!bench::bench_sync_row_text(r).empty());
  }
}

TEST_CASE("bench sync: bf16 mode moves half the bytes and delivers the bf16 rounding") {
  using namespace rlhf;
  const int me = parallel::comm_rank(MPI_COMM_WORLD);
  const int n = parallel::comm_size(MPI_COMM_WORLD);
  const model::ModelConfig cfg = test::small_config(true);
  const std::vector<nlohmann::json> rows = bench_rows({0, n / 2}, true);
  if (me != 0) return;
  REQUIRE(rows.size() == 2);
  for (int k = 0; k < 2; ++k) {
    const nlohmann::json& r = rows[size_t(k)];
    INFO(r.dump());
    if (r.contains("skipped")) continue;  // one rank: no disaggregated placement
    const int n_train = r["train_ranks"].get<int>();
    const parallel::ShardLayout layout(model::ParamLayout(cfg, model::HeadKind::kLM), n_train);
    CHECK(r["dtype"] == "bf16");
    // Every engine element is the bf16 rounding of its weight (count_wrong compares against it;
    // an fp32 transfer would leave the unrounded values and count nearly every element).
    CHECK(r["wrong"] == 0);
    CHECK(r["bytes"] == layout.total_padded() * 2);
  }
}
