// WeightSync::sync_device_disaggregated: the training GPUs' bf16 shards into the device weights
// of GPU engines on generation-only ranks, over NCCL (an all-gather across the training ranks,
// then a node-local broadcast into the engines), with no host staging. See weight_sync.h.
#include <mpi.h>

#include <algorithm>
#include <chrono>

#include "core/error.h"
#include "parallel/mpi_check.h"
#include "parallel/watchdog.h"
#include "parallel/weight_sync.h"

#ifdef RLHF_CUDA
#include "parallel/comm_nccl.h"
#include "parallel/zero3_cuda.h"
#endif

namespace rlhf::parallel {

bool WeightSync::device_sync_node_local() const {
  if (colocated_) return false;
  const Placement& pl = topo_.placement();
  std::vector<int> trainers(size_t(pl.num_nodes()), 0), generators(size_t(pl.num_nodes()), 0);
  for (const RankPlacement& r : pl.ranks) {
    if (r.trains()) ++trainers[size_t(r.node)];
    if (r.generates()) ++generators[size_t(r.node)];
  }
  for (int n = 0; n < pl.num_nodes(); ++n)
    if (generators[size_t(n)] > 0 && trainers[size_t(n)] == 0) return false;
  return true;
}

}  // namespace rlhf::parallel

#ifdef RLHF_CUDA
namespace rlhf::parallel {

/// The node-local NCCL communicator {first training rank of the node, the node's generation
/// ranks} (its rank 0 is the training rank: generation ranks are a node's highest local ranks) and
/// the events that order the gather stream and the broadcast stream on the broadcasting rank.
struct WeightSync::NodeDeviceSync {
  MPI_Comm mpi = MPI_COMM_NULL;
  std::unique_ptr<Comm> nccl;                  // nullptr on training ranks that do not broadcast
  cudaEvent_t gathered[2] = {}, sent[2] = {};  // per staging buffer
  ~NodeDeviceSync() {
    for (int i = 0; i < 2; ++i) {
      if (gathered[i] != nullptr) cudaEventDestroy(gathered[i]);
      if (sent[i] != nullptr) cudaEventDestroy(sent[i]);
    }
    nccl.reset();  // collective over mpi's members (NcclComm's destructor)
    free_comm_quietly(&mpi);
  }
};

namespace {
double seconds_now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

SyncStats WeightSync::sync_device_disaggregated(Zero3StoreCuda* source,
                                                const std::vector<model::bf16*>& engine_units,
                                                Comm* train_nccl) {
  RLHF_CHECK(!colocated_,
             "weight sync: the disaggregated device path needs generation-only ranks "
             "(--gen_ranks_per_node > 0); colocated ranks use sync_device");
  RLHF_CHECK(device_sync_node_local(),
             "weight sync into GPU engines: a node holds generation ranks but no training rank, "
             "so the device sync cannot stay inside the node (the host path can)");
  RLHF_CHECK(!trains_ || source != nullptr, "weight sync: a training rank must pass its store");
  RLHF_CHECK(!generates_ || int(engine_units.size()) == layout_.num_units(),
             "weight sync: an engine rank must pass {} unit buffers", layout_.num_units());
#ifdef RLHF_NCCL
  WatchScope watch("weight sync (device, disaggregated)", "world");
  const RankPlacement& me = topo_.me();
  const Placement& pl = topo_.placement();
  // The broadcasting rank of a node: its lowest training rank.
  int node_root = -1;
  for (const RankPlacement& r : pl.ranks)
    if (r.node == me.node && r.trains()) {
      node_root = r.rank;
      break;
    }
  const bool root = me.rank == node_root;
  if (!node_sync_) {  // collective over the world: every rank takes part in the split
    auto ns = std::make_shared<NodeDeviceSync>();
    const int color = root || generates_ ? me.node : MPI_UNDEFINED;
    MPI_CHECK(MPI_Comm_split(topo_.world(), color, me.rank, &ns->mpi));
    if (ns->mpi != MPI_COMM_NULL) {
      ns->nccl = make_comm(ns->mpi, "weight_sync_node_nccl", CommKind::kNccl);
      RLHF_CHECK(ns->nccl->rank() != 0 || root, "weight sync: the node's trainer must be rank 0");
    }
    if (root)
      for (int i = 0; i < 2; ++i) {
        CUDA_CHECK(cudaEventCreateWithFlags(&ns->gathered[i], cudaEventDisableTiming));
        CUDA_CHECK(cudaEventCreateWithFlags(&ns->sent[i], cudaEventDisableTiming));
      }
    node_sync_ = std::move(ns);
  }
  NodeDeviceSync& ns = *node_sync_;
  auto* node = ns.nccl ? dynamic_cast<NcclComm*>(ns.nccl.get()) : nullptr;
  RLHF_ASSERT(ns.nccl == nullptr || node != nullptr);
  NcclComm* gather = nullptr;
  if (trains_ && n_train_ > 1) {
    gather = dynamic_cast<NcclComm*>(train_nccl);
    RLHF_CHECK(gather != nullptr && gather->size() == n_train_,
               "weight sync into GPU engines needs the NCCL train communicator");
  }

  SyncStats st;
  st.mode = "disaggregated";
  st.device = true;
  st.buckets = int64_t(buckets_.size());
  for (int u = 0; u < layout_.num_units(); ++u)
    st.bytes += shard_layout_.padded_numel(u) * int64_t(sizeof(model::bf16));
  int64_t most = 0;
  for (const SyncBucket& b : buckets_) most = std::max(most, b.count);
  if (n_train_ > 1)  // every training rank gathers into it; engine ranks receive slices into it
    for (auto& s : staging_) s.resize(most * n_train_, "weight sync staging");

  const double t0 = seconds_now();
  // Where the optimizer's last bf16 update of the shards is ordered before the first send.
  if (gather != nullptr)
    gather->wait_for(source->stream());
  else if (root)
    node->wait_for(source->stream());
  const size_t nb = buckets_.size();
  // A bucket's gathered layout: train rank j's slice at j·count. Its place in the unit is
  // j·part + begin, so a whole-unit bucket (begin 0, count = part) or a single train rank's
  // bucket is already in the unit's layout.
  auto direct = [&](const SyncBucket& b) {
    return n_train_ == 1 || (b.begin == 0 && b.count == part_[size_t(b.unit)]);
  };
  std::vector<CommRequest> reqs;
  reqs.reserve(2 * nb);
  auto gather_bucket = [&](size_t k) {
    const SyncBucket& b = buckets_[k];
    model::bf16* stage = staging_[k % 2].get();
    if (root && k >= 2)  // the broadcast of bucket k − 2 read this staging buffer
      CUDA_CHECK(cudaStreamWaitEvent(gather->stream(), ns.sent[k % 2], 0));
    reqs.push_back(gather->iall_gather(source->shard_params_bf16(b.unit) + b.begin, stage, b.count,
                                       DType::kBfloat16));
    if (root) CUDA_CHECK(cudaEventRecord(ns.gathered[k % 2], gather->stream()));
  };
  auto broadcast_bucket = [&](size_t k) {
    const SyncBucket& b = buckets_[k];
    const int64_t part = part_[size_t(b.unit)];
    model::bf16* buf = nullptr;
    if (root) {
      if (n_train_ == 1) {
        buf = const_cast<model::bf16*>(source->shard_params_bf16(b.unit)) + b.begin;
      } else {
        CUDA_CHECK(cudaStreamWaitEvent(node->stream(), ns.gathered[k % 2], 0));
        buf = staging_[k % 2].get();
      }
    } else {
      buf = direct(b) ? engine_units[size_t(b.unit)] + b.begin : staging_[k % 2].get();
    }
    // ncclBroadcast in place: the root sends buf, every engine rank receives into its own.
    reqs.push_back(node->ibroadcast(buf, b.count * n_train_, DType::kBfloat16, 0));
    if (root && n_train_ > 1) CUDA_CHECK(cudaEventRecord(ns.sent[k % 2], node->stream()));
    if (!root && !direct(b))
      // Rank j's slice of the bucket sits at stage + j·count; its place is unit + j·part + begin.
      CUDA_CHECK(cudaMemcpy2DAsync(
          engine_units[size_t(b.unit)] + b.begin, size_t(part) * sizeof(model::bf16), buf,
          size_t(b.count) * sizeof(model::bf16), size_t(b.count) * sizeof(model::bf16),
          size_t(n_train_), cudaMemcpyDeviceToDevice, node->stream()));
  };
  // Enqueue order on the broadcasting rank: gather k + 1 before broadcast k, so the two NCCL
  // streams overlap them; the events keep each staging buffer's gather after the broadcast that
  // last read it. Non-broadcasting training ranks only gather; engine ranks only receive.
  if (gather != nullptr && nb > 0) gather_bucket(0);
  for (size_t k = 0; k < nb; ++k) {
    if (gather != nullptr && k + 1 < nb) gather_bucket(k + 1);
    if (node != nullptr) broadcast_bucket(k);
  }
  for (CommRequest& r : reqs) r.wait();
  if (node != nullptr) CUDA_CHECK(cudaStreamSynchronize(node->stream()));
  if (gather != nullptr) CUDA_CHECK(cudaStreamSynchronize(gather->stream()));
  st.seconds = [&] {
    double x = seconds_now() - t0, y = 0;
    MPI_CHECK(MPI_Allreduce(&x, &y, 1, MPI_DOUBLE, MPI_MAX, topo_.world()));
    return y;
  }();
  st.algbw_GBps = st.seconds > 0 ? double(st.bytes) / st.seconds / 1e9 : 0;
  st.busbw_GBps = st.algbw_GBps;
  return st;
#else
  (void)source;
  (void)engine_units;
  (void)train_nccl;
  RLHF_FAIL("weight sync into disaggregated GPU engines needs NCCL");
#endif
}

}  // namespace rlhf::parallel
#endif  // RLHF_CUDA
