// Weight sync: after training steps on the train ranks, every engine's weights equal the
// consolidated trainer weights bit for bit — colocated (G = 0) and disaggregated (G = 1 per
// node), ZeRO-3 and replicated trainers, for buckets smaller than, equal to and larger than a unit;
// and into tensor-parallel engines (TP 2, real rollout::Engine): every rank of every engine holds
// the consolidated weights and the engine's greedy tokens equal a TP 1 engine's on them. With bf16
// (both sides compute in bf16): the engines receive the consolidated weights rounded to bf16 bit
// for bit at exactly half the bytes, and a bf16 engine generates the same tokens and log-probs as
// one filled by the fp32 sync.
#include "parallel/weight_sync.h"

#include <mpi.h>

#include <cmath>
#include <limits>

#include "core/cuda_check.h"
#include "model/ops/half.h"
#include "model/ops/matmul_bf16.h"
#include "parallel/zero3.h"
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

std::vector<int64_t> bucket_sizes(const model::ParamLayout& layout) {
  int64_t largest = 0;
  for (const auto& u : layout.units()) largest = std::max(largest, u.numel);
  return {1024, largest * 4, int64_t(64) << 20};  // smaller than, equal to, larger than a unit
}

std::vector<rollout::GenerationRequest> greedy_requests(int64_t vocab) {
  std::vector<rollout::GenerationRequest> reqs(3);
  for (size_t i = 0; i < reqs.size(); ++i) {
    reqs[i].id = i;
    reqs[i].prompt = test::random_tokens(int64_t(2 + 3 * i), vocab, 40 + i);
    reqs[i].max_new_tokens = 10;
    reqs[i].sampling.greedy = true;
    reqs[i].sampling.seed = 1;
  }
  return reqs;
}

// gen_per_node = G (0: colocated), tp = ranks per engine; ranks_per_node 0 = the test's
// RLHF_RANKS_PER_NODE (else the world); bf16: WeightSync's bf16.
void check_sync(int gen_per_node, bool zero3, int tp = 1, int ranks_per_node = 0,
                bool bf16 = false) {
  const bool disaggregated = gen_per_node > 0;
  int world_size = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  parallel::TopologyOptions topt;
  topt.ranks_per_node = ranks_per_node > 0 ? ranks_per_node : parallel::resolve_ranks_per_node(0);
  if (topt.ranks_per_node == 0) topt.ranks_per_node = world_size;
  topt.gen_ranks_per_node = gen_per_node;
  topt.tensor_parallel = tp;
  parallel::Topology topo(MPI_COMM_WORLD, topt);
  const auto tp_comm = tp > 1 ? parallel::make_comm(topo.engine_comm(), "engine_comm") : nullptr;
  auto train_comm = parallel::make_comm(topo.train_comm(), "train_comm");
  const int n_train = int(topo.placement().train_ranks.size());
  const auto cfg = small_config(true);
  model::ParamLayout layout(cfg, model::HeadKind::kLM);
  const std::vector<int64_t> room = parallel::WeightSync::engine_unit_room(layout, n_train);
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
    truth[size_t(u)].resize(size_t(layout.unit(u).numel));
    if (topo.rank() == root) truth[size_t(u)] = consolidated[size_t(u)];
    MPI_Bcast(truth[size_t(u)].data(), int(truth[size_t(u)].size()), MPI_FLOAT, root,
              MPI_COMM_WORLD);
  }
  // bf16: what an engine must hold is the truth rounded to bf16 (nearest even).
  std::vector<std::vector<float>> want = truth;
  if (bf16)
    for (auto& t : want) model::round_to_bf16_n(t.data(), int64_t(t.size()));
  int64_t fp32_bytes = 0;
  for (int64_t n : room) fp32_bytes += n * int64_t(sizeof(float));
  bool generated = false;
  for (int64_t bucket : bucket_sizes(layout)) {
    parallel::WeightSync sync(topo, train_comm.get(), layout, bucket, bf16);
    std::vector<std::vector<float>> engine;
    std::vector<float*> ptrs;
    std::unique_ptr<rollout::Engine> tp_engine;  // tp > 1: a real tensor-parallel engine
    if (topo.generates()) {
      if (tp > 1) {
        rollout::EngineOptions eo;
        eo.kv_cache_bytes = 1 << 20;
        eo.tp_comm = tp_comm.get();
        eo.unit_room = room;
        tp_engine = std::make_unique<rollout::Engine>(layout, eo);
        REQUIRE(tp_engine->tp_size() == tp);
        ptrs = tp_engine->unit_buffers();
        for (float* p : ptrs) p[0] = std::numeric_limits<float>::quiet_NaN();
      } else {
        for (int u = 0; u < layout.num_units(); ++u) {
          engine.emplace_back(size_t(room[size_t(u)]), std::numeric_limits<float>::quiet_NaN());
          ptrs.push_back(engine.back().data());
        }
      }
    }
    const auto st = sync.sync(store.get(), ptrs);
    const std::string name =
        fmt::format("{} tp {} {}{} bucket {} B ({} buckets)", st.mode, tp,
                    zero3 ? "zero3" : "replicated", bf16 ? " bf16" : "", bucket, st.buckets);
    CHECK_MESSAGE(st.mode == (disaggregated ? "disaggregated" : "colocated"), name);
    CHECK_MESSAGE(st.bytes == (bf16 ? fp32_bytes / 2 : fp32_bytes), name);
    if (topo.generates())
      for (int u = 0; u < layout.num_units(); ++u) {
        const std::vector<float> got(ptrs[size_t(u)], ptrs[size_t(u)] + layout.unit(u).numel);
        CHECK_MESSAGE(got == want[size_t(u)], name << " unit " << u);
      }
    if (bf16 && tp == 1 && topo.generates() && !generated && model::onednn_available()) {
      // A bf16 engine on what the bf16 sync delivered generates exactly what a bf16 engine on the
      // fp32 truth does (it rounds its weights itself).
      generated = true;
      rollout::EngineOptions eo;
      eo.kv_cache_bytes = 1 << 20;
      eo.bf16 = true;
      rollout::Engine from_sync(layout, eo), from_fp32(layout, eo);
      for (int u = 0; u < layout.num_units(); ++u) {
        std::copy(ptrs[size_t(u)], ptrs[size_t(u)] + layout.unit(u).numel,
                  from_sync.unit_buffer(u));
        std::copy(truth[size_t(u)].begin(), truth[size_t(u)].end(), from_fp32.unit_buffer(u));
      }
      const auto reqs = greedy_requests(cfg.vocab_size);
      const auto a = from_fp32.generate(reqs);
      const auto b = from_sync.generate(reqs);
      REQUIRE(a.size() == b.size());
      for (size_t i = 0; i < a.size(); ++i) {
        CHECK_MESSAGE(a[i].tokens == b[i].tokens, name);
        CHECK_MESSAGE(a[i].logprobs == b[i].logprobs, name);
      }
    }
    if (tp_engine) {
      // The engine slices what sync wrote: its greedy tokens equal a TP 1 engine's on the truth.
      rollout::EngineOptions eo;
      eo.kv_cache_bytes = 1 << 20;
      rollout::Engine one(layout, eo);
      for (int u = 0; u < layout.num_units(); ++u)
        std::copy(truth[size_t(u)].begin(), truth[size_t(u)].end(), one.unit_buffer(u));
      const auto reqs = greedy_requests(cfg.vocab_size);
      const auto a = one.generate(reqs);
      const auto b = tp_engine->generate(reqs);
      REQUIRE(a.size() == b.size());
      for (size_t i = 0; i < a.size(); ++i) CHECK_MESSAGE(a[i].tokens == b[i].tokens, name);
    }
  }
}

}  // namespace

TEST_CASE("weight sync: colocated, ZeRO-3 and replicated") {
  check_sync(0, true);
  check_sync(0, false);
}

TEST_CASE("weight sync: disaggregated (one generation rank per node)") {
  check_sync(1, true);
  check_sync(1, false);
}

TEST_CASE("weight sync: bf16 (half the bytes; the engine's rounded weights bit for bit)") {
  for (int g : {0, 1}) {
    check_sync(g, true, 1, 0, true);
    check_sync(g, false, 1, 0, true);
  }
}

TEST_CASE("weight sync: tensor-parallel engines (TP 2)") {
  int world_size = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  if (world_size % 2 != 0) return;
  // Colocated: engines of 2 ranks cut from every simulated node of 2 ranks.
  check_sync(0, true, 2, 2);
  check_sync(0, false, 2, 2);
  // Disaggregated: a node of 4 ranks, 2 train and 2 form one engine.
  if (world_size == 4) {
    check_sync(2, true, 2, 4);
    check_sync(2, false, 2, 4);
  }
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

TEST_CASE("weight sync into GPU engines (device to device over NCCL) is bit-exact") {
  if (!select_gpu_per_rank()) {
    MESSAGE("skipped: needs a CUDA device per rank (and NCCL)");
    return;
  }
#if defined(RLHF_CUDA) && defined(RLHF_NCCL)
  int world_size = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  parallel::TopologyOptions topt;
  topt.ranks_per_node = world_size;  // one node, colocated: every rank trains and generates
  parallel::Topology topo(MPI_COMM_WORLD, topt);
  auto nccl = parallel::make_comm(topo.train_comm(), "train_comm_nccl", parallel::CommKind::kNccl);
  auto host = parallel::make_comm(topo.train_comm(), "train_comm");
  const auto cfg = small_config(true);
  const int N = nccl->size();
  model::ParamLayout layout(cfg, model::HeadKind::kLM);
  const parallel::ShardLayout shards(layout, N);
  parallel::Zero3OptionsCuda so;
  auto model = parallel::make_cuda_train_model(
      std::make_unique<parallel::Zero3StoreCuda>(layout, nccl.get(), so), false);
  auto& store = dynamic_cast<parallel::Zero3StoreCuda&>(model->store());
  init_store(store, 3);
  const int64_t per = kSeqs / N;
  train(*model, cfg, 2, nccl->rank() * per, per, per);  // weights now differ from init
  // The truth: the bf16 rounding of the consolidated fp32 masters (what the trainer's own forward
  // reads after the optimizer's cast).
  const auto masters = full_weights(store);
  rollout::EngineOptions eo;
  eo.cuda = true;
  eo.gpu_memory_utilization = 0.5;
  eo.max_batch = 2;
  eo.unit_room = shards.padded_numels();
  rollout::Engine engine(layout, eo);
  for (int64_t bucket : bucket_sizes(layout)) {
    parallel::WeightSync sync(topo, host.get(), layout, bucket);
    const auto dev = engine.device_unit_buffers();
    for (int u = 0; u < layout.num_units(); ++u)  // poison, so a missed slice shows
      CUDA_CHECK(
          cudaMemset(dev[size_t(u)], 0xFF, size_t(shards.padded_numel(u)) * sizeof(model::bf16)));
    CUDA_CHECK(cudaDeviceSynchronize());  // the sync's non-blocking streams do not wait for it
    const parallel::SyncStats st = sync.sync_device(store, dev, nccl.get());
    CHECK(st.bytes == shards.total_padded() * 2);
    for (int u = 0; u < layout.num_units(); ++u) {
      std::vector<model::bf16> got(size_t(layout.unit(u).numel));
      CUDA_CHECK(cudaMemcpy(got.data(), dev[size_t(u)], got.size() * sizeof(model::bf16),
                            cudaMemcpyDeviceToHost));
      int64_t wrong = 0;
      for (size_t i = 0; i < got.size(); ++i) {
        const float want = __bfloat162float(__float2bfloat16_rn(masters[size_t(u)][i]));
        wrong += __bfloat162float(got[i]) != want;
      }
      CHECK_MESSAGE(wrong == 0, "unit " << u << " bucket " << bucket << ": " << wrong
                                        << " elements differ from the trainer's bf16 weights");
    }
  }
#endif
}
