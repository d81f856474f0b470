// `rlhf bench sync`: weight-sync time and bandwidth (parallel/weight_sync.h) next to a plain
// all-gather of the same bytes on the same communicator in the same run (issue 4's target: sync
// busbw >= 80% of the plain all-gather's).
//
// Per model shape and placement mode (colocated G = 0: every rank trains and owns an engine;
// disaggregated: the upper half of the ranks are generation ranks, when there are at least 2):
// random trainer shards (ZeRO-3 style, one part of every unit per train rank), engine unit buffers
// on the generating ranks, one untimed sync, then `iters` timed syncs, then the plain all-gather
// (WeightSync::reference_all_gather_seconds: one untimed call, then `iters` timed); the fastest of
// each is reported. After the timed syncs every engine buffer is compared with the
// expected values ("wrong" = differing elements summed over ranks; 0 when the sync is right).
//
// Definitions (GB = 1e9 bytes): bytes = the padded fp32 units each engine rank receives; time = the
// slowest rank's wall time; algbw = bytes / time; busbw = algbw · (n−1)/n with n = train ranks
// (colocated, nccl-tests' all-gather factor) or algbw (disaggregated: every byte crosses from a
// trainer to an engine). The reference gets the same factor, so ratio = sync busbw / reference
// busbw = reference time / sync time.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "bench/bench_train.h"
#include "model/config.h"
#include "parallel/comm.h"

namespace rlhf::bench {

/// The 135M shape of issue 4 (SmolLM-135M-like): dim 576, 30 layers, 9 heads, 3 KV heads,
/// hidden 1536, vocab 49152, tied embeddings.
model::ModelConfig shape135m_config();

struct BenchSyncOptions {
  /// (name, shape) of the models to sync; default the stories15M and the 135M shapes.
  std::vector<std::pair<std::string, model::ModelConfig>> models = {
      {"stories15M", stories15m_config()}, {"135M", shape135m_config()}};
  int64_t bucket_bytes = int64_t(64) << 20;  ///< --sync_bucket_mb's default
  int iters = 3;                             ///< timed rounds (the fastest is reported)
  /// Placement modes: 0 = colocated; G > 0 = disaggregated with G generation ranks on one
  /// simulated node holding every rank (skipped with a row {"skipped": ...} when G >= ranks).
  /// Empty = {0, ranks / 2} (just {0} on one rank).
  std::vector<int> gen_ranks = {};
  parallel::CommKind comm_kind = parallel::CommKind::kAuto;  ///< train_comm's implementation
  /// --param_dtype bf16 on the CPU: the weights travel as bf16 (WeightSync's bf16 mode, half the
  /// bytes) and "wrong" counts engine elements that differ from the bf16 rounding of the weights.
  bool bf16 = false;
  uint64_t seed = 42;
};

/// Runs the benchmark; collective over MPI_COMM_WORLD (builds a Topology per mode). Calls
/// emit_row on world rank 0 once per (mode, model) with
/// {"bench":"sync","model":"135M","mode":"colocated","ranks":n,"train_ranks":t,"engines":e,
///  "comm":"shm","dtype":"fp32"|"bf16","bucket_bytes":B,"buckets":k,"bytes":S,"params":P,"iters":i,
///  "sync_s":..,"sync_algbw_GBps":..,"sync_busbw_GBps":..,"allgather_s":..,
///  "allgather_busbw_GBps":..,"ratio":..,"wrong":0}, or {"bench":"sync","mode":..,"skipped":why}.
/// Throws rlhf::Error on invalid options (same on every rank).
void run_bench_sync(const BenchSyncOptions& opts, const Emit& emit_row);

/// One human-readable line for a row emitted by run_bench_sync.
std::string bench_sync_row_text(const nlohmann::json& row);

}  // namespace rlhf::bench
