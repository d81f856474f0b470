#include "parallel/weight_sync.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <limits>

#include "core/checked_alloc.h"
#include "core/error.h"
#include "parallel/mpi_check.h"
#include "parallel/watchdog.h"

#ifdef RLHF_CUDA
#include "parallel/comm_nccl.h"
#include "parallel/zero3_cuda.h"
#endif

namespace rlhf::parallel {

namespace {
double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
double max_over_world(MPI_Comm world, double x) {
  double y = 0;
  MPI_CHECK(MPI_Allreduce(&x, &y, 1, MPI_DOUBLE, MPI_MAX, world));
  return y;
}
}  // namespace

std::vector<SyncBucket> plan_sync_buckets(const std::vector<int64_t>& part_numel, int n_train,
                                          int64_t bucket_bytes) {
  RLHF_CHECK(bucket_bytes >= 4 * n_train, "--sync_bucket_mb is too small ({} bytes)", bucket_bytes);
  const int64_t per_rank = std::max<int64_t>(1, bucket_bytes / (4 * int64_t(n_train)));
  std::vector<SyncBucket> b;
  for (int u = 0; u < int(part_numel.size()); ++u)
    for (int64_t a = 0; a < part_numel[size_t(u)]; a += per_rank)
      b.push_back({u, a, std::min(per_rank, part_numel[size_t(u)] - a)});
  return b;
}

WeightSync::WeightSync(const Topology& topo, Comm* train_comm, const model::ParamLayout& layout,
                       int64_t bucket_bytes, bool bf16)
    : topo_(topo),
      train_comm_(train_comm),
      layout_(layout),
      shard_layout_(layout, int(topo.placement().train_ranks.size())) {
  const Placement& pl = topo.placement();
  // Tensor-parallel engines need nothing special: every engine rank is a generation rank and
  // receives whole units (colocated: from the all-gather over train_comm; disaggregated: from the
  // intercommunicator's all-gather, which reaches every generation rank); the engine cuts its own
  // slices at generate().
  colocated_ = pl.colocated();
  trains_ = topo.trains();
  generates_ = topo.generates();
  n_train_ = static_cast<int>(pl.train_ranks.size());
  RLHF_CHECK(!trains_ || (train_comm && train_comm->size() == n_train_),
             "weight sync: a training rank needs train_comm");
  for (int u = 0; u < layout.num_units(); ++u) part_.push_back(shard_layout_.shard_numel(u));
  buckets_ = plan_sync_buckets(part_, n_train_, bucket_bytes);
  bf16_ = bf16;
  if (!colocated_) {
    // Leaders: the first train rank and the first generation rank (world ranks).
    RLHF_CHECK(!pl.gen_ranks.empty(), "weight sync: no generation rank");
    MPI_Comm local = trains_ ? topo.train_comm() : topo.gen_comm();
    const int remote_leader = trains_ ? pl.gen_ranks.front() : pl.train_ranks.front();
    MPI_CHECK(MPI_Intercomm_create(local, 0, topo.world(), remote_leader, 7031, &inter_));
  }
}

WeightSync::~WeightSync() {
  free_comm_quietly(&inter_);
}

SyncStats WeightSync::sync(const ParamStore* source, const std::vector<float*>& engine_units) {
  RLHF_CHECK(!trains_ || source != nullptr, "weight sync: a training rank must pass its store");
  WatchScope watch("weight sync", "world");
  RLHF_CHECK(!generates_ || int(engine_units.size()) == layout_.num_units(),
             "weight sync: an engine rank must pass {} unit buffers", layout_.num_units());
  SyncStats st;
  st.mode = colocated_ ? "colocated" : "disaggregated";
  st.buckets = int64_t(buckets_.size());
  const int64_t elem = bf16_ ? int64_t(sizeof(model::bfloat16)) : int64_t(sizeof(float));
  for (int u = 0; u < layout_.num_units(); ++u) st.bytes += shard_layout_.padded_numel(u) * elem;
  const double t0 = now_s();
  if (colocated_)
    sync_colocated(*source, engine_units);
  else
    sync_disaggregated(source, engine_units);
  st.seconds = max_over_world(topo_.world(), now_s() - t0);
  st.algbw_GBps = st.seconds > 0 ? double(st.bytes) / st.seconds / 1e9 : 0;
  st.busbw_GBps =
      colocated_ ? st.algbw_GBps * double(n_train_ - 1) / double(n_train_) : st.algbw_GBps;
  return st;
}

void WeightSync::sync_colocated(const ParamStore& source, const std::vector<float*>& engine_units) {
  // Every rank trains and generates.
  if (source.replicated()) {
    for (int u = 0; u < layout_.num_units(); ++u) {
      const UnitShard s = source.unit_shard(u);
      float* dst = engine_units[size_t(u)];
      std::memcpy(dst, s.data, sizeof(float) * size_t(s.count));
      if (bf16_) model::round_to_bf16_n(dst, s.count);  // what a bf16 transfer would deliver
    }
    return;
  }
  for (const SyncBucket& b : buckets_) {
    const UnitShard s = source.unit_shard(b.unit);
    RLHF_ASSERT(s.count == part_[size_t(b.unit)]);
    float* unit = engine_units[size_t(b.unit)];
    if (!bf16_) {  // ZeRO-3: gather each bucket straight into place
      train_comm_->all_gather_strided(s.data + b.begin, unit + b.begin, b.count, s.count,
                                      DType::kFloat32);
      continue;
    }
    // bf16: this rank's slice rounded, gathered compactly (rank j's at j·count), then widened
    // into its place j·part + begin.
    checked_grow(send16_[0], b.count, "the weight sync's bf16 send buffer");
    checked_grow(recv16_[0], b.count * n_train_, "the weight sync's bf16 receive buffer");
    model::float_to_bf16_n(send16_[0].data(), s.data + b.begin, b.count);
    train_comm_->all_gather(send16_[0].data(), recv16_[0].data(), b.count, DType::kBfloat16);
    for (int j = 0; j < n_train_; ++j)
      model::bf16_to_float_n(unit + int64_t(j) * s.count + b.begin,
                             recv16_[0].data() + int64_t(j) * b.count, b.count);
  }
}

void WeightSync::sync_disaggregated(const ParamStore* source,
                                    const std::vector<float*>& engine_units) {
  // Iallgatherv on the intercommunicator, two buckets in flight. A replicated trainer sends whole
  // units from its first rank only. bf16: the slices travel rounded, as 2-byte words, through
  // per-slot staging buffers (widened into place when their bucket completes).
  const bool repl = trains_ && source->replicated();
  int repl_all = repl ? 1 : 0;
  if (trains_)
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &repl_all, 1, MPI_INT, MPI_MAX, topo_.train_comm()));
  // Let the generation side know whether the trainer is replicated.
  int repl_remote = 0;
  MPI_CHECK(MPI_Allreduce(&repl_all, &repl_remote, 1, MPI_INT, MPI_MAX, inter_));
  const bool replicated = trains_ ? repl_all != 0 : repl_remote != 0;
  const int my_train_rank = trains_ ? train_comm_->rank() : -1;
  int remote_size = 0;
  MPI_CHECK(MPI_Comm_remote_size(inter_, &remote_size));
  const MPI_Datatype type = bf16_ ? MPI_UINT16_T : MPI_FLOAT;
  struct Inflight {
    MPI_Request req = MPI_REQUEST_NULL;
    std::vector<int> counts, displs;
    size_t bucket = 0;
  };
  Inflight fl[2];
  auto post = [&](size_t k, int slot) {
    Inflight& f = fl[slot];
    f.bucket = k;
    const SyncBucket& b = buckets_[k];
    const int64_t part = part_[size_t(b.unit)];
    // Replicated trainers: rank 0 sends the whole unit as if it held every part.
    const int64_t count = replicated ? (b.begin == 0 ? layout_.unit(b.unit).numel : 0) : b.count;
    RLHF_CHECK(count <= std::numeric_limits<int>::max(), "weight sync: bucket too large");
    f.counts.assign(size_t(remote_size), 0);
    f.displs.assign(size_t(remote_size), 0);
    if (trains_) {
      const bool sends = !replicated || my_train_rank == 0;
      const float* src = source->unit_shard(b.unit).data + (replicated ? 0 : b.begin);
      const void* buf = src;
      if (bf16_) {
        checked_grow(send16_[slot], count, "the weight sync's bf16 send buffer");
        model::float_to_bf16_n(send16_[slot].data(), src, sends ? count : 0);
        buf = send16_[slot].data();
      }
      MPI_CHECK(MPI_Iallgatherv(buf, sends ? int(count) : 0, type, nullptr, f.counts.data(),
                                f.displs.data(), type, inter_, &f.req));
      return;
    }
    // bf16 lands compactly in the slot's staging (rank j's slice at j·count), else in place.
    for (int j = 0; j < remote_size; ++j) {
      if (replicated) {
        f.counts[size_t(j)] = j == 0 ? int(count) : 0;
      } else {
        f.counts[size_t(j)] = int(b.count);
        const int64_t d = bf16_ ? int64_t(j) * b.count : int64_t(j) * part + b.begin;
        RLHF_CHECK(d <= std::numeric_limits<int>::max(), "weight sync: unit too large");
        f.displs[size_t(j)] = int(d);
      }
    }
    void* dst = engine_units[size_t(b.unit)];
    if (bf16_) {
      checked_grow(recv16_[slot], replicated ? count : b.count * remote_size,
                   "the weight sync's bf16 receive buffer");
      dst = recv16_[slot].data();
    }
    MPI_CHECK(MPI_Iallgatherv(nullptr, 0, type, dst, f.counts.data(), f.displs.data(), type, inter_,
                              &f.req));
  };
  // Generation ranks, bf16: the completed bucket of `slot` widened into its places.
  auto land = [&](int slot) {
    if (!bf16_ || trains_) return;
    const SyncBucket& b = buckets_[fl[slot].bucket];
    float* unit = engine_units[size_t(b.unit)];
    const model::bfloat16* r = recv16_[slot].data();
    if (replicated) {
      if (b.begin == 0) model::bf16_to_float_n(unit, r, layout_.unit(b.unit).numel);
      return;
    }
    const int64_t part = part_[size_t(b.unit)];
    for (int j = 0; j < remote_size; ++j)
      model::bf16_to_float_n(unit + int64_t(j) * part + b.begin, r + int64_t(j) * b.count, b.count);
  };
  const size_t nb = buckets_.size();
  if (nb > 0) post(0, 0);
  for (size_t k = 0; k < nb; ++k) {
    // Bucket k + 1 goes out before k is waited on; with bf16 its slot's staging is free once
    // bucket k − 1 (same slot) has landed, which the previous iteration did.
    if (k + 1 < nb) post(k + 1, int((k + 1) % 2));
    MPI_CHECK(MPI_Wait(&fl[k % 2].req, MPI_STATUS_IGNORE));
    land(int(k % 2));
  }
}

SyncStats WeightSync::sync_adapters(const float* src, float* dst, int64_t n) {
  RLHF_CHECK(!trains_ || src != nullptr, "adapter sync: a training rank must pass its adapters");
  RLHF_CHECK(!generates_ || dst != nullptr, "adapter sync: an engine rank must pass its buffer");
  RLHF_CHECK(n <= std::numeric_limits<int>::max(), "adapter sync: {} floats is too large", n);
  WatchScope watch("adapter sync", "world");
  SyncStats st;
  st.mode = colocated_ ? "colocated" : "disaggregated";
  st.buckets = 1;
  st.bytes = n * int64_t(sizeof(float));
  const double t0 = now_s();
  if (colocated_) {
    std::memcpy(dst, src, sizeof(float) * size_t(n));
  } else if (trains_) {
    const int root = train_comm_->rank() == 0 ? MPI_ROOT : MPI_PROC_NULL;
    MPI_CHECK(MPI_Bcast(const_cast<float*>(src), int(n), MPI_FLOAT, root, inter_));
  } else {
    MPI_CHECK(MPI_Bcast(dst, int(n), MPI_FLOAT, 0, inter_));
  }
  st.seconds = max_over_world(topo_.world(), now_s() - t0);
  st.algbw_GBps = st.seconds > 0 ? double(st.bytes) / st.seconds / 1e9 : 0;
  st.busbw_GBps = st.algbw_GBps;
  return st;
}

double WeightSync::reference_all_gather_seconds(int iters) {
  // The sync's bytes: fp32 elements, or in bf16 mode half as many 4-byte words.
  const int64_t per_rank = bf16_ ? (shard_layout_.total_padded() / n_train_ + 1) / 2
                                 : shard_layout_.total_padded() / n_train_;
  const int64_t total = per_rank * n_train_;
  std::vector<float> send(static_cast<size_t>(per_rank), 1.0f);
  double best = std::numeric_limits<double>::infinity();
  if (colocated_) {
    std::vector<float> recv(static_cast<size_t>(total));
    train_comm_->all_gather(send.data(), recv.data(), per_rank);  // untimed: touches recv
    for (int i = 0; i < iters; ++i) {
      MPI_CHECK(MPI_Barrier(topo_.world()));
      const double t0 = now_s();
      train_comm_->all_gather(send.data(), recv.data(), per_rank);
      best = std::min(best, max_over_world(topo_.world(), now_s() - t0));
    }
  } else {
    std::vector<float> recv(trains_ ? 0 : size_t(total));
    for (int i = -1; i < iters; ++i) {  // i = -1: untimed, touches recv
      MPI_CHECK(MPI_Barrier(topo_.world()));
      const double t0 = now_s();
      if (trains_)
        MPI_CHECK(
            MPI_Allgather(send.data(), int(per_rank), MPI_FLOAT, nullptr, 0, MPI_FLOAT, inter_));
      else
        MPI_CHECK(
            MPI_Allgather(nullptr, 0, MPI_FLOAT, recv.data(), int(per_rank), MPI_FLOAT, inter_));
      const double t = max_over_world(topo_.world(), now_s() - t0);
      if (i >= 0) best = std::min(best, t);
    }
  }
  return best;
}

}  // namespace rlhf::parallel

#ifdef RLHF_CUDA
namespace rlhf::parallel {

SyncStats WeightSync::sync_device(Zero3StoreCuda& source,
                                  const std::vector<model::bf16*>& engine_units, Comm* nccl) {
  RLHF_CHECK(colocated_,
             "weight sync into GPU engines needs colocated ranks (--gen_ranks_per_node 0); "
             "disaggregated GPU engines take the host path");
  WatchScope watch("weight sync (device)", "world");
  RLHF_CHECK(int(engine_units.size()) == layout_.num_units(),
             "weight sync: an engine rank must pass {} unit buffers", layout_.num_units());
  SyncStats st;
  st.mode = "colocated";
  st.device = true;
  st.buckets = int64_t(buckets_.size());
  for (int u = 0; u < layout_.num_units(); ++u)
    st.bytes += shard_layout_.padded_numel(u) * int64_t(sizeof(model::bf16));
  const double t0 = now_s();
  if (n_train_ == 1) {
    for (int u = 0; u < layout_.num_units(); ++u)
      CUDA_CHECK(cudaMemcpyAsync(engine_units[size_t(u)], source.shard_params_bf16(u),
                                 size_t(layout_.unit(u).numel) * sizeof(model::bf16),
                                 cudaMemcpyDeviceToDevice, source.stream()));
    CUDA_CHECK(cudaStreamSynchronize(source.stream()));
  } else {
#ifdef RLHF_NCCL
    auto* nc = dynamic_cast<NcclComm*>(nccl);
    RLHF_CHECK(nc != nullptr && nc->size() == n_train_,
               "weight sync into GPU engines needs the NCCL train communicator");
    int64_t most = 0;
    for (const SyncBucket& b : buckets_) most = std::max(most, b.count);
    for (auto& s : staging_) s.resize(most * n_train_, "weight sync staging");
    nc->wait_for(source.stream());  // the optimizer's last bf16 update of the shards
    std::vector<CommRequest> reqs;
    for (size_t k = 0; k < buckets_.size(); ++k) {
      const SyncBucket& b = buckets_[k];
      const int64_t part = part_[size_t(b.unit)];
      model::bf16* stage = staging_[k % 2].get();
      reqs.push_back(nc->iall_gather(source.shard_params_bf16(b.unit) + b.begin, stage, b.count,
                                     DType::kBfloat16));
      // Rank j's slice of the bucket sits at stage + j·count; its place is unit + j·part + begin.
      CUDA_CHECK(cudaMemcpy2DAsync(
          engine_units[size_t(b.unit)] + b.begin, size_t(part) * sizeof(model::bf16), stage,
          size_t(b.count) * sizeof(model::bf16), size_t(b.count) * sizeof(model::bf16),
          size_t(n_train_), cudaMemcpyDeviceToDevice, nc->stream()));
    }
    for (CommRequest& r : reqs) r.wait();
    CUDA_CHECK(cudaStreamSynchronize(nc->stream()));
#else
    (void)nccl;
    RLHF_FAIL("weight sync into GPU engines on several ranks needs NCCL");
#endif
  }
  st.seconds = max_over_world(topo_.world(), now_s() - t0);
  st.algbw_GBps = st.seconds > 0 ? double(st.bytes) / st.seconds / 1e9 : 0;
  st.busbw_GBps = st.algbw_GBps * double(n_train_ - 1) / double(n_train_);
  return st;
}

double WeightSync::reference_device_all_gather_seconds(Comm* nccl, int iters) {
  const int64_t total = shard_layout_.total_padded();
  const int64_t per_rank = total / n_train_;
  if (nccl == nullptr || n_train_ == 1) return 0.0;
  DeviceArray<model::bf16> send(per_rank, "all-gather reference"),
      recv(total, "all-gather reference");
  CUDA_CHECK(cudaMemset(send.get(), 0, size_t(per_rank) * sizeof(model::bf16)));
  double best = std::numeric_limits<double>::infinity();
  for (int i = -1; i < iters; ++i) {  // i = -1: untimed, touches recv
    MPI_CHECK(MPI_Barrier(topo_.world()));
    const double t0 = now_s();
    nccl->all_gather(send.get(), recv.get(), per_rank, DType::kBfloat16);
    const double t = max_over_world(topo_.world(), now_s() - t0);
    if (i >= 0) best = std::min(best, t);
  }
  return best;
}

}  // namespace rlhf::parallel
#endif  // RLHF_CUDA
