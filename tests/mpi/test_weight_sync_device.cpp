// Weight sync into disaggregated GPU engines, device to device (WeightSync::
// sync_device_disaggregated): after training steps on the GPU train ranks, every engine rank's
// bf16 device weights equal the bf16 rounding of what the host path (WeightSync::sync, fp32 over
// MPI) writes into the engine's host buffers, bit for bit, for buckets smaller than, equal to and
// larger than a unit, with 1, 2 and 3 train ranks and tensor-parallel engines; and the device path
// leaves the engine's host buffers untouched (no host staging); a node with engines but no
// training rank is refused (device_sync_node_local() false). Skipped without a CUDA device per
// rank; CI runs it on the CUDA emulator (tests/cuda_emu).
#include <mpi.h>

#include <cmath>
#include <limits>

#include "core/cuda_check.h"
#include "parallel/weight_sync.h"
#include "rollout/engine.h"
#include "tests/mpi/train_util.h"

#ifdef RLHF_CUDA
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include "parallel/zero3_cuda.h"
#endif

using namespace rlhf;
using namespace rlhf::test;

namespace {

#if defined(RLHF_CUDA) && defined(RLHF_NCCL)
// One placement: nodes of `ranks_per_node` simulated ranks, G generation ranks per node, engines
// of tp ranks.
void check_device_sync(int ranks_per_node, int gen_per_node, int tp) {
  parallel::TopologyOptions topt;
  topt.ranks_per_node = ranks_per_node;
  topt.gen_ranks_per_node = gen_per_node;
  topt.tensor_parallel = tp;
  parallel::Topology topo(MPI_COMM_WORLD, topt);
  const int n_train = int(topo.placement().train_ranks.size());
  auto host = parallel::make_comm(topo.train_comm(), "train_comm");
  auto nccl = parallel::make_comm(topo.train_comm(), "train_comm_nccl", parallel::CommKind::kNccl);
  if (nccl && nccl->size() == 1) nccl.reset();  // one train rank: the store needs none
  const auto tp_comm = tp > 1 ? parallel::make_comm(topo.engine_comm(), "engine_comm") : nullptr;
  const auto cfg = small_config(true);
  model::ParamLayout layout(cfg, model::HeadKind::kLM);
  const std::vector<int64_t> room = parallel::WeightSync::engine_unit_room(layout, n_train);
  std::unique_ptr<parallel::TrainModel> model;
  parallel::Zero3StoreCuda* store = nullptr;
  if (topo.trains()) {
    model = parallel::make_cuda_train_model(
        std::make_unique<parallel::Zero3StoreCuda>(layout, nccl.get()), false);
    store = dynamic_cast<parallel::Zero3StoreCuda*>(&model->store());
    init_store(*store, 3);
    const int64_t per = kSeqs / n_train;
    train(*model, cfg, 2, host->rank() * per, per, per);  // weights now differ from init
  }
  std::unique_ptr<rollout::Engine> engine;
  if (topo.generates()) {
    rollout::EngineOptions eo;
    eo.cuda = true;
    eo.gpu_memory_utilization = 0.5;
    eo.max_batch = 2;
    eo.tp_comm = tp_comm.get();
    eo.unit_room = room;
    engine = std::make_unique<rollout::Engine>(layout, eo);
    REQUIRE(engine->tp_size() == tp);
  }
  for (int64_t bucket : {int64_t(1024), int64_t(64) << 20}) {  // unit slices; whole units
    parallel::WeightSync sync(topo, host.get(), layout, bucket);
    REQUIRE(sync.device_sync_node_local());
    const std::string name = fmt::format("{} ranks/node, G {}, TP {}, {} train ranks, bucket {} B",
                                         ranks_per_node, gen_per_node, tp, n_train, bucket);
    // The reference: the host path's fp32 engine buffers, rounded to bf16.
    std::vector<std::vector<float>> want;
    if (engine) {
      const auto ptrs = engine->unit_buffers();
      for (int u = 0; u < layout.num_units(); ++u)
        std::fill(ptrs[size_t(u)], ptrs[size_t(u)] + room[size_t(u)],
                  std::numeric_limits<float>::quiet_NaN());
    }
    const parallel::SyncStats hs =
        sync.sync(store, engine ? engine->unit_buffers() : std::vector<float*>());
    CHECK_MESSAGE(!hs.device, name);
    std::vector<model::bf16*> dev;
    if (engine) {
      const auto ptrs = engine->unit_buffers();
      for (int u = 0; u < layout.num_units(); ++u) {
        want.emplace_back(ptrs[size_t(u)], ptrs[size_t(u)] + layout.unit(u).numel);
        for (float& x : want.back()) x = __bfloat162float(__float2bfloat16_rn(x));
        // Poison the host buffers: a device sync staged through them would overwrite it.
        std::fill(ptrs[size_t(u)], ptrs[size_t(u)] + room[size_t(u)],
                  std::numeric_limits<float>::quiet_NaN());
      }
      dev = engine->device_unit_buffers();
      for (int u = 0; u < layout.num_units(); ++u)  // poison, so a missed slice shows
        CUDA_CHECK(cudaMemset(dev[size_t(u)], 0xFF, size_t(room[size_t(u)]) * sizeof(model::bf16)));
      CUDA_CHECK(cudaDeviceSynchronize());  // the sync's non-blocking streams do not wait for it
    }
    const parallel::SyncStats st = sync.sync_device_disaggregated(store, dev, nccl.get());
    CHECK_MESSAGE(st.device, name);
    CHECK_MESSAGE(st.mode == "disaggregated", name);
    CHECK_MESSAGE(st.buckets == int64_t(sync.buckets().size()), name);
    int64_t padded = 0;
    for (int64_t r : room) padded += r;
    CHECK_MESSAGE(st.bytes == padded * 2, name);  // bf16: half the host path's fp32 bytes
    CHECK_MESSAGE(hs.bytes == padded * 4, name);
    if (!engine) continue;
    const auto ptrs = engine->unit_buffers();
    for (int u = 0; u < layout.num_units(); ++u) {
      std::vector<model::bf16> got(size_t(layout.unit(u).numel));
      CUDA_CHECK(cudaMemcpy(got.data(), dev[size_t(u)], got.size() * sizeof(model::bf16),
                            cudaMemcpyDeviceToHost));
      int64_t wrong = 0, host_written = 0;
      for (size_t i = 0; i < got.size(); ++i)
        wrong += __bfloat162float(got[i]) != want[size_t(u)][i];
      for (int64_t i = 0; i < room[size_t(u)]; ++i) host_written += !std::isnan(ptrs[size_t(u)][i]);
      CHECK_MESSAGE(wrong == 0, name << " unit " << u << ": " << wrong
                                     << " elements differ from the host path's bf16 weights");
      CHECK_MESSAGE(host_written == 0, name << " unit " << u << ": " << host_written
                                            << " host elements written (host staging)");
    }
  }
}
#endif

}  // namespace

TEST_CASE("weight sync into disaggregated GPU engines (device, NCCL) equals the host path") {
  if (!select_gpu_per_rank()) {
    MESSAGE("skipped: needs a CUDA device per rank (and NCCL)");
    return;
  }
#if defined(RLHF_CUDA) && defined(RLHF_NCCL)
  int world_size = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  if (world_size % 2 != 0) return;
  // Nodes of 2: one train and one generation rank each (np 2: one train rank, the shard is the
  // unit; np 4: two train ranks on two nodes, the gather crosses nodes, the broadcast does not).
  check_device_sync(2, 1, 1);
  if (world_size == 4) {
    check_device_sync(4, 1, 1);  // 3 train ranks: shards padded, one engine rank
    check_device_sync(4, 2, 2);  // a TP-2 engine: both ranks receive the full units
    // Nodes of 3 and 1: the second node's only rank generates, with no trainer beside it, so the
    // device path (node-local broadcasts) cannot serve it and refuses; rl_run takes the host path.
    parallel::TopologyOptions topt;
    topt.ranks_per_node = 3;
    topt.gen_ranks_per_node = 1;
    parallel::Topology topo(MPI_COMM_WORLD, topt);
    auto host = parallel::make_comm(topo.train_comm(), "train_comm");
    const model::ParamLayout layout(small_config(true), model::HeadKind::kLM);
    parallel::WeightSync sync(topo, host.get(), layout, int64_t(1) << 20);
    CHECK_FALSE(sync.device_sync_node_local());
    CHECK_THROWS_AS(sync.sync_device_disaggregated(nullptr, {}, nullptr), rlhf::Error);
  }
#endif
}
