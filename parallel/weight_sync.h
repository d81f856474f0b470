// Weight sync: the trainer's (sharded) weights into every generation engine's own unit buffers,
// in buckets of --sync_bucket_mb (whole units or unit slices), without per-parameter calls.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "model/layout.h"
#include "model/ops/half.h"
#include "parallel/comm.h"
#include "parallel/param_store.h"
#include "parallel/shard_layout.h"
#include "parallel/topology.h"

#ifdef RLHF_CUDA
#include "core/device_memory.h"
#include "model/ops/cuda_types.h"
#endif

namespace rlhf::parallel {

class Zero3StoreCuda;

/// One sync's accounting (the same numbers on every rank).
struct SyncStats {
  int64_t buckets = 0;
  int64_t bytes = 0;   ///< bytes of weights each engine rank received (fp32 units, or bf16 ones
                       ///< with WeightSync's bf16, padded for the train ranks as ShardLayout
                       ///< pads them)
  double seconds = 0;  ///< wall time of the slowest rank
  /// Achieved bandwidth per engine rank: bytes / seconds (GB = 1e9); busbw applies nccl-tests'
  /// all-gather factor (n−1)/n with n = train ranks (colocated) or 1 (disaggregated: every byte
  /// crosses from a trainer to an engine).
  double algbw_GBps = 0, busbw_GBps = 0;
  std::string mode;  ///< "colocated" | "disaggregated"
  /// True when the bytes went device to device into the engines' bf16 device weights (NCCL; no
  /// host staging): sync_device, sync_device_disaggregated.
  bool device = false;
};

/// A bucket: elements [begin, begin + count) of every train rank's part of unit `unit`.
struct SyncBucket {
  int unit = 0;
  int64_t begin = 0, count = 0;
};

/// Plans the buckets for parts of `part_numel[u]` elements per train rank: whole units when a
/// unit's gathered size (n_train · part) fits in bucket_bytes, else slices of it.
std::vector<SyncBucket> plan_sync_buckets(const std::vector<int64_t>& part_numel, int n_train,
                                          int64_t bucket_bytes);

/// Built collectively by every rank of the topology's world.
///  - colocated (--gen_ranks_per_node 0): every rank trains and owns an engine; a bucket is one
///    all-gather (strided: each train rank's slice lands at its place in the unit) over train_comm
///    straight into the engine's buffers — no second copy.
///  - disaggregated: training ranks and generation ranks are joined by an MPI intercommunicator;
///    a bucket is one MPI_Iallgatherv on it — every generation rank receives every train rank's
///    slice directly at its place in its engine buffer; two buckets in flight (k+1 is posted
///    before k is waited on).
/// Engine unit buffers must have room for engine_unit_room()[u] elements: the unit padded for the
/// train ranks (ShardLayout), since the gathered shards land whole; the engine reads the unit's
/// numel of them.
/// bf16 (both sides compute in bf16: the CPU's --param_dtype bf16, whose engines round every
/// weight to bf16 anyway): the weights travel as bf16 (each slice rounded to nearest even on the
/// training rank, 2 bytes an element: half the bytes) and are widened into the engine's fp32 unit
/// buffers, so the engine holds exactly round_bf16 of what an fp32 sync would deliver.
/// Tensor-parallel engines (TP > 1): every rank of an engine receives the whole units (bytes per
/// engine rank as for TP 1) and the engine slices them itself (rollout::Engine).
class WeightSync {
 public:
  WeightSync(const Topology& topo, Comm* train_comm, const model::ParamLayout& layout,
             int64_t bucket_bytes, bool bf16 = false);
  ~WeightSync();
  WeightSync(const WeightSync&) = delete;
  WeightSync& operator=(const WeightSync&) = delete;

  /// Collective over the world. Training ranks pass their store (nullptr elsewhere); ranks with an
  /// engine pass its unit buffers (empty elsewhere). Returns the stats of this sync.
  SyncStats sync(const ParamStore* source, const std::vector<float*>& engine_units);

#ifdef RLHF_CUDA
  /// The GPU path for colocated ranks (every rank trains on its GPU and owns a GPU engine): each
  /// bucket is one NCCL all-gather (over `nccl`, the NCCL train communicator) of the bf16 shard
  /// copies the trainer's own forward reads, into a device staging buffer, then one strided copy
  /// places every rank's slice in the engine's bf16 device unit; everything on the NCCL stream,
  /// after the trainer's pending optimizer work, with two staging buffers alternating so bucket
  /// k + 1's gather is enqueued behind bucket k's copy without a host wait. nccl may be nullptr
  /// with one train rank (the shard is the unit: a device-to-device copy). The engine's weights
  /// are then bit-identical to the trainer's bf16 weights. SyncStats count bf16 bytes.
  /// Throws rlhf::Error for a disaggregated placement (GPU engines there take the host path).
  SyncStats sync_device(Zero3StoreCuda& source, const std::vector<model::bf16*>& engine_units,
                        Comm* nccl);
  /// reference_all_gather_seconds for sync_device: one ncclAllGather of the same bf16 bytes.
  double reference_device_all_gather_seconds(Comm* nccl, int iters = 3);

  /// The GPU path for disaggregated placements (--gen_ranks_per_node G > 0, GPU engines on their
  /// own ranks), collective over the world (parallel/weight_sync_device.cpp). Per bucket: the
  /// training ranks all-gather the bucket's bf16 shards over `train_nccl` (the NCCL train
  /// communicator, spanning nodes; nullptr with one train rank, whose shard is the unit) into a
  /// device staging buffer, and the first training rank of every node broadcasts it
  /// (ncclBroadcast) over a node-local NCCL communicator {that rank, the node's generation ranks}
  /// into every engine rank's bf16 device units — straight into the unit when the bucket is a
  /// whole unit (or there is one train rank), else into a staging buffer and one strided copy.
  /// Two staging buffers alternate and events order the two NCCL streams, so bucket k + 1's
  /// gather runs while bucket k is broadcast. Tensor-parallel engines: every engine rank receives
  /// the full units (Engine slices them on the device). No host buffer is read or written; the
  /// engines' weights are then bit-identical to the trainer's bf16 weights. Training ranks pass
  /// their store (nullptr on generation-only ranks); engine ranks pass engine_units (one bf16
  /// device buffer of engine_unit_room()[u] elements per unit; empty elsewhere). The node-local
  /// communicator is made at the first call (collective). SyncStats count bf16 bytes per engine
  /// rank, busbw = algbw (every byte crosses from a trainer to an engine). Throws rlhf::Error when
  /// colocated (use sync_device), when !device_sync_node_local(), or without NCCL.
  SyncStats sync_device_disaggregated(Zero3StoreCuda* source,
                                      const std::vector<model::bf16*>& engine_units,
                                      Comm* train_nccl);
#endif
  /// Disaggregated placements: true when every node that holds generation ranks also holds a
  /// training rank, so the device path's broadcast stays inside a node
  /// (sync_device_disaggregated); false when colocated.
  bool device_sync_node_local() const;

  /// LoRA: the adapters' flat buffer (n floats, whole on every training rank: parallel::LoraStore)
  /// into every engine's adapter buffer — the only weights that change during a LoRA run, so the
  /// bytes are ∝ r. Colocated: a local copy on each rank; disaggregated: one MPI_Bcast on the
  /// intercommunicator from the first training rank. Training ranks pass src (dst may be
  /// nullptr when the rank has no engine), generation-only ranks dst. SyncStats::bytes = 4·n,
  /// buckets 1. Collective over the world.
  SyncStats sync_adapters(const float* src, float* dst, int64_t n);

  /// The plain-collective reference for the benchmark: one all-gather of the same total bytes on
  /// the same communicator (train_comm, or the intercommunicator; bf16 mode: half the fp32
  /// bytes, as the sync moves): one untimed call (it touches
  /// the receive buffer, as the engine buffers are touched), then the fastest of `iters` timed
  /// calls, each the slowest rank's seconds. Collective.
  double reference_all_gather_seconds(int iters = 3);
  bool colocated() const {
    return colocated_;
  }
  /// Whether sync() sends bf16 (the constructor's bf16).
  bool bf16() const {
    return bf16_;
  }
  /// Elements each engine unit buffer must hold (see the class comment); the same for host and
  /// device engine buffers.
  const std::vector<int64_t>& engine_unit_room() const {
    return shard_layout_.padded_numels();
  }
  /// engine_unit_room() without building a WeightSync (an engine is made before the sync).
  static std::vector<int64_t> engine_unit_room(const model::ParamLayout& layout, int n_train) {
    return ShardLayout(layout, n_train).padded_numels();
  }
  const std::vector<SyncBucket>& buckets() const {
    return buckets_;
  }

 private:
  void sync_colocated(const ParamStore& source, const std::vector<float*>& engine_units);
  void sync_disaggregated(const ParamStore* source, const std::vector<float*>& engine_units);

  const Topology& topo_;
  Comm* train_comm_;
  model::ParamLayout layout_;
  ShardLayout shard_layout_;
  bool colocated_;
  bool trains_, generates_;
  int n_train_;
  MPI_Comm inter_ = MPI_COMM_NULL;  // disaggregated: train group <-> generation group
  std::vector<int64_t> part_;       // per unit: elements of one train rank's part
  std::vector<SyncBucket> buckets_;
  bool bf16_ = false;
  std::vector<model::bfloat16> send16_[2], recv16_[2];  // bf16: staging per bucket in flight
#ifdef RLHF_CUDA
  DeviceArray<model::bf16> staging_[2];  // sync_device, sync_device_disaggregated
  struct NodeDeviceSync;                 // sync_device_disaggregated's node communicator, events
  std::shared_ptr<NodeDeviceSync> node_sync_;
#endif
};

}  // namespace rlhf::parallel
