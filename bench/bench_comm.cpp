#include "bench/bench_comm.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "parallel/comm.h"
#include "parallel/mpi_check.h"

namespace rlhf::bench {

using parallel::Comm;
using parallel::ReduceOp;

namespace {

double now_s() {
  using clock = std::chrono::steady_clock;
  return std::chrono::duration<double>(clock::now().time_since_epoch()).count();
}

// Rank r's input at index x of the full buffer: small integers, exact in fp32 and in any sum order.
inline float pattern(int r, int64_t x) {
  return static_cast<float>((r * 7 + x) % 17);
}

// One call of `op` with per-rank count `count` on the bench buffers.
void run_op(Comm& c, const std::string& op, const float* send, float* recv, int64_t count) {
  if (op == "all_gather") {
    c.all_gather(send, recv, count);
  } else if (op == "reduce_scatter") {
    c.reduce_scatter(send, recv, count);
  } else {
    c.all_reduce(send, recv, count);
  }
}

// Fills send for `op`, runs it once and counts wrong elements of recv on this rank.
int64_t check_pass(Comm& c, const std::string& op, float* send, float* recv, int64_t count) {
  const int n = c.size(), me = c.rank();
  const int64_t in = op == "all_gather" ? count : op == "reduce_scatter" ? n * count : count;
  const int64_t out = op == "all_gather" ? n * count : count;
  for (int64_t x = 0; x < in; ++x) send[x] = pattern(me, x);
  std::fill(recv, recv + out, -1.0f);
  run_op(c, op, send, recv, count);
  int64_t wrong = 0;
  for (int64_t i = 0; i < out; ++i) {
    float expect = 0;
    if (op == "all_gather") {
      expect = pattern(static_cast<int>(i / std::max<int64_t>(count, 1)),
                       i % std::max<int64_t>(count, 1));
    } else {
      const int64_t x = op == "reduce_scatter" ? me * count + i : i;
      for (int r = 0; r < n; ++r) expect += pattern(r, x);
    }
    wrong += recv[i] != expect;
  }
  return wrong;
}

}  // namespace

void run_bench_comm(const BenchCommOptions& opts,
                    const std::function<void(const nlohmann::json&)>& emit_row) {
  RLHF_CHECK(opts.min_bytes >= 1 && opts.max_bytes >= opts.min_bytes,
             "bench comm: sizes must satisfy 1 <= -b ({}) <= -e ({})", opts.min_bytes,
             opts.max_bytes);
  RLHF_CHECK(opts.factor >= 2, "bench comm: -f must be >= 2, got {}", opts.factor);
  RLHF_CHECK(opts.iters >= 1 && opts.warmup >= 0 && opts.min_iters >= 1,
             "bench comm: iterations must be >= 1 (got -n {}, min_iters {}) and warm-up >= 0 (got "
             "{})",
             opts.iters, opts.min_iters, opts.warmup);
  for (const auto& op : opts.ops)
    RLHF_CHECK(op == "all_gather" || op == "reduce_scatter" || op == "all_reduce",
               "bench comm: unknown op '{}' (all_gather, reduce_scatter, all_reduce)", op);
  for (const auto& impl : opts.impls)
    RLHF_CHECK(impl == "mpi" || impl == "shm", "bench comm: unknown implementation '{}' (mpi, shm)",
               impl);

  const int n = parallel::comm_size(opts.comm), me = parallel::comm_rank(opts.comm);
  auto emit = [&](const nlohmann::json& row) {
    if (me == 0) emit_row(row);
  };

  // Every implementation on the same communicator.
  std::vector<std::pair<std::string, std::unique_ptr<Comm>>> comms;
  for (const auto& impl : opts.impls) {
    if (impl == "mpi") {
      comms.emplace_back(impl, std::make_unique<parallel::MpiComm>(opts.comm, opts.comm_name));
    } else if (parallel::is_node_local(opts.comm)) {
      parallel::ShmCommOptions so;
      so.chunk_bytes = opts.shm_chunk_bytes;
      comms.emplace_back(impl, std::make_unique<parallel::ShmComm>(opts.comm, opts.comm_name, so));
    } else {
      emit({{"bench", "comm"},
            {"impl", impl},
            {"comm", opts.comm_name},
            {"n", n},
            {"skipped", "the communicator spans several nodes"}});
    }
  }

  // Buffers for the largest row, touched once here (first touch is not timed).
  const int64_t max_elems = opts.max_bytes / 4 + n;
  std::vector<float> send(static_cast<size_t>(max_elems), 0.0f), recv(send.size(), 0.0f);

  for (const auto& op : opts.ops) {
    const bool gather_like = op != "all_reduce";
    for (int64_t s = opts.min_bytes; s <= opts.max_bytes; s *= opts.factor) {
      const int64_t count = gather_like ? s / (4 * n) : s / 4;
      if (count == 0) continue;
      const int64_t bytes = gather_like ? count * n * 4 : count * 4;
      int iters = opts.iters;
      if (opts.max_bytes_per_row > 0)
        iters = static_cast<int>(
            std::clamp<int64_t>(opts.max_bytes_per_row / bytes, opts.min_iters, opts.iters));
      for (auto& [impl, c] : comms) {
        int64_t wrong = opts.check ? check_pass(*c, op, send.data(), recv.data(), count) : 0;
        for (int i = 0; i < opts.warmup; ++i) run_op(*c, op, send.data(), recv.data(), count);
        MPI_CHECK(MPI_Barrier(opts.comm));
        const double t0 = now_s();
        for (int i = 0; i < iters; ++i) run_op(*c, op, send.data(), recv.data(), count);
        const double t = (now_s() - t0) / iters;
        double t_sum = 0, t_max = 0;
        int64_t wrong_sum = 0;
        MPI_CHECK(MPI_Allreduce(&t, &t_sum, 1, MPI_DOUBLE, MPI_SUM, opts.comm));
        MPI_CHECK(MPI_Allreduce(&t, &t_max, 1, MPI_DOUBLE, MPI_MAX, opts.comm));
        MPI_CHECK(MPI_Allreduce(&wrong, &wrong_sum, 1, MPI_INT64_T, MPI_SUM, opts.comm));
        const double t_mean = t_sum / n;
        const double algbw = static_cast<double>(bytes) / t_mean * 1e-9;
        const double factor = n == 1 ? 0.0 : gather_like ? (n - 1.0) / n : 2.0 * (n - 1.0) / n;
        emit({{"bench", "comm"},
              {"op", op},
              {"impl", impl},
              {"comm", opts.comm_name},
              {"n", n},
              {"type", "float32"},
              {"bytes", bytes},
              {"count", count},
              {"iters", iters},
              {"time_us", t_mean * 1e6},
              {"time_max_us", t_max * 1e6},
              {"algbw_GBps", algbw},
              {"busbw_GBps", algbw * factor},
              {"wrong", opts.check ? nlohmann::json(wrong_sum) : nlohmann::json("N/A")}});
      }
    }
  }
}

std::string bench_comm_header() {
  return fmt::format(
      "# time: per-rank average over iterations, then mean over ranks\n"
      "#{:>11} {:>11} {:>7} {:>14} {:>4} {:>11} {:>8} {:>8} {:>7}\n"
      "#{:>11} {:>11} {:>7} {:>14} {:>4} {:>11} {:>8} {:>8} {:>7}\n",
      "size", "count", "type", "op", "impl", "time", "algbw", "busbw", "#wrong", "(B)",
      "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "");
}

std::string bench_comm_row_text(const nlohmann::json& row) {
  if (row.contains("skipped"))
    return fmt::format("# {} on {}: skipped ({})\n", row.value("impl", std::string("?")),
                       row.value("comm", std::string("?")), row.value("skipped", std::string()));
  std::string wrong = row["wrong"].is_number() ? std::to_string(row["wrong"].get<int64_t>())
                                               : row["wrong"].get<std::string>();
  return fmt::format(" {:>11} {:>11} {:>7} {:>14} {:>4} {:>11.1f} {:>8.2f} {:>8.2f} {:>7}\n",
                     row["bytes"].get<int64_t>(), row["count"].get<int64_t>(),
                     row["type"].get<std::string>(), row["op"].get<std::string>(),
                     row["impl"].get<std::string>(), row["time_us"].get<double>(),
                     row["algbw_GBps"].get<double>(), row["busbw_GBps"].get<double>(), wrong);
}

}  // namespace rlhf::bench
