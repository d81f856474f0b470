// `rlhf bench comm`: an nccl-tests-style benchmark of the communicator layer (parallel/comm.h).
//
// For every size from min_bytes to max_bytes (×factor), every op (all_gather, reduce_scatter,
// all_reduce) and every implementation (MpiComm and ShmComm, made on the same MPI communicator in
// the same run): warm-up, a check pass against known values (#wrong), then timed iterations.
//
// Definitions (nccl-tests, PERFORMANCE.md; GB = 1e9 bytes):
//  - bytes (S): all_gather and reduce_scatter: the whole gathered / scattered buffer,
//    size·count·elem; all_reduce: count·elem. A size not divisible by size·elem is rounded down to
//    whole elements per rank (the row reports the bytes actually moved).
//  - time_us: per rank, the wall time of `iters` back-to-back calls divided by iters; then the MEAN
//    over ranks (as nccl-tests' default); time_max_us is the max over ranks.
//  - algbw = S / time; busbw = algbw · (n−1)/n for all_gather and reduce_scatter, · 2(n−1)/n for
//    all_reduce (0 for n = 1).
//  - wrong: elements that differ from the expected value in the check pass, summed over ranks.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace rlhf::bench {

/// Options of the collective benchmark (nccl-tests flag letters in brackets).
struct BenchCommOptions {
  MPI_Comm comm = MPI_COMM_WORLD;   ///< communicator to benchmark (every rank calls run_bench_comm)
  std::string comm_name = "world";  ///< name in the rows ("comm")
  int64_t min_bytes = 1024;         ///< [-b] smallest size
  int64_t max_bytes = 256ll << 20;  ///< [-e] largest size
  int factor = 4;                   ///< [-f] size multiplier between rows (>= 2)
  int warmup = 3;                   ///< [-w] untimed calls per row
  int iters = 20;                   ///< [-n] timed calls per row (at most; see max_bytes_per_row)
  /// Timed calls per row are reduced to max(min_iters, max_bytes_per_row / S) so that the large
  /// sizes do not dominate the run (0 = always `iters`).
  int64_t max_bytes_per_row = int64_t{4} << 30;
  int min_iters = 3;
  bool check = true;  ///< [-c] run the check pass
  std::vector<std::string> ops = {"all_gather", "reduce_scatter", "all_reduce"};
  /// Implementations: "mpi", "shm" (shm is skipped with a row {"skipped": ...} when the
  /// communicator spans nodes).
  std::vector<std::string> impls = {"mpi", "shm"};
  int64_t shm_chunk_bytes = int64_t{1} << 20;  ///< ShmCommOptions::chunk_bytes
};

/// Runs the benchmark; collective over opts.comm. Calls emit_row on rank 0 of opts.comm only, once
/// per (size, op, impl) row, with
/// {"bench":"comm","op":"all_gather","impl":"shm","comm":"world","n":2,"type":"float32",
///  "bytes":S,"count":per-rank count,"iters":k,"time_us":mean,"time_max_us":max,
///  "algbw_GBps":...,"busbw_GBps":...,"wrong":0}.
/// Rows are grouped by op, then size, then implementation, so MPI and shm rows of one size are
/// adjacent. Throws rlhf::Error on invalid options (same on every rank).
void run_bench_comm(const BenchCommOptions& opts,
                    const std::function<void(const nlohmann::json&)>& emit_row);

/// The human table's header lines (nccl-tests columns: size count type op impl time algbw busbw
/// #wrong), ending in '\n'.
std::string bench_comm_header();

/// One line of the human table for a row emitted by run_bench_comm, ending in '\n'.
std::string bench_comm_row_text(const nlohmann::json& row);

}  // namespace rlhf::bench
