// `rlhf bench train`: training throughput against the same run's OpenBLAS sgemm on the model's own
// GEMM shapes.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>

#include "model/config.h"
#include "parallel/comm.h"
#include "parallel/train_model.h"

namespace rlhf::bench {

/// One JSON object per result row; rank 0 prints it.
using Emit = std::function<void(const nlohmann::json&)>;

/// The stories15M shape (llama2.c): dim 288, 6 layers, 6 heads, hidden 768, vocab 32000, seq 256,
/// tied classifier, interleaved RoPE.
model::ModelConfig stories15m_config();

struct BenchTrainOptions {
  model::ModelConfig config = stories15m_config();
  int64_t tokens_per_step = 4096;  ///< global tokens per optimizer step
  int64_t seq_len = 256;
  int64_t micro_batch = 0;  ///< sequences per forward/backward per rank; 0 = all at once
  int64_t steps = 3, warmup = 1;
  bool gradient_checkpointing = false;
  int zero_stage = 3;
  bool adam_offload = false;
  bool compare_zero0 = true;  ///< on > 1 rank with zero_stage 3, also run ZeRO-0 and report ratios
  /// Also train in bf16 (--param_dtype bf16; needs oneDNN): its row and the bf16/fp32 ratio.
  bool bf16 = false;
  uint64_t seed = 42;
};

/// Times OpenBLAS sgemm on every GEMM of one training step of `cfg` with `rows` tokens per
/// forward (forward y = x·Wᵀ, backward dx = dy·W and dW = dyᵀ·x of each linear, the LM head
/// included) and returns the flop-weighted GFLOP/s (Σ flops / Σ time). Emits one row per shape.
double bench_sgemm_model_shapes(const model::ModelConfig& cfg, int64_t rows, const Emit& emit);

/// bench_sgemm_model_shapes in OpenBLAS sgemm (bf16 false; rows "sgemm") or oneDNN's bf16 matmul
/// on operands rounded beforehand (bf16 true; rows "gemm_bf16"; throws rlhf::Error without oneDNN).
double bench_gemm_model_shapes(const model::ModelConfig& cfg, int64_t rows, const Emit& emit,
                               bool bf16);

/// The median step of a timed training run: wall seconds of the slowest rank, and the seconds that
/// rank's step spent inside `comm`'s collectives. Where that step's seconds went on rank 0 (CPU
/// runs; model/op_clock.h): gemm_s in the linear layers' GEMMs, attention_s in the attention
/// kernels, round_s rounding to bf16 and back, optimizer_s in clip_and_step (the gradient norm
/// and AdamW, ZeRO's collectives included); the rest is everything else (norms, activations,
/// losses, embedding, gathers).
struct TrainStepTime {
  double step_s = 0, comm_s = 0;
  double gemm_s = 0, attention_s = 0, round_s = 0, optimizer_s = 0;
};

/// The timed loop of the training benchmarks (CPU and GPU): warmup + steps optimizer steps of
/// next-token training of `net` on random tokens — per rank per_rank sequences of T tokens in
/// micro-batches of mb, dlp = −1/(seqs·T), clip 1.0, AdamW at lr — each starting at a barrier of
/// `comm` and ending with finish_step() when given (a GPU run synchronises its device there).
/// Collective over comm.
TrainStepTime time_train_steps(parallel::TrainModel& net, const model::ModelConfig& cfg, int64_t T,
                               int64_t seqs, int64_t per_rank, int64_t mb, int64_t warmup,
                               int64_t steps, double lr, uint64_t seed, parallel::Comm& comm,
                               const std::function<void()>& finish_step = {});

/// Runs warmup + steps optimizer steps of next-token training on random tokens (collective over
/// `comm`, the data-parallel group) and emits {"bench":"train", step_s (median of the slowest
/// rank), comm_s (time inside collectives, i.e. not overlapped with compute), where rank 0's
/// median step went (gemm_s, attention_s, bf16_round_s, optimizer_s, other_s: TrainStepTime),
/// attention ("onednn_bf16": the bf16 tiles of model/ops/attention_bf16.h, else "fp32_kernels"),
/// tokens_per_s,
/// gflops_per_s, sgemm_gflops_per_s (same run, per rank), ratio_to_sgemm (per rank), memory per
/// rank, ...}. FLOPs per token: model::training_flops_per_token (6·N_matmul + 6·L·H·D·T).
/// On > 1 rank with zero_stage 3 and compare_zero0, also runs ZeRO-0 and emits
/// {"bench":"train_zero3_vs_zero0", step_time_ratio, memory_per_rank_ratio, ...}.
/// With bf16, also the bf16 step: {"bench":"train", "param_dtype":"bf16", ...,
/// bf16_gemm_gflops_per_s (oneDNN bf16 matmul on the model's shapes, same run), ratio_to_gemm, isa,
/// onednn_impl} and
/// {"bench":"train_bf16_vs_fp32", fp32_tokens_per_s, bf16_tokens_per_s, speedup, isa}.
void run_bench_train(const BenchTrainOptions& opt, parallel::Comm& comm, const Emit& emit);

}  // namespace rlhf::bench
