// `rlhf bench generate`: decode throughput of the rollout engine on the stories15M shape, next to
// the same run's memory bandwidth (a STREAM-like triad) and sgemm GFLOP/s on the decode GEMM
// shapes (issue 4's targets).
#pragma once

#include <cstdint>
#include <vector>

#include "bench/bench_train.h"
#include "model/config.h"
#include "rollout/kv_cache.h"

namespace rlhf::bench {

struct BenchGenerateOptions {
  /// The model (random weights). max_position_embeddings is raised to prompt_len + the longest
  /// generation when it is smaller (RoPE tables only; no learned positions).
  model::ModelConfig config = stories15m_config();
  /// A real model (any --pretrain format): its config and weights instead of `config` with random
  /// weights ("" = random). Its max_position_embeddings must hold the longest run.
  std::string pretrain;
  int64_t prompt_len = 64;
  int64_t new_tokens = 128;                   ///< per sample, for the fixed-length runs
  std::vector<int64_t> batches = {1, 8, 64};  ///< one fixed-length run per batch size
  /// Ragged run: long_requests requests, at most long_batch decoded at once, each with its own
  /// max length drawn uniformly from [long_min_new_tokens, long_new_tokens]; 0 requests = skip.
  int64_t long_requests = 256;
  int64_t long_batch = 64;
  int64_t long_min_new_tokens = 64;
  int64_t long_new_tokens = 1024;
  /// Long fixed run: long_fixed_batch requests of long_new_tokens each, next to the fixed run of
  /// the same batch at new_tokens (does the rate hold as contexts grow?), in kv_dtype and, for
  /// the ratio between them, in fp32. 0 = skip.
  int64_t long_fixed_batch = 8;
  /// The engine's KV cache element type (--kv_cache_dtype; the CLI's default is fp16).
  rollout::KvDtype kv_dtype = rollout::KvDtype::kFloat16;
  int64_t block_size = 0;  ///< positions per KV block (--kv_block_size; 0 = the CPU default)
  int repeats = 3;         ///< timed repeats of each fixed-length run (the fastest is reported)
  /// Rounds of (fixed run at new_tokens, long run) for the long ratio: the fastest of each side.
  int long_rounds = 3;
  int64_t triad_mb = 256;  ///< bytes of each of the triad's three arrays
  /// Also each fixed-length run on a bf16 engine (--param_dtype bf16; needs oneDNN): rows
  /// {"bench":"generate", "run":"fixed_bf16", ...} and {"bench":"generate_bf16_vs_fp32", batch,
  /// fp32_tokens_per_s, bf16_tokens_per_s, speedup, fp32_step_ms, bf16_step_ms, isa}.
  bool bf16 = false;
  uint64_t seed = 42;
};

/// STREAM-like triad a[i] = b[i] + s·c[i] over three arrays of `bytes_per_array` bytes (fp32), on
/// the current OpenMP threads; best of `reps` after one untimed pass. GB/s with 3 arrays counted
/// (GB = 1e9), as STREAM reports it. Emits {"bench":"triad", ...}.
double bench_triad(int64_t bytes_per_array, int reps, const Emit& emit);

/// sgemm (OpenBLAS, y = x·Wᵀ) and the decode kernel (model::linear_decode_packed_cpu) on every
/// linear of one decode step of `cfg` with `rows` tokens (q, k, v, o, gate, up, down per layer, the
/// LM head), flop-weighted: Σ flops / Σ time. Emits one row per shape; returns the sgemm figure and
/// puts the decode kernel's into *decode_kernel_gflops when given.
double bench_sgemm_decode_shapes(const model::ModelConfig& cfg, int64_t rows, const Emit& emit,
                                 double* decode_kernel_gflops = nullptr);

/// Decode attention alone (model::attention_decode_cpu, fp16 cache) over every layer of `cfg` for
/// `batch` sequences of `positions` cached positions each, in blocks of `block_size` positions
/// handed out in a shuffled order: the fastest of 5 timed steps after an untimed one. Returns the
/// K/V bytes read per second (GB/s) and emits {"bench":"attention_decode", batch, positions,
/// block_size, step_ms, kv_bytes_per_step, GBps, threads}. Throws rlhf::Error on a size < 1.
double bench_attention_decode(const model::ModelConfig& cfg, int64_t batch, int64_t positions,
                              int64_t block_size, const Emit& emit);

/// Runs the fixed-length decode runs (each batch size: that many requests of prompt_len random
/// tokens, new_tokens each, EOS ignored, temperature 1; one untimed warm-up, then the fastest of
/// `repeats` timed runs) and the ragged run (timed once), and emits per run {"bench":"generate",
/// batch, new_tokens, tokens_per_s, decode_tokens_per_s, step_ms, weight_bytes_per_step,
/// kv_bytes_per_step, read_GBps, triad_GBps, ratio_to_triad, decode_gflops_per_s,
/// sgemm_gflops_per_s, ratio_to_sgemm, mean_batch, kv_cache_dtype, ...}; the ragged run adds
/// ratio_to_fixed (its tokens/s over the fixed run's at the same batch); the long fixed runs
/// ("fixed_long": long_rounds rounds of the fixed run at new_tokens then the long run, the
/// fastest of each) add ratio_to_fixed (over that fixed run, same batch and dtype) and, in
/// kv_dtype, ratio_to_fp32 (over the same run with an fp32 cache). With long runs, first
/// bench_attention_decode at their mean context in 16-position blocks and in the engine's
/// (--kv_block_size). One rank only.
void run_bench_generate(const BenchGenerateOptions& opt, const Emit& emit);

}  // namespace rlhf::bench
