#include "bench/bench_cuda.h"

#include <mpi.h>

#include <algorithm>
#include <limits>
#include <map>
#include <random>

#include "core/error.h"

#ifdef RLHF_CUDA
#include <cuda_runtime_api.h>

#include "bench/bench_sync.h"
#include "core/cuda_check.h"
#include "core/device_memory.h"
#include "model/flops.h"
#include "model/init.h"
#include "model/ops/attention.h"
#include "model/ops/linear.h"
#include "parallel/mpi_check.h"
#include "parallel/topology.h"
#include "parallel/train_model.h"
#include "parallel/weight_sync.h"
#include "parallel/zero3_cuda.h"
#include "rollout/engine.h"
#endif

namespace rlhf::bench {

GpuSpec gpu_spec(const std::string& name) {
  // Dense bf16 tensor-core TFLOPS (no 2:4 sparsity) and HBM GB/s, from the vendors' data sheets.
  // More specific names first.
  struct Row {
    const char* match;
    double tflops, hbm;
  };
  static const Row rows[] = {
      {"H200", 989.4, 4800},
      {"H100 NVL", 835.0, 3900},
      {"H100 PCIe", 756.0, 2000},
      {"H100", 989.4, 3350},
      {"GH200", 989.4, 4000},
      {"A100-SXM4-80GB", 312.0, 2039},
      {"A100 80GB PCIe", 312.0, 1935},
      {"A100", 312.0, 1555},
      {"L40S", 362.1, 864},
      {"L4", 121.0, 300},
      {"A10", 125.0, 600},
      {"RTX 4090", 165.2, 1008},
  };
  for (const Row& r : rows)
    if (name.find(r.match) != std::string::npos) return {name, r.tflops, r.hbm};
  return {name, 0, 0};
}

model::ModelConfig shape1b_config() {
  model::ModelConfig c;
  c.model_type = "llama";
  c.hidden_size = 2048;
  c.intermediate_size = 8192;
  c.num_hidden_layers = 16;
  c.num_attention_heads = 32;
  c.num_key_value_heads = 8;
  c.vocab_size = 128256;
  c.max_position_embeddings = 4096;
  c.rope_theta = 500000.0;
  c.tie_word_embeddings = true;
  return c;
}

#ifdef RLHF_CUDA

namespace {

std::string device_name() {
  int dev = 0;
  cudaDeviceProp p{};
  CUDA_CHECK(cudaGetDevice(&dev));
  CUDA_CHECK(cudaGetDeviceProperties(&p, dev));
  return p.name;
}

std::vector<std::pair<std::string, model::ModelConfig>> default_models(
    const std::vector<std::pair<std::string, model::ModelConfig>>& given) {
  if (!given.empty()) return given;
  return {{"135M", shape135m_config()}, {"1B", shape1b_config()}};
}

// cuBLASLt (linear_forward_cuda / linear_backward_cuda) on every GEMM of one training step of cfg
// with `rows` tokens, timed with events; returns the flop-weighted TFLOP/s.
double bench_gemm_cuda(const model::ModelConfig& cfg, int64_t rows, const Emit& emit) {
  const int64_t C = cfg.hidden_size, F = cfg.intermediate_size, D = cfg.D();
  const int64_t Q = cfg.num_attention_heads * D, KV = cfg.num_key_value_heads * D;
  const int64_t L = cfg.num_hidden_layers;
  std::map<std::pair<int64_t, int64_t>, int64_t> linears;  // (in, out) -> count per step
  linears[{C, Q}] += L;
  linears[{C, KV}] += 2 * L;
  linears[{Q, C}] += L;
  linears[{C, F}] += 2 * L;
  linears[{F, C}] += L;
  linears[{C, cfg.vocab_size}] += 1;
  CudaStream s;
  cudaEvent_t t0 = nullptr, t1 = nullptr;
  CUDA_CHECK(cudaEventCreate(&t0));
  CUDA_CHECK(cudaEventCreate(&t1));
  double flops = 0, seconds = 0;
  for (const auto& [shape, count] : linears) {
    const auto [IC, OC] = shape;
    DeviceArray<model::bf16> x(rows * IC), w(OC * IC), y(rows * OC), dx(rows * IC);
    DeviceArray<float> dw(OC * IC);
    for (auto* a : {&x, &w, &y, &dx})
      CUDA_CHECK(cudaMemsetAsync(a->get(), 0, size_t(a->size()) * 2, s.get()));
    CUDA_CHECK(cudaMemsetAsync(dw.get(), 0, size_t(dw.size()) * 4, s.get()));
    const double f = 2.0 * double(rows) * double(IC) * double(OC);
    auto run = [&](int which) {
      if (which == 0)
        model::linear_forward_cuda(y.get(), x.get(), w.get(), nullptr, rows, IC, OC, s.get());
      else if (which == 1)
        model::linear_backward_cuda(dx.get(), nullptr, nullptr, y.get(), x.get(), w.get(), rows, IC,
                                    OC, false, s.get());
      else
        model::linear_backward_cuda(nullptr, dw.get(), nullptr, y.get(), x.get(), w.get(), rows, IC,
                                    OC, false, s.get());
    };
    static const char* kNames[] = {"forward", "backward_dx", "backward_dw"};
    for (int which = 0; which < 3; ++which) {
      run(which);  // warm-up: handles, heuristics, workspace
      const int reps = std::max(3, int(std::min(200.0, 5e12 / f)));
      CUDA_CHECK(cudaEventRecord(t0, s.get()));
      for (int r = 0; r < reps; ++r) run(which);
      CUDA_CHECK(cudaEventRecord(t1, s.get()));
      CUDA_CHECK(cudaEventSynchronize(t1));
      float ms = 0;
      CUDA_CHECK(cudaEventElapsedTime(&ms, t0, t1));
      const double t = double(ms) * 1e-3 / reps;
      flops += f * double(count);
      seconds += t * double(count);
      emit({{"bench", "gemm_cuda"},
            {"gemm", kNames[which]},
            {"rows", rows},
            {"in", IC},
            {"out", OC},
            {"count_per_step", count},
            {"time_us", t * 1e6},
            {"tflops_per_s", f / t / 1e12}});
    }
  }
  CUDA_CHECK(cudaEventDestroy(t0));
  CUDA_CHECK(cudaEventDestroy(t1));
  return flops / seconds / 1e12;
}

// Device-to-device copy bandwidth (bytes read + written) of an n-byte buffer: the same-run HBM
// reference of the decode benchmark.
double bench_copy_GBps(int64_t n) {
  DeviceArray<char> a(n), b(n);
  CudaStream s;
  cudaEvent_t t0 = nullptr, t1 = nullptr;
  CUDA_CHECK(cudaEventCreate(&t0));
  CUDA_CHECK(cudaEventCreate(&t1));
  CUDA_CHECK(cudaMemsetAsync(a.get(), 1, size_t(n), s.get()));
  CUDA_CHECK(cudaMemcpyAsync(b.get(), a.get(), size_t(n), cudaMemcpyDeviceToDevice, s.get()));
  double best = 0;
  for (int r = 0; r < 5; ++r) {
    CUDA_CHECK(cudaEventRecord(t0, s.get()));
    CUDA_CHECK(cudaMemcpyAsync(b.get(), a.get(), size_t(n), cudaMemcpyDeviceToDevice, s.get()));
    CUDA_CHECK(cudaEventRecord(t1, s.get()));
    CUDA_CHECK(cudaEventSynchronize(t1));
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, t0, t1));
    if (ms > 0) best = std::max(best, 2.0 * double(n) / (double(ms) * 1e-3) / 1e9);
  }
  CUDA_CHECK(cudaEventDestroy(t0));
  CUDA_CHECK(cudaEventDestroy(t1));
  return best;
}

}  // namespace

void run_bench_train_cuda(const BenchTrainCudaOptions& opt, parallel::Comm& host_comm,
                          parallel::Comm* nccl, const Emit& emit) {
  const int N = host_comm.size();
  const GpuSpec spec = gpu_spec(device_name());
  for (const auto& [name, cfg0] : default_models(opt.models)) {
    model::ModelConfig cfg = cfg0;
    cfg.max_position_embeddings = std::max(cfg.max_position_embeddings, opt.seq_len);
    const int64_t T = opt.seq_len;
    const int64_t seqs = std::max<int64_t>(1, opt.tokens_per_step / T);
    RLHF_CHECK(seqs % N == 0, "--tokens_per_step {} / --seq_len {} = {} sequences over {} ranks",
               opt.tokens_per_step, T, seqs, N);
    const int64_t per_rank = seqs / N;
    const int64_t mb = opt.micro_batch > 0 ? std::min(opt.micro_batch, per_rank) : per_rank;
    RLHF_CHECK(per_rank % mb == 0, "--micro_train_batch_size {} must divide {} sequences", mb,
               per_rank);
    const model::ParamLayout layout(cfg, model::HeadKind::kLM);
    parallel::Zero3OptionsCuda so;
    so.adam_offload = opt.adam_offload;
    auto m = parallel::make_cuda_train_model(
        std::make_unique<parallel::Zero3StoreCuda>(layout, nccl, so), opt.gradient_checkpointing);
    for (int u = 0; u < layout.num_units(); ++u) {
      std::vector<float> full(size_t(layout.unit(u).numel));
      model::init_unit_params(full.data(), layout.unit(u), opt.seed);
      m->store().load_unit(u, full.data());
    }
    const double step_s =
        time_train_steps(*m, cfg, T, seqs, per_rank, mb, opt.warmup, opt.steps, 1e-5, opt.seed,
                         host_comm, [] { CUDA_CHECK(cudaDeviceSynchronize()); })
            .step_s;
    // The GEMM reference after the steps, so that a profiler's first kernels are the model's.
    const double gemm =
        bench_gemm_cuda(cfg, mb * T, host_comm.rank() == 0 ? emit : Emit([](const auto&) {}));
    const double tokens_per_step = double(seqs * T);
    const double tflops_gpu =
        model::training_flops_per_token(cfg, T) * tokens_per_step / step_s / 1e12 / N;
    const auto mem = m->store().memory();
    emit(
        {{"bench", "train"},
         {"device", "cuda"},
         {"gpu", spec.name},
         {"model", name},
         {"model_params", layout.num_parameters()},
         {"ranks", N},
         {"adam_offload", opt.adam_offload},
         {"attention", model::attention_impl() == model::AttentionImpl::kCudnn ? "cudnn" : "flash"},
         {"tokens_per_step", tokens_per_step},
         {"seq_len", T},
         {"micro_batch", mb},
         {"step_s", step_s},
         {"tokens_per_s", tokens_per_step / step_s},
         {"tflops_per_s_per_gpu", tflops_gpu},
         {"peak_tflops", spec.bf16_tflops},
         {"mfu_vs_peak", spec.bf16_tflops > 0 ? tflops_gpu / spec.bf16_tflops : 0.0},
         {"gemm_tflops_per_s", gemm},
         {"mfu_vs_gemm", tflops_gpu / gemm},
         {"state_bytes_per_gpu",
          mem.params_bytes + mem.grads_bytes + (mem.optimizer_on_host ? 0 : mem.optimizer_bytes)},
         {"activation_bytes_per_gpu", m->activation_bytes()}});
  }
}

namespace {

// One engine's fixed-length runs at every batch of `batches` (the fastest of opt.repeats after a
// warm-up that captures the graphs), a row each.
void time_engine_batches(rollout::Engine& engine, const std::vector<int64_t>& batches,
                         const model::ModelConfig& cfg, const std::string& name, bool skinny,
                         const GpuSpec& spec, double copy, const BenchGenerateCudaOptions& opt,
                         const Emit& emit) {
  const double W = double(engine.weight_bytes_per_decode_step());
  std::mt19937_64 rng(opt.seed);
  std::uniform_int_distribution<int32_t> tok(0, int32_t(cfg.vocab_size - 1));
  for (const int64_t batch : batches) {
    std::vector<rollout::GenerationRequest> reqs;
    for (int64_t i = 0; i < batch; ++i) {
      rollout::GenerationRequest r;
      r.id = uint64_t(i);
      r.prompt.resize(size_t(opt.prompt_len));
      for (auto& t : r.prompt) t = tok(rng);
      r.max_new_tokens = opt.new_tokens;
      r.sampling.temperature = 1.0;
      r.sampling.seed = opt.seed;
      reqs.push_back(r);
    }
    engine.generate(reqs);  // warm-up (captures the graphs)
    rollout::EngineStats best;
    best.decode_s = std::numeric_limits<double>::infinity();
    for (int r = 0; r < opt.repeats; ++r) {
      engine.generate(reqs);
      if (engine.stats().decode_s < best.decode_s) best = engine.stats();
    }
    const double steps = double(best.decode_steps);
    const double read = (W * steps + best.kv_bytes_read) / best.decode_s / 1e9;
    emit({{"bench", "generate"},
          {"device", "cuda"},
          {"gpu", spec.name},
          {"model", name},
          {"batch", batch},
          {"new_tokens", opt.new_tokens},
          {"graphs", opt.cuda_graphs},
          {"skinny_gemm", skinny},
          {"sampling", engine.device_sampling() ? "device" : "host"},
          {"decode_tokens_per_s", double(best.decode_tokens) / best.decode_s},
          {"step_ms", best.decode_s / steps * 1e3},
          {"device_ms_per_step", best.decode_device_s / steps * 1e3},
          {"sampling_ms_per_step", best.decode_sampling_device_s / steps * 1e3},
          {"host_ms_per_step",
           (best.decode_s - best.decode_device_s - best.decode_sampling_device_s) / steps * 1e3},
          {"weight_bytes_per_step", W},
          {"read_GBps", read},
          {"hbm_GBps", spec.hbm_GBps},
          {"ratio_to_hbm", spec.hbm_GBps > 0 ? read / spec.hbm_GBps : 0.0},
          {"copy_GBps", copy},
          {"ratio_to_copy", copy > 0 ? read / copy : 0.0}});
  }
}

}  // namespace

void run_bench_generate_cuda(const BenchGenerateCudaOptions& opt, const Emit& emit) {
  const GpuSpec spec = gpu_spec(device_name());
  const double copy = bench_copy_GBps(opt.copy_bytes);
  emit({{"bench", "copy_cuda"}, {"gpu", spec.name}, {"GBps", copy}});
  for (const auto& [name, cfg0] : default_models(opt.models)) {
    model::ModelConfig cfg = cfg0;
    cfg.max_position_embeddings =
        std::max(cfg.max_position_embeddings, opt.prompt_len + opt.new_tokens);
    const model::ParamLayout layout(cfg, model::HeadKind::kLM);
    const int64_t max_batch =
        opt.batches.empty() ? 1 : *std::max_element(opt.batches.begin(), opt.batches.end());
    rollout::EngineOptions eo;
    eo.cuda = true;
    eo.max_batch = max_batch;
    eo.ignore_eos = true;
    eo.cuda_graphs = opt.cuda_graphs;
    std::vector<int64_t> few;  // the batches the few-row kernel serves
    for (const int64_t b : opt.batches)
      if (b <= model::kSkinnyMaxRows) few.push_back(b);
    {
      rollout::Engine engine(layout, eo);
      for (int u = 0; u < layout.num_units(); ++u)
        model::init_unit_params(engine.unit_buffer(u), layout.unit(u), opt.seed);
      time_engine_batches(engine, opt.batches, cfg, name, true, spec, copy, opt, emit);
      // The largest batch again with every row's logits copied to the host and sampled there.
      engine.set_device_sampling(false);
      time_engine_batches(engine, {max_batch}, cfg, name, true, spec, copy, opt, emit);
      engine.set_device_sampling(true);
      if (few.empty()) continue;
      // The same weights on a second engine whose graphs capture cuBLASLt's GEMMs instead.
      eo.max_batch = *std::max_element(few.begin(), few.end());
      rollout::Engine plain(layout, eo);
      for (int u = 0; u < layout.num_units(); ++u)
        std::copy_n(engine.unit_buffer(u), layout.unit(u).numel, plain.unit_buffer(u));
      model::set_linear_skinny_enabled(false);
      try {
        time_engine_batches(plain, few, cfg, name, false, spec, copy, opt, emit);
      } catch (...) {
        model::set_linear_skinny_enabled(true);
        throw;
      }
      model::set_linear_skinny_enabled(true);
    }
  }
}

namespace {

// One placement of run_bench_sync_cuda: G = 0 colocated, else G engine ranks on one node.
void bench_sync_placement(const BenchSyncCudaOptions& opt, const Emit& emit, int G) {
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  parallel::TopologyOptions topt;
  topt.ranks_per_node = world;  // one node
  topt.gen_ranks_per_node = G;
  parallel::Topology topo(MPI_COMM_WORLD, topt);
  const int n_train = int(topo.placement().train_ranks.size());
  auto host = parallel::make_comm(topo.train_comm(), "train_comm");
  auto nccl = n_train > 1 ? parallel::make_comm(topo.train_comm(), "train_comm_nccl",
                                                parallel::CommKind::kNccl)
                          : nullptr;
  for (const auto& [name, cfg] : default_models(opt.models)) {
    const model::ParamLayout layout(cfg, model::HeadKind::kLM);
    std::unique_ptr<parallel::Zero3StoreCuda> store;
    std::vector<std::vector<float>> full;
    for (int u = 0; u < layout.num_units(); ++u) {
      full.emplace_back(size_t(layout.unit(u).numel));
      model::init_unit_params(full.back().data(), layout.unit(u), opt.seed);
    }
    if (topo.trains()) {
      parallel::Zero3OptionsCuda so;
      so.frozen = true;  // the bf16 shards are all a sync reads
      store = std::make_unique<parallel::Zero3StoreCuda>(layout, nccl.get(), so);
      for (int u = 0; u < layout.num_units(); ++u) store->load_unit(u, full[size_t(u)].data());
    }
    parallel::WeightSync sync(topo, host.get(), layout, opt.bucket_bytes);
    std::vector<DeviceArray<model::bf16>> engine;
    std::vector<model::bf16*> ptrs;
    if (topo.generates())
      for (int u = 0; u < layout.num_units(); ++u) {
        engine.emplace_back(sync.engine_unit_room()[size_t(u)], "bench sync engine units");
        ptrs.push_back(engine.back().get());
      }
    const auto once = [&] {
      return G == 0 ? sync.sync_device(*store, ptrs, nccl.get())
                    : sync.sync_device_disaggregated(store.get(), ptrs, nccl.get());
    };
    parallel::SyncStats best = once();  // warm-up (the disaggregated node communicator too)
    best.seconds = std::numeric_limits<double>::infinity();
    for (int i = 0; i < opt.iters; ++i) {
      MPI_CHECK(MPI_Barrier(topo.world()));
      const parallel::SyncStats st = once();
      if (st.seconds < best.seconds) best = st;
    }
    // The plain-collective reference: colocated, one ncclAllGather of the same bytes over the
    // train ranks; disaggregated, none is measured (0).
    const double ref_s =
        G == 0 ? sync.reference_device_all_gather_seconds(nccl.get(), opt.iters) : 0.0;
    int64_t wrong = 0;
    for (size_t u = 0; u < ptrs.size(); ++u) {
      std::vector<model::bf16> got(size_t(layout.unit(int(u)).numel));
      CUDA_CHECK(cudaMemcpy(got.data(), ptrs[u], got.size() * 2, cudaMemcpyDeviceToHost));
      for (size_t i = 0; i < got.size(); ++i)
        wrong += __bfloat162float(got[i]) != __bfloat162float(__float2bfloat16_rn(full[u][i]));
    }
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &wrong, 1, MPI_INT64_T, MPI_SUM, topo.world()));
    const double factor = n_train > 1 ? double(n_train - 1) / double(n_train) : 1.0;
    const double ref_busbw = ref_s > 0 ? double(best.bytes) / ref_s / 1e9 * factor : 0.0;
    emit({{"bench", "sync"},
          {"device", "cuda"},
          {"model", name},
          {"mode", best.mode},
          {"ranks", world},
          {"train_ranks", n_train},
          {"engine_ranks", int(topo.placement().gen_ranks.size())},
          {"bucket_bytes", opt.bucket_bytes},
          {"buckets", best.buckets},
          {"bytes", best.bytes},
          {"sync_s", best.seconds},
          {"sync_busbw_GBps", best.busbw_GBps},
          {"allgather_s", ref_s},
          {"allgather_busbw_GBps", ref_busbw},
          {"ratio", ref_busbw > 0 ? best.busbw_GBps / ref_busbw : 0.0},
          {"wrong", wrong}});
  }
}

}  // namespace

void run_bench_sync_cuda(const BenchSyncCudaOptions& opt, const Emit& emit) {
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  bench_sync_placement(opt, emit, 0);
  if (world > 1) bench_sync_placement(opt, emit, world / 2);
}

#else  // !RLHF_CUDA

void run_bench_train_cuda(const BenchTrainCudaOptions&, parallel::Comm&, parallel::Comm*,
                          const Emit&) {
  RLHF_FAIL("bench --device cuda: this build has no CUDA backend");
}
void run_bench_generate_cuda(const BenchGenerateCudaOptions&, const Emit&) {
  RLHF_FAIL("bench --device cuda: this build has no CUDA backend");
}
void run_bench_sync_cuda(const BenchSyncCudaOptions&, const Emit&) {
  RLHF_FAIL("bench --device cuda: this build has no CUDA backend");
}

#endif  // RLHF_CUDA

}  // namespace rlhf::bench
