// `rlhf bench train|generate|sync --device cuda`: the GPU benchmarks (issue 7), each reported
// against a reference measured in the same run on the same GPU and against the spec sheet:
//  - train: ZeRO-3 steps of the GPU model (Zero3StoreCuda + TransformerCuda), MFU against the
//    spec-sheet bf16 dense peak and against the same run's cuBLASLt GEMM throughput on the model's
//    own GEMM shapes (docs/design.md, "Conventions: benchmarks");
//  - generate: GPU engine decode tokens/s and the HBM bandwidth it achieves (weights + KV bytes
//  read
//    per step / step time), against the spec-sheet HBM bandwidth and a same-run device-to-device
//    copy;
//  - sync: device-to-device weight sync (colocated) busbw against a plain ncclAllGather of the same
//    bf16 bytes.
// FLOPs per token: model::training_flops_per_token (6·N_matmul + 6·L·H·D·T, model/flops.h).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "bench/bench_train.h"
#include "model/config.h"
#include "parallel/comm.h"

namespace rlhf::bench {

/// Spec-sheet figures of a GPU, looked up by its device name (cudaDeviceProp::name): bf16 dense
/// tensor-core TFLOPS (no sparsity) and HBM GB/s. Both 0 for an unknown device (the emulator
/// included); the rows then carry only the same-run ratios.
struct GpuSpec {
  std::string name;
  double bf16_tflops = 0;
  double hbm_GBps = 0;
};
GpuSpec gpu_spec(const std::string& device_name);

/// A ~1B Llama-3.2-1B-like shape: dim 2048, 16 layers, 32 heads, 8 KV heads, hidden 8192, vocab
/// 128256, tied embeddings.
model::ModelConfig shape1b_config();

struct BenchTrainCudaOptions {
  /// (name, shape); default the 135M and ~1B shapes.
  std::vector<std::pair<std::string, model::ModelConfig>> models;
  int64_t tokens_per_step = 16384;
  int64_t seq_len = 1024;
  int64_t micro_batch = 0;  ///< sequences per forward/backward per rank; 0 = all at once
  int64_t steps = 3, warmup = 1;
  bool gradient_checkpointing = false;
  bool adam_offload = false;
  uint64_t seed = 42;
};

/// Runs warmup + steps optimizer steps per model on the current GPU of every rank (collective
/// over host_comm; nccl: the NCCL communicator over the same ranks, nullptr on one rank) and emits
/// {"bench":"train","device":"cuda","gpu":..,"model":..,"ranks":n,"step_s":..,"tokens_per_s":..,
///  "tflops_per_s_per_gpu":..,"peak_tflops":..,"mfu_vs_peak":..,"gemm_tflops_per_s":..,
///  "mfu_vs_gemm":..,"memory_bytes_per_gpu":..,"attention":"cudnn"|"flash"}, after one
///  {"bench":"gemm_cuda",...} row per GEMM
/// shape (the reference).
void run_bench_train_cuda(const BenchTrainCudaOptions& opt, parallel::Comm& host_comm,
                          parallel::Comm* nccl, const Emit& emit);

struct BenchGenerateCudaOptions {
  std::vector<std::pair<std::string, model::ModelConfig>> models;  ///< default 135M and ~1B
  int64_t prompt_len = 64, new_tokens = 128;
  std::vector<int64_t> batches = {1, 8, 64};
  int repeats = 3;
  bool cuda_graphs = true;
  int64_t copy_bytes = int64_t(1) << 30;  ///< buffer of the device-copy reference
  uint64_t seed = 42;
};

/// One rank: per model and batch, the fastest of `repeats` fixed-length runs (after a warm-up) of
/// the GPU engine; emits {"bench":"generate","device":"cuda","gpu":..,"model":..,"batch":..,
/// "decode_tokens_per_s":..,"step_ms":..,"read_GBps":..,"hbm_GBps":..,"ratio_to_hbm":..,
/// "copy_GBps":..,"ratio_to_copy":..,"graphs":..,"skinny_gemm":..,"device_ms_per_step":..,
/// "sampling_ms_per_step":..,"host_ms_per_step":..,"sampling":"device"|"host"} (device: the
/// forwards' GPU time by CUDA events; sampling: the GPU time of the token draws on the device (0
/// when sampling on the host); host: the rest of the step — inputs, the tokens' or the logits'
/// copy, host sampling, scheduling). The largest batch runs a second time with the host sampler
/// ("sampling": "host": every row's logits copied to the host), the others sample on the device.
/// Batches of at most model::kSkinnyMaxRows run twice, on a second engine with the same weights:
/// with the few-row linear kernel (the default) and with cuBLASLt's GEMMs ("skinny_gemm": false).
void run_bench_generate_cuda(const BenchGenerateCudaOptions& opt, const Emit& emit);

struct BenchSyncCudaOptions {
  std::vector<std::pair<std::string, model::ModelConfig>> models;  ///< default 135M and ~1B
  int64_t bucket_bytes = int64_t(64) << 20;
  int iters = 3;
  uint64_t seed = 42;
};

/// GPU ranks (every rank one GPU) on one node, two placements: colocated (every rank trains and
/// owns an engine; WeightSync::sync_device against reference_device_all_gather_seconds) and,
/// with 2+ ranks, disaggregated (the lower ⌈n/2⌉ ranks train, the upper ⌊n/2⌋ are engine ranks;
/// WeightSync::sync_device_disaggregated; no reference measured: allgather_s 0, ratio 0). Emits
/// per placement and model {"bench":"sync","device":"cuda","model":..,"mode":"colocated" |
/// "disaggregated","ranks":n,"train_ranks":..,"engine_ranks":..,"bytes":..,"sync_s":..,
/// "sync_busbw_GBps":..,"allgather_s":..,"allgather_busbw_GBps":..,"ratio":..,"wrong":0} (wrong:
/// engine elements not equal to the bf16 rounding of the weights, summed over ranks).
/// Collective over MPI_COMM_WORLD.
void run_bench_sync_cuda(const BenchSyncCudaOptions& opt, const Emit& emit);

}  // namespace rlhf::bench
