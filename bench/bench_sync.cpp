#include "bench/bench_sync.h"

#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>

#include <fmt/format.h>

#include "core/error.h"
#include "model/layout.h"
#include "model/ops/half.h"
#include "parallel/mpi_check.h"
#include "parallel/param_store.h"
#include "parallel/topology.h"
#include "parallel/weight_sync.h"
#include "rollout/sampling.h"

namespace rlhf::bench {

namespace {

// The benchmark's weight value of element j of unit u: a hash of (seed, u, j) in [-0.5, 0.5),
// exactly representable (24 bits), so any rank can recompute what an engine must hold.
float weight_value(uint64_t seed, int u, int64_t j) {
  const uint64_t h = rollout::mix64(seed ^ rollout::mix64((uint64_t(u) << 40) ^ uint64_t(j)));
  return float(double(h >> 40) * 0x1p-24 - 0.5);
}

// A trainer's ZeRO-3-style part of every unit (part r of n), filled with weight_value; only what
// weight sync reads (unit_shard) is implemented.
class ShardStore : public parallel::ParamStore {
 public:
  ShardStore(const model::ParamLayout& layout, int rank, int n, uint64_t seed) : layout_(layout) {
    const parallel::ShardLayout shards(layout, n);
    for (int u = 0; u < layout.num_units(); ++u) {
      const int64_t part = shards.shard_numel(u);
      offset_.push_back(int64_t(rank) * part);
      data_.emplace_back(size_t(part));
      std::vector<float>& d = data_.back();
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < part; ++i) d[size_t(i)] = weight_value(seed, u, offset_.back() + i);
    }
  }
  const model::ParamLayout& layout() const override {
    return layout_;
  }
  model::UnitProvider<float>& provider() override {
    RLHF_FAIL("bench sync store: no provider");
  }
  void zero_grads() override {}
  double grad_sq_norm() override {
    return 0;
  }
  void adamw_step(const optim::AdamWConfig&, double, int64_t, float) override {
    RLHF_FAIL("bench sync store: no optimizer");
  }
  void gather_unit(int, float*) override {
    RLHF_FAIL("bench sync store: no gather_unit");
  }
  void load_unit(int, const float*) override {
    RLHF_FAIL("bench sync store: no load_unit");
  }
  void gather_moments(int, float*, float*) override {
    RLHF_FAIL("bench sync store: no moments");
  }
  void load_moments(int, const float*, const float*) override {
    RLHF_FAIL("bench sync store: no moments");
  }
  parallel::MemoryReport memory() const override {
    return {};
  }
  parallel::UnitShard unit_shard(int u) const override {
    return {data_[size_t(u)].data(), offset_[size_t(u)], int64_t(data_[size_t(u)].size())};
  }
  bool replicated() const override {
    return false;
  }

 private:
  model::ParamLayout layout_;
  std::vector<int64_t> offset_;
  std::vector<std::vector<float>> data_;
};

// Elements of the engine buffers that differ from weight_value (padding included: the trainer's
// parts cover the padded unit).
// Engine elements that differ from the weights (bf16: from their bf16 rounding, what a bf16 sync
// delivers).
int64_t count_wrong(const model::ParamLayout& layout, const std::vector<std::vector<float>>& units,
                    uint64_t seed, bool bf16) {
  int64_t wrong = 0;
  for (int u = 0; u < layout.num_units(); ++u) {
    const std::vector<float>& d = units[size_t(u)];
    const int64_t n = int64_t(d.size());
#pragma omp parallel for schedule(static) reduction(+ : wrong)
    for (int64_t j = 0; j < n; ++j) {
      const float w = weight_value(seed, u, j);
      wrong += d[size_t(j)] != (bf16 ? model::round_to_bf16(w) : w);
    }
  }
  return wrong;
}

}  // namespace

model::ModelConfig shape135m_config() {
  model::ModelConfig c;
  c.model_type = "llama";
  c.hidden_size = 576;
  c.intermediate_size = 1536;
  c.num_hidden_layers = 30;
  c.num_attention_heads = 9;
  c.num_key_value_heads = 3;
  c.vocab_size = 49152;
  c.max_position_embeddings = 2048;
  c.tie_word_embeddings = true;
  return c;
}

void run_bench_sync(const BenchSyncOptions& opts, const Emit& emit_row) {
  RLHF_CHECK(opts.iters >= 1, "bench sync: iters must be >= 1 (got {})", opts.iters);
  RLHF_CHECK(opts.bucket_bytes >= 1024, "bench sync: bucket_bytes must be >= 1024 (got {})",
             opts.bucket_bytes);
  int world = 1, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  std::vector<int> modes = opts.gen_ranks;
  if (modes.empty()) {
    modes.push_back(0);
    if (world >= 2) modes.push_back(world / 2);
  }
  for (const int G : modes) {
    const std::string mode = G == 0 ? "colocated" : "disaggregated";
    if (G < 0 || G >= world) {
      if (rank == 0)
        emit_row({{"bench", "sync"},
                  {"mode", mode},
                  {"ranks", world},
                  {"gen_ranks", G},
                  {"skipped", fmt::format("{} generation ranks need more than {} ranks (at least "
                                          "one must train)",
                                          G, world)}});
      continue;
    }
    parallel::TopologyOptions topt;
    topt.ranks_per_node = world;  // one simulated node: the G highest ranks generate
    topt.gen_ranks_per_node = G;
    parallel::Topology topo(MPI_COMM_WORLD, topt);
    const parallel::Placement& pl = topo.placement();
    const int n_train = int(pl.train_ranks.size());
    auto train_comm = parallel::make_comm(topo.train_comm(), "train_comm", opts.comm_kind);
    // The train_comm implementation's name, from train rank 0 (the only one sure to have it).
    int kind = train_comm ? int(train_comm->kind()) : 0;
    MPI_CHECK(MPI_Bcast(&kind, 1, MPI_INT, pl.train_ranks.front(), topo.world()));
    for (const auto& [name, cfg] : opts.models) {
      const model::ParamLayout layout(cfg, model::HeadKind::kLM);
      const std::vector<int64_t> room = parallel::WeightSync::engine_unit_room(layout, n_train);
      std::unique_ptr<ShardStore> store;
      if (topo.trains())
        store = std::make_unique<ShardStore>(layout, topo.me().train_rank, n_train, opts.seed);
      std::vector<std::vector<float>> units;
      std::vector<float*> ptrs;
      if (topo.generates())
        for (int u = 0; u < layout.num_units(); ++u) {
          units.emplace_back(size_t(room[size_t(u)]), std::numeric_limits<float>::quiet_NaN());
          ptrs.push_back(units.back().data());
        }
      parallel::WeightSync sync(topo, train_comm.get(), layout, opts.bucket_bytes, opts.bf16);
      parallel::SyncStats best = sync.sync(store.get(), ptrs);  // untimed warm-up
      best.seconds = std::numeric_limits<double>::infinity();
      for (int i = 0; i < opts.iters; ++i) {
        MPI_CHECK(MPI_Barrier(topo.world()));
        const parallel::SyncStats st = sync.sync(store.get(), ptrs);
        if (st.seconds < best.seconds) best = st;
      }
      const double ref_s = sync.reference_all_gather_seconds(opts.iters);
      int64_t wrong = topo.generates() ? count_wrong(layout, units, opts.seed, opts.bf16) : 0;
      MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &wrong, 1, MPI_INT64_T, MPI_SUM, topo.world()));
      const double factor = G == 0 ? double(n_train - 1) / double(n_train) : 1.0;
      const double ref_busbw = double(best.bytes) / ref_s / 1e9 * factor;
      if (rank == 0)
        emit_row({{"bench", "sync"},
                  {"model", name},
                  {"mode", best.mode},
                  {"ranks", world},
                  {"train_ranks", n_train},
                  {"engines", pl.num_engines()},
                  {"comm",
                   G == 0 ? parallel::comm_kind_name(parallel::CommKind(kind)) : "mpi-intercomm"},
                  {"dtype", opts.bf16 ? "bf16" : "fp32"},
                  {"bucket_bytes", opts.bucket_bytes},
                  {"buckets", best.buckets},
                  {"bytes", best.bytes},
                  {"params", layout.num_parameters()},
                  {"iters", opts.iters},
                  {"sync_s", best.seconds},
                  {"sync_algbw_GBps", best.algbw_GBps},
                  {"sync_busbw_GBps", best.busbw_GBps},
                  {"allgather_s", ref_s},
                  {"allgather_busbw_GBps", ref_busbw},
                  {"ratio", ref_s / best.seconds},
                  {"wrong", wrong}});
    }
  }
}

std::string bench_sync_row_text(const nlohmann::json& row) {
  if (row.contains("skipped"))
    return fmt::format("{} skipped: {}", row["mode"].get<std::string>(),
                       row["skipped"].get<std::string>());
  return fmt::format(
      "{:>10} {:>13} | {} ranks ({} train, {} engines) {} | {:.1f} MB in {} buckets | sync "
      "{:.2f} ms busbw {:.2f} GB/s | all-gather {:.2f} ms busbw {:.2f} GB/s | ratio {:.2f} | "
      "wrong {}",
      row["model"].get<std::string>(), row["mode"].get<std::string>(), row["ranks"].get<int>(),
      row["train_ranks"].get<int>(), row["engines"].get<int>(), row["comm"].get<std::string>(),
      row["bytes"].get<double>() / 1e6, row["buckets"].get<int64_t>(),
      row["sync_s"].get<double>() * 1e3, row["sync_busbw_GBps"].get<double>(),
      row["allgather_s"].get<double>() * 1e3, row["allgather_busbw_GBps"].get<double>(),
      row["ratio"].get<double>(), row["wrong"].get<int64_t>());
}

}  // namespace rlhf::bench
