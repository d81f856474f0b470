// `rlhf bench gemm`: the GEMMs of a linear layer in three implementations on the same machine and
// threads — OpenBLAS sgemm (the fp32 reference of every other CPU benchmark), oneDNN's fp32 matmul,
// and oneDNN's bf16 matmul (bf16 operands, fp32 accumulation and output; model/ops/matmul_bf16.h) —
// at a model's projection and LM-head shapes, with the CPU's ISA and the kernel oneDNN chose.
#pragma once

#include <cstdint>
#include <string>

#include "bench/bench_sync.h"
#include "bench/bench_train.h"
#include "model/config.h"

namespace rlhf::bench {

struct BenchGemmOptions {
  std::string model = "135M";  ///< the name in the rows
  /// Shapes: hidden C, intermediate F, heads H·D, vocab V (default SmolLM-135M's: 576, 1536, 576,
  /// 49152).
  model::ModelConfig config = shape135m_config();
  int64_t rows = 2048;       ///< M: tokens per GEMM
  int64_t seq_len = 256;     ///< attention: tokens per sample (rows / seq_len samples)
  bool lm_head = true;       ///< also the LM head (C -> V; forward only: its flops dwarf the rest)
  double min_seconds = 0.5;  ///< timed repeats of one GEMM until this long (at least one)
};

/// Times, for each distinct linear shape (IC -> OC) of options.config — C -> H·D (q_proj),
/// H·D -> C (o_proj), C -> F (gate/up_proj), F -> C (down_proj), and with lm_head C -> V (forward
/// only) — the forward y = x·Wᵀ (M = rows, N = OC, K = IC), backward dx = dy·W (N = IC, K = OC)
/// and dW += dyᵀ·x (M = OC, N = IC, K = rows) in each implementation, after one untimed call.
/// Emits per GEMM and implementation {"bench":"gemm", model, linear, gemm, M, N, K, impl
/// ("openblas_sgemm" | "onednn_f32" | "onednn_bf16"), onednn_impl (impl_info_str, "" for
/// OpenBLAS), time_us, gflops_per_s, ratio_to_sgemm, isa, threads}, the bf16 rows also
/// convert_us (rounding that GEMM's fp32 operands to bf16, what the fp32 adapters pay on top), then
/// per implementation {"bench":"gemm_summary", impl, gflops_per_s (Σ flops / Σ time over the
/// rows), ratio_to_sgemm, isa, onednn_version}. Without oneDNN only the sgemm rows are emitted.
/// Then per shape the engine's batch-1 decode kernel (model/ops/linear_decode.h) over fp32 and
/// bf16 packed weights: {"bench":"gemm_decode", linear, M = 1, N, K, impl ("packed_fp32" |
/// "packed_bf16"), time_us, weight_GBps (packed weight bytes / time), speedup_vs_fp32, isa,
/// threads}. Then the training attention at the model's heads over rows / seq_len samples of
/// seq_len tokens, the fp32 kernels (model/ops/attention.h) against the bf16-product ones
/// (model/ops/attention_bf16.h; without oneDNN only the first): {"bench":"gemm_attention", B, T,
/// H, Hkv, D, impl ("sgemm_fp32" | "onednn_bf16"), forward_us, backward_us, gflops_per_s (the
/// causal half's flops, forward + backward), speedup_vs_fp32, isa, threads}.
void run_bench_gemm(const BenchGemmOptions& opt, const Emit& emit);

}  // namespace rlhf::bench
