// The GPU benchmarks (bench/bench_cuda.h): the spec-sheet table, and a smoke run of the training
// and decode benchmarks on a tiny model (on the emulator in CI: the rows and their ratios are
// produced, the numbers mean nothing there).
#include "bench/bench_cuda.h"

#include <mpi.h>

#include "model/config.h"
#include "parallel/comm.h"
#include "tests/ops/cuda_test_util.h"

using namespace rlhf;

TEST_CASE("bench cuda: spec-sheet peaks by device name") {
  const auto h100 = bench::gpu_spec("NVIDIA H100 80GB HBM3");
  CHECK(h100.bf16_tflops == 989.4);
  CHECK(h100.hbm_GBps == 3350);
  CHECK(bench::gpu_spec("NVIDIA H100 PCIe").bf16_tflops == 756.0);
  CHECK(bench::gpu_spec("NVIDIA H200").hbm_GBps == 4800);
  CHECK(bench::gpu_spec("NVIDIA A100-SXM4-80GB").hbm_GBps == 2039);
  CHECK(bench::gpu_spec("CUDA emulator (CPU)").bf16_tflops == 0);
}

TEST_CASE("bench cuda: train and generate rows on a tiny model") {
  RLHF_SKIP_WITHOUT_CUDA_DEVICE();
#ifdef RLHF_CUDA
  test::init_mpi();
  const model::ModelConfig c = test::small_gpu_config(4, 2, 97);
  std::vector<nlohmann::json> rows;
  const bench::Emit emit = [&](const nlohmann::json& r) { rows.push_back(r); };
  bench::BenchTrainCudaOptions t;
  t.models = {{"tiny", c}};
  t.tokens_per_step = 64;
  t.seq_len = 16;
  t.steps = 1;
  t.warmup = 0;
  auto self = parallel::make_comm(MPI_COMM_SELF, "self");
  bench::run_bench_train_cuda(t, *self, nullptr, emit);
  bench::BenchGenerateCudaOptions g;
  g.models = {{"tiny", c}};
  g.prompt_len = 4;
  g.new_tokens = 4;
  g.batches = {1, 3};
  g.repeats = 1;
  g.copy_bytes = 1 << 20;
  bench::run_bench_generate_cuda(g, emit);
  int train = 0, gemm = 0, generate = 0, cublas_rows = 0, host_sampling = 0;
  for (const auto& r : rows) {
    const std::string b = r["bench"];
    if (b == "train") {
      ++train;
      CHECK(r["step_s"].get<double>() > 0);
      CHECK(r["mfu_vs_gemm"].get<double>() > 0);
      CHECK(r["tokens_per_step"].get<double>() == 64);
    }
    gemm += b == "gemm_cuda";
    if (b == "generate") {
      ++generate;
      cublas_rows += !r["skinny_gemm"].get<bool>();
      host_sampling += r["sampling"].get<std::string>() == "host";
      CHECK(r["decode_tokens_per_s"].get<double>() > 0);
      CHECK(r["read_GBps"].get<double>() > 0);
      // The forwards' device time is part of the step, the host's the rest.
      CHECK(r["device_ms_per_step"].get<double>() > 0);
      CHECK(r["device_ms_per_step"].get<double>() <= r["step_ms"].get<double>());
      // The device's token draws: timed when they run there, none with the host sampler.
      if (r["sampling"].get<std::string>() == "device")
        CHECK(r["sampling_ms_per_step"].get<double>() > 0);
      else
        CHECK(r["sampling_ms_per_step"].get<double>() == 0);
      CHECK(r["device_ms_per_step"].get<double>() + r["sampling_ms_per_step"].get<double>() <=
            r["step_ms"].get<double>());
    }
  }
  CHECK(train == 1);
  // Five GEMM shapes (q/o_proj are both 64 x 64 here), three GEMMs each.
  CHECK(gemm == 5 * 3);
  // Batches 1 and 3, each also timed with cuBLASLt in place of the few-row kernel, and batch 3
  // with the host sampler.
  CHECK(generate == 5);
  CHECK(cublas_rows == 2);
  CHECK(host_sampling == 1);
#endif
}
