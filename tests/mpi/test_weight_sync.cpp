// Weight sync: after training steps on the train ranks, every engine's weights equal the
// consolidated trainer weights bit for bit — colocated (G = 0) and disaggregated (G = 1 per
// node), ZeRO-3 and replicated trainers, for buckets smaller than, equal to and larger than a unit.
#include "parallel/weight_sync.h"

#include <mpi.h>

#include <cmath>
#include <limits>

#include "parallel/zero3.h"
#include "tests/mpi/train_util.h"

using namespace rlhf;
using namespace rlhf::test;

namespace {

std::vector<int64_t> bucket_sizes(const model::ParamLayout& layout) {
  int64_t largest = 0;
  for (const auto& u : layout.units()) largest = std::max(largest, u.numel_padded);
  return {1024, largest * 4, int64_t(64) << 20};  // smaller than, equal to, larger than a unit
}

void check_sync(bool disaggregated, bool zero3) {
  int world_size = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  parallel::TopologyOptions topt;
  topt.ranks_per_node = parallel::resolve_ranks_per_node(0);
  if (topt.ranks_per_node == 0) topt.ranks_per_node = world_size;
  topt.gen_ranks_per_node = disaggregated ? 1 : 0;
  parallel::Topology topo(MPI_COMM_WORLD, topt);
  auto train_comm = parallel::make_comm(topo.train_comm(), "train_comm");
  const int n_train = int(topo.placement().train_ranks.size());
  const auto cfg = small_config(true);
  model::ParamLayout layout(cfg, model::HeadKind::kLM, n_train);
  std::unique_ptr<parallel::ParamStore> store;
  std::vector<std::vector<float>> consolidated;
  if (topo.trains()) {
    if (zero3)
      store = std::make_unique<parallel::Zero3Store>(layout, *train_comm);
    else if (n_train == 1)
      store = std::make_unique<parallel::LocalParamStore>(layout);
    else
      store = std::make_unique<parallel::ReplicatedStore>(layout, *train_comm);
    init_store(*store, 3);
    const int64_t per = kSeqs / n_train;
    train(*store, cfg, 2, train_comm->rank() * per, per, per);  // weights now differ from init
    consolidated = full_weights(*store);
  }
  // The truth for every engine: train rank 0's consolidated weights, sent over the world.
  const int root = topo.placement().train_ranks.front();
  std::vector<std::vector<float>> truth(size_t(layout.num_units()));
  for (int u = 0; u < layout.num_units(); ++u) {
    truth[size_t(u)].resize(size_t(layout.unit(u).numel_padded));
    if (topo.rank() == root) truth[size_t(u)] = consolidated[size_t(u)];
    MPI_Bcast(truth[size_t(u)].data(), int(truth[size_t(u)].size()), MPI_FLOAT, root,
              MPI_COMM_WORLD);
  }
  for (int64_t bucket : bucket_sizes(layout)) {
    parallel::WeightSync sync(topo, train_comm.get(), layout, bucket);
    std::vector<std::vector<float>> engine;
    std::vector<float*> ptrs;
    if (topo.generates())
      for (int u = 0; u < layout.num_units(); ++u) {
        engine.emplace_back(size_t(layout.unit(u).numel_padded),
                            std::numeric_limits<float>::quiet_NaN());
        ptrs.push_back(engine.back().data());
      }
    const auto st = sync.sync(store.get(), ptrs);
    const std::string name = fmt::format("{} {} bucket {} B ({} buckets)", st.mode,
                                         zero3 ? "zero3" : "replicated", bucket, st.buckets);
    CHECK_MESSAGE(st.mode == (disaggregated ? "disaggregated" : "colocated"), name);
    CHECK_MESSAGE(st.bytes > 0, name);
    if (topo.generates())
      for (int u = 0; u < layout.num_units(); ++u)
        CHECK_MESSAGE(engine[size_t(u)] == truth[size_t(u)], name << " unit " << u);
  }
}

}  // namespace

TEST_CASE("weight sync: colocated, ZeRO-3 and replicated") {
  check_sync(false, true);
  check_sync(false, false);
}

TEST_CASE("weight sync: disaggregated (one generation rank per node)") {
  check_sync(true, true);
  check_sync(true, false);
}

TEST_CASE("weight sync: bucket plan") {
  auto b = parallel::plan_sync_buckets({10, 3, 0, 7}, 2, 4 * 2 * 4);  // 4 elements per rank
  REQUIRE(b.size() == 3 + 1 + 0 + 2);
  CHECK(b[0].unit == 0);
  CHECK(b[2].begin == 8);
  CHECK(b[2].count == 2);
  CHECK(b[3].unit == 1);
  CHECK(b[3].count == 3);
  CHECK(b[5].unit == 3);
  CHECK(b[5].count == 3);
}
