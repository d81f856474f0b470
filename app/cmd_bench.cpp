// `rlhf bench [train|generate|comm|sync|rl|packing|partial|all]`: benchmarks as JSON lines on
// stdout (rank 0), each row also in the log as a human-readable line.
#include <mpi.h>

#include <algorithm>
#include <fstream>
#include <iostream>

#include "app/commands.h"
#include "app/param_dtype.h"
#include "app/runtime.h"
#include "bench/bench_comm.h"
#include "bench/bench_cuda.h"
#include "bench/bench_gemm.h"
#include "bench/bench_generate.h"
#include "bench/bench_packing.h"
#include "bench/bench_partial.h"
#include "bench/bench_rl.h"
#include "bench/bench_sync.h"
#include "bench/bench_train.h"
#include "core/cuda_check.h"
#include "core/error.h"
#include "core/log.h"
#include "io/model_config_file.h"

namespace rlhf::app {

int run_bench(const BenchArgs& args) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const int threads = parallel::configure_threads(args.parallel.threads);
  std::unique_ptr<std::ofstream> out;
  if (rank == 0 && !args.output.empty()) {
    out = std::make_unique<std::ofstream>(args.output, std::ios::app);
    RLHF_CHECK(out->good(), "--output {}: cannot open for appending", args.output);
  }
  const bench::Emit emit = [&](const nlohmann::json& row) {
    if (rank != 0) return;
    const std::string line = row.dump();
    std::cout << line << std::endl;
    if (out) *out << line << std::endl;
  };
  // --device: the GPU variants of train, generate and sync (bench/bench_cuda.h).
  const bool cuda = parallel::resolve_device(args.parallel.device) == parallel::Device::kCuda;
  int all_cuda = cuda ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &all_cuda, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  RLHF_CHECK(all_cuda == (cuda ? 1 : 0), "--device {}: some ranks found a GPU and others did not",
             args.parallel.device);
  std::vector<std::pair<std::string, model::ModelConfig>> gpu_models;
  if (cuda) {
    parallel::select_node_local_cuda_device(MPI_COMM_WORLD);
    parallel::use_attention_implementation(args.parallel.attn_implementation);
    LOG0_INFO("bench: device cuda ({})", cuda_device_summary());
    if (!args.model_config.empty())
      gpu_models.emplace_back(args.model_config, io::load_model_config_file(args.model_config));
  }
  if (!cuda)
    parallel::use_cpu_attention_implementation(args.parallel.attn_implementation,
                                               cpu_bf16(args.parallel, false));
  auto wants = [&](const char* s) {
    for (const auto& x : args.suites)
      if (x == s || x == "all") return true;
    return false;
  };
  if (wants("comm")) {
    bench::BenchCommOptions o;
    o.comm = MPI_COMM_WORLD;
    o.comm_name = "world";
    o.min_bytes = args.min_bytes;
    o.max_bytes = args.max_bytes;
    o.factor = static_cast<int>(args.step_factor);
    o.iters = static_cast<int>(args.iters);
    LOG0_INFO("bench comm: {}", bench::bench_comm_header());
    bench::run_bench_comm(o, [&](const nlohmann::json& row) {
      emit(row);
      LOG0_INFO("bench comm: {}", bench::bench_comm_row_text(row));
    });
  }
  // The run shape both training benchmarks (CPU and GPU) take from the flags.
  const auto set_train_run = [&](auto& o) {
    o.tokens_per_step = args.tokens_per_step;
    o.seq_len = args.seq_len;
    o.micro_batch = args.micro_train_batch_size;
    o.steps = args.steps;
    o.warmup = args.warmup;
    o.gradient_checkpointing = args.zero.gradient_checkpointing;
    o.adam_offload = args.zero.adam_offload;
    o.seed = static_cast<uint64_t>(args.common.seed);
  };
  if (wants("train") && cuda) {
    bench::BenchTrainCudaOptions o;
    o.models = gpu_models;
    set_train_run(o);
    auto host = parallel::make_comm(MPI_COMM_WORLD, "train_comm");
    auto nccl = host->size() > 1
                    ? parallel::make_comm(MPI_COMM_WORLD, "train_comm_nccl",
                                          parallel::CommKind::kNccl, {}, args.parallel.nccl_timeout)
                    : nullptr;
    bench::run_bench_train_cuda(o, *host, nccl.get(), [&](const nlohmann::json& row) {
      emit(row);
      if (row["bench"] == "train")
        LOG0_INFO(
            "bench train (cuda): {} | {} GPUs | step {:.3f}s | {:.0f} tok/s | {:.1f} TFLOP/s per "
            "GPU | MFU {:.1f}% of peak {:.0f} | {:.2f} x cuBLASLt GEMM ({:.1f} TFLOP/s)",
            row["model"].get<std::string>(), row["ranks"].get<int>(), row["step_s"].get<double>(),
            row["tokens_per_s"].get<double>(), row["tflops_per_s_per_gpu"].get<double>(),
            100 * row["mfu_vs_peak"].get<double>(), row["peak_tflops"].get<double>(),
            row["mfu_vs_gemm"].get<double>(), row["gemm_tflops_per_s"].get<double>());
    });
  }
  if (wants("train") && !cuda) {
    bench::BenchTrainOptions o;
    if (!args.model_config.empty()) o.config = io::load_model_config_file(args.model_config);
    set_train_run(o);
    o.zero_stage = args.zero.zero_stage;
    o.bf16 = cpu_bf16(args.parallel, false);  // also the bf16 step, next to fp32
    const parallel::CommKind kind = parallel::comm_kind_from_name(args.parallel.comm_backend);
    auto comm = parallel::make_comm(MPI_COMM_WORLD, "train_comm", kind);
    LOG0_INFO("bench train: {} rank(s) x {} threads", comm->size(), threads);
    bench::run_bench_train(o, *comm, [&](const nlohmann::json& row) {
      emit(row);
      if (row["bench"] == "train")
        LOG0_INFO(
            "bench train: {} | zero {} | {} ranks | step {:.3f}s (comm {:.3f}s) | {:.0f} tok/s | "
            "{:.1f} GFLOP/s per rank = {:.2f} x sgemm ({:.1f}) | step = GEMM {:.2f}s + attention "
            "{:.2f}s ({}) + bf16 rounding {:.2f}s + clip/AdamW {:.2f}s + rest {:.2f}s",
            row["param_dtype"].get<std::string>(), row["zero_stage"].get<int>(),
            row["ranks"].get<int>(), row["step_s"].get<double>(), row["comm_s"].get<double>(),
            row["tokens_per_s"].get<double>(), row["gflops_per_s_per_rank"].get<double>(),
            row["ratio_to_sgemm"].get<double>(), row["sgemm_gflops_per_s"].get<double>(),
            row["gemm_s"].get<double>(), row["attention_s"].get<double>(),
            row["attention"].get<std::string>(), row["bf16_round_s"].get<double>(),
            row["optimizer_s"].get<double>(), row["other_s"].get<double>());
    });
  }
  // --gen_batches, for both generate benchmarks (CPU and GPU).
  std::vector<int64_t> gen_batches;
  for (const std::string& b : split_commas(args.gen_batches)) {
    size_t used = 0;
    int64_t v = 0;
    try {
      v = std::stoll(b, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != b.size() || v < 1)
      throw UsageError(
          fmt::format("--gen_batches {}: '{}' is not a batch size >= 1", args.gen_batches, b));
    gen_batches.push_back(v);
  }
  if (wants("generate") && cuda) {
    bench::BenchGenerateCudaOptions o;
    o.models = gpu_models;
    o.batches = gen_batches;
    o.seed = static_cast<uint64_t>(args.common.seed);
    bench::run_bench_generate_cuda(o, [&](const nlohmann::json& row) {
      emit(row);
      if (row["bench"] == "generate")
        LOG0_INFO(
            "bench generate (cuda): {} | batch {} | {:.0f} tok/s | {:.3f} ms/step (forward "
            "{:.3f} + sampling {:.3f} on the GPU, host {:.3f}; sampled on the {}) | {:.0f} GB/s "
            "read = {:.1f}% of HBM {:.0f} GB/s, {:.2f} x device copy",
            row["model"].get<std::string>(), row["batch"].get<int64_t>(),
            row["decode_tokens_per_s"].get<double>(), row["step_ms"].get<double>(),
            row["device_ms_per_step"].get<double>(), row["sampling_ms_per_step"].get<double>(),
            row["host_ms_per_step"].get<double>(), row["sampling"].get<std::string>(),
            row["read_GBps"].get<double>(), 100 * row["ratio_to_hbm"].get<double>(),
            row["hbm_GBps"].get<double>(), row["ratio_to_copy"].get<double>());
    });
  }
  if (wants("generate") && !cuda) {
    bench::BenchGenerateOptions o;
    if (!args.model_config.empty()) o.config = io::load_model_config_file(args.model_config);
    o.seed = static_cast<uint64_t>(args.common.seed);
    o.kv_dtype = rollout::kv_dtype_from_string(args.kv_cache_dtype);
    o.block_size = args.kv_block_size;
    o.pretrain = args.pretrain;
    o.batches = gen_batches;
    o.long_requests = args.gen_long_requests;
    o.long_fixed_batch = args.gen_long_fixed_batch;
    o.bf16 = cpu_bf16(args.parallel, false);  // also the fixed runs on a bf16 engine
    LOG0_INFO("bench generate: {} threads per rank", threads);
    bench::run_bench_generate(o, emit);
  }
  if (wants("sync") && cuda) {
    bench::BenchSyncCudaOptions o;
    o.models = gpu_models;
    o.seed = static_cast<uint64_t>(args.common.seed);
    bench::run_bench_sync_cuda(o, [&](const nlohmann::json& row) {
      emit(row);
      LOG0_INFO(
          "bench sync (cuda): {} | {} | {} GPUs | {:.1f} MB in {:.4f}s | busbw {:.1f} GB/s = "
          "{:.2f} x ncclAllGather ({:.1f} GB/s) | wrong {}",
          row["model"].get<std::string>(), row["mode"].get<std::string>(), row["ranks"].get<int>(),
          row["bytes"].get<int64_t>() / 1e6, row["sync_s"].get<double>(),
          row["sync_busbw_GBps"].get<double>(), row["ratio"].get<double>(),
          row["allgather_busbw_GBps"].get<double>(), row["wrong"].get<int64_t>());
    });
  }
  if (wants("sync") && !cuda) {
    bench::BenchSyncOptions o;
    o.seed = static_cast<uint64_t>(args.common.seed);
    o.comm_kind = parallel::comm_kind_from_name(args.parallel.comm_backend);
    o.bf16 = cpu_bf16(args.parallel, false);  // bf16 transfers, as a bf16 run's sync
    bench::run_bench_sync(o, [&](const nlohmann::json& row) {
      emit(row);
      LOG0_INFO("bench sync: {}", bench::bench_sync_row_text(row));
    });
  }
  // gemm (minutes where the CPU emulates bf16) and rl (minutes of GRPO steps): only when named.
  if (std::find(args.suites.begin(), args.suites.end(), "gemm") != args.suites.end()) {
    bench::BenchGemmOptions o;
    if (!args.model_config.empty()) {
      o.model = args.model_config;
      o.config = io::load_model_config_file(args.model_config);
    }
    o.seq_len = args.seq_len;
    bench::run_bench_gemm(o, emit);
  }
  if (std::find(args.suites.begin(), args.suites.end(), "packing") != args.suites.end()) {
    bench::BenchPackingOptions o;
    if (!args.model_config.empty()) o.config = io::load_model_config_file(args.model_config);
    if (args.micro_train_batch_size > 0) o.micro_batch = args.micro_train_batch_size;
    o.samples = args.packing_bench_samples;
    o.len_lo = static_cast<int64_t>(args.packing_bench_len[0]);
    o.len_hi = static_cast<int64_t>(args.packing_bench_len[1]);
    o.steps = args.steps;
    o.seed = static_cast<uint64_t>(args.common.seed);
    bench::run_bench_packing(o, [&](const nlohmann::json& row) {
      emit(row);
      LOG0_INFO(
          "bench packing: {} samples of {}-{} tokens ({} real) | padded: {} micro-batches, {} "
          "tokens, {:.0f} tok/s | packed: {} micro-batches of <= {} tokens, {:.0f} tok/s | "
          "{:.2f}x",
          row["samples"].get<int64_t>(), row["len_lo"].get<int64_t>(), row["len_hi"].get<int64_t>(),
          row["real_tokens"].get<int64_t>(), row["padded_micro_batches"].get<int64_t>(),
          row["padded_tokens"].get<int64_t>(), row["padded_tokens_per_s"].get<double>(),
          row["packed_micro_batches"].get<int64_t>(), row["packed_budget"].get<int64_t>(),
          row["packed_tokens_per_s"].get<double>(), row["speedup"].get<double>());
    });
  }
  if (std::find(args.suites.begin(), args.suites.end(), "partial") != args.suites.end()) {
    bench::BenchPartialOptions o;
    if (!args.model_config.empty()) o.config = io::load_model_config_file(args.model_config);
    o.seed = static_cast<uint64_t>(args.common.seed);
    o.cuda = cuda;
    bench::run_bench_partial(o, [&](const nlohmann::json& row) {
      emit(row);
      LOG0_INFO(
          "bench partial: {} samples, one of {} new tokens among {} | synchronous {:.3f}s/step "
          "(cpu {:.3f}s) | --partial_rollout {:.3f}s/step (cpu {:.3f}s; prefill {:.3f}s of {} "
          "tokens, {:.1f} samples continued on kept KV) = {:.2f}x wall, {:.2f}x cpu | "
          "--partial_rollout_kv recompute {:.3f}s/step (prefill {:.3f}s of {} tokens) = {:.2f}x "
          "wall, {:.2f}x cpu | the straggler's tail alone is {:.3f}s: {:.2f}x without it | {:.1f} "
          "samples carried, {:.1f} interrupted a step, {} dropped as stale",
          row["samples"].get<int64_t>(), row["long_tokens"].get<int64_t>(),
          row["short_tokens"].get<int64_t>(), row["sync_step_s"].get<double>(),
          row["sync_step_cpu_s"].get<double>(), row["partial_step_s"].get<double>(),
          row["partial_step_cpu_s"].get<double>(), row["partial_prefill_s"].get<double>(),
          row["partial_prefill_tokens"].get<int64_t>(),
          row["partial_kv_resumed_mean"].get<double>(), row["ratio"].get<double>(),
          row["ratio_cpu"].get<double>(), row["partial_recompute_step_s"].get<double>(),
          row["partial_recompute_prefill_s"].get<double>(),
          row["partial_recompute_prefill_tokens"].get<int64_t>(),
          row["ratio_recompute"].get<double>(), row["ratio_recompute_cpu"].get<double>(),
          row["sync_tail_s"].get<double>(), row["ratio_no_tail"].get<double>(),
          row["carried_mean"].get<double>(), row["interrupted_mean"].get<double>(),
          row["dropped"].get<int64_t>());
    });
  }
  if (std::find(args.suites.begin(), args.suites.end(), "rl") != args.suites.end()) {
    bench::BenchRlOptions o;
    if (!args.model_config.empty()) o.config = io::load_model_config_file(args.model_config);
    o.seed = static_cast<uint64_t>(args.common.seed);
    o.new_tokens = args.rl_new_tokens;
    o.prompts_per_step = args.rl_prompts;
    o.samples_per_prompt = args.rl_samples_per_prompt;
    o.steps = args.rl_steps;
    bench::run_bench_rl(o, [&](const nlohmann::json& row) {
      emit(row);
      if (row["bench"] == "rl_decode")
        LOG0_INFO(
            "bench rl: decode {:.2f} ms a step ({:.0f} steps a rollout), {:.1f} MB read a step "
            "at {:.1f} GB/s = {:.2f}x the bytes model (triad {:.1f} GB/s)",
            row["step_ms"].get<double>(), row["decode_steps"].get<double>(),
            row["read_bytes_per_step"].get<double>() / 1e6, row["read_GBps"].get<double>(),
            row["ratio_to_bytes_model"].get<double>(), row["triad_GBps"].get<double>());
      else if (row["bench"] == "rl_phase")
        LOG0_INFO("bench rl: {:8s} {:7.3f}s {:5.1f}% (comm {:.3f}s) | {:.2f} GFLOP/s per rank",
                  row["phase"].get<std::string>(), row["seconds"].get<double>(),
                  100 * row["share"].get<double>(), row["comm_s"].get<double>(),
                  row["gflops_per_s_per_rank"].get<double>());
      else if (row["bench"] == "rl_async")
        LOG0_INFO(
            "bench rl: {} on 1 trainer + 1 generation rank | sync {:.2f}s/step | async "
            "{:.2f}s/step ({:.2f}x, {:.2f}x with generation fully hidden; trainers waited {:.2f}s "
            "a step) | sync gen {:.2f}s, trainer {:.2f}s",
            row["shape"].get<std::string>(), row["sync_step_s"].get<double>(),
            row["async_step_s"].get<double>(), row["speedup"].get<double>(),
            row["speedup_full_overlap"].get<double>(), row["async_wait_s"].get<double>(),
            row["sync_gen_s"].get<double>(), row["sync_trainer_s"].get<double>());
      else if (row["bench"] == "rl_filter")
        LOG0_INFO(
            "bench rl: {} | {:.3f}s/step | {} of {} samples trained | {:.4f}s per trained "
            "sample | reward {:.3f} -> {:.3f}",
            row["dynamic_filtering"].get<bool>() ? "dynamic filtering" : "plain GRPO       ",
            row["step_s"].get<double>(), row["samples_trained"].get<int64_t>(),
            row["samples_generated"].get<int64_t>(),
            row["seconds_per_trained_sample"].get<double>(),
            row["reward_first_tenth"].get<double>(), row["reward_last_tenth"].get<double>());
      else
        LOG0_INFO(
            "bench rl: step {:.2f}s | {:.2f} GFLOP/s per rank = {:.2f} x sgemm ({:.1f}) | gen "
            "{:.0f} tok/s at step 1, {:.0f} at step {} ({:.2f}x)",
            row["step_s"].get<double>(), row["gflops_per_s_per_rank"].get<double>(),
            row["ratio_to_sgemm"].get<double>(), row["sgemm_gflops_per_s"].get<double>(),
            row["gen_tokens_per_s_first"].get<double>(), row["gen_tokens_per_s_last"].get<double>(),
            row["steps"].get<int64_t>(), row["gen_tokens_per_s_ratio"].get<double>());
    });
  }
  return 0;
}

}  // namespace rlhf::app
