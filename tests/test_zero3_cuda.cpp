// The GPU training state (Zero3StoreCuda, one rank) with the GPU model, through the TrainModel
// interface the trainers use: weights and moments round-trip, the gradient norm, optimizer steps
// against the CPU store + CPU model, --adam_offload against the device optimizer, frozen stores.
// (N ranks against 1 rank over NCCL: tests/mpi/test_zero3_cuda.cpp.)
#include <cmath>

#include "parallel/param_store.h"
#include "parallel/train_model.h"
#include "tests/ops/cuda_test_util.h"

#ifdef RLHF_CUDA
#include "parallel/zero3_cuda.h"
#endif

using namespace rlhf;
using model::HeadKind;

#ifdef RLHF_CUDA
namespace {

model::ModelConfig store_config() {
  return test::small_gpu_config();
}

// Deterministic bf16-valued full units for a layout (padding zero).
std::vector<std::vector<float>> bf16_units(const model::ParamLayout& layout, uint64_t seed) {
  model::LocalParams<float> P(layout);
  P.init(seed, 0.05);
  test::round_params_bf16(P);
  std::vector<std::vector<float>> units;
  for (int u = 0; u < layout.num_units(); ++u)
    units.emplace_back(P.params(u), P.params(u) + layout.unit(u).numel);
  return units;
}

std::vector<std::vector<float>> gather_all(parallel::ParamStore& s) {
  std::vector<std::vector<float>> out;
  for (int u = 0; u < s.layout().num_units(); ++u) {
    out.emplace_back(size_t(s.layout().unit(u).numel));
    s.gather_unit(u, out.back().data());
  }
  return out;
}

std::unique_ptr<parallel::TrainModel> gpu_model(const model::ParamLayout& layout,
                                                parallel::Zero3OptionsCuda o = {}) {
  return parallel::make_cuda_train_model(
      std::make_unique<parallel::Zero3StoreCuda>(layout, nullptr, o), false);
}

// Two optimizer steps of SFT (2 micro-batches each, loss = mean −lp over the targets), returning
// the gradient norm of each step.
std::vector<double> sft_steps(parallel::TrainModel& m, double eps = 1e-8) {
  const int64_t B = 2, T = 11, N = B * T;
  optim::AdamWConfig adam;
  adam.lr = 1e-3;
  adam.eps = eps;
  adam.weight_decay = 0.1;
  std::vector<double> norms;
  for (int step = 1; step <= 2; ++step) {
    m.store().zero_grads();
    for (int micro = 0; micro < 2; ++micro) {
      const auto tokens = test::random_tokens(N, 256, uint64_t(10 * step + micro));
      std::vector<int32_t> targets(N);
      for (int64_t n = 0; n < N; ++n) targets[n] = n % T == T - 1 ? -1 : tokens[n + 1];
      std::vector<float> lp(N), dlp(N);
      m.forward_lm(tokens.data(), targets.data(), B, T, lp.data(), nullptr, true);
      for (int64_t n = 0; n < N; ++n) dlp[n] = targets[n] == -1 ? 0.0f : -1.0f / (2 * 20.0f);
      m.backward_lm(dlp.data(), nullptr);
    }
    norms.push_back(parallel::clip_and_step(m.store(), adam, adam.lr, step, 1.0));
  }
  return norms;
}

}  // namespace
#endif

TEST_CASE("device store: weights and moments round-trip; unit_shard and memory") {
  RLHF_SKIP_WITHOUT_CUDA_DEVICE();
#ifdef RLHF_CUDA
  const model::ParamLayout layout(store_config(), HeadKind::kLM);
  const auto units = bf16_units(layout, 1);
  for (bool offload : {false, true}) {
    parallel::Zero3OptionsCuda o;
    o.adam_offload = offload;
    parallel::Zero3StoreCuda s(layout, nullptr, o);
    for (int u = 0; u < layout.num_units(); ++u) s.load_unit(u, units[size_t(u)].data());
    CHECK(gather_all(s) == units);
    const parallel::UnitShard sh = s.unit_shard(1);
    const parallel::ShardLayout shards(layout, 1);
    CHECK(sh.offset == 0);
    CHECK(sh.count == shards.padded_numel(1));  // one shard: the unit and its zero padding
    std::vector<float> padded = units[1];
    padded.resize(size_t(sh.count), 0.0f);
    CHECK(std::vector<float>(sh.data, sh.data + sh.count) == padded);
    const auto m = test::random_vec<float>(layout.unit(2).numel, 5);
    const auto v = test::random_vec<float>(layout.unit(2).numel, 6, 0, 1);
    s.load_moments(2, m.data(), v.data());
    std::vector<float> m2(m.size()), v2(v.size());
    s.gather_moments(2, m2.data(), v2.data());
    CHECK(m2 == m);
    CHECK(v2 == v);
    const parallel::MemoryReport r = s.memory();
    CHECK(r.grads_bytes == shards.total_padded() * 4);
    CHECK(r.optimizer_bytes == 2 * shards.total_padded() * 4);
    CHECK(r.optimizer_on_host == offload);
    CHECK(s.replicated());
  }
#endif
}

TEST_CASE("device store: the gradient norm is the norm of the accumulated gradients") {
  RLHF_SKIP_WITHOUT_CUDA_DEVICE();
#ifdef RLHF_CUDA
  const model::ParamLayout layout(store_config(), HeadKind::kLM);
  parallel::Zero3StoreCuda s(layout, nullptr);
  std::vector<std::vector<float>> g;
  double ref = 0;
  s.zero_grads();
  for (int u = 0; u < layout.num_units(); ++u) {
    g.push_back(test::random_vec<float>(layout.unit(u).numel, 100 + u));
    float* dev = s.acquire_grads(u);
    // Gradients are written in the order of the store's stream (as the model's backward does).
    CUDA_CHECK(cudaMemcpyAsync(dev, g.back().data(), g.back().size() * 4, cudaMemcpyHostToDevice,
                               s.stream()));
    s.release_grads(u);
    for (float x : g.back()) ref += double(x) * x;
  }
  CHECK(s.grad_sq_norm() == doctest::Approx(ref).epsilon(1e-12));
  s.zero_grads();
  CHECK(s.grad_sq_norm() == 0.0);
#endif
}

TEST_CASE("device store + GPU model: optimizer steps follow the CPU store + CPU model") {
  RLHF_SKIP_WITHOUT_CUDA_DEVICE();
#ifdef RLHF_CUDA
  const model::ParamLayout layout(store_config(), HeadKind::kLM);
  const auto init = bf16_units(layout, 2);
  auto cpu =
      parallel::make_cpu_train_model(std::make_unique<parallel::LocalParamStore>(layout), false);
  auto gpu = gpu_model(layout);
  CHECK(std::string(gpu->device()) == "cuda");
  for (int u = 0; u < layout.num_units(); ++u) {
    cpu->store().load_unit(u, init[size_t(u)].data());
    gpu->store().load_unit(u, init[size_t(u)].data());
  }
  // eps = 1e-2 (above every |gradient| here) keeps AdamW's step proportional to the gradient, so
  // the weight updates inherit the gradients' agreement; with eps = 1e-8 the step is ±lr for
  // every element and a near-zero gradient whose sign differs in bf16 flips its whole step.
  const auto n_cpu = sft_steps(*cpu, 1e-2), n_gpu = sft_steps(*gpu, 1e-2);
  // Gradient norms: the bf16 model's gradients are within nmse 1e-4 (test_transformer_cuda);
  // their norm agrees to well under 1%.
  for (size_t i = 0; i < n_cpu.size(); ++i)
    CHECK(n_gpu[i] == doctest::Approx(n_cpu[i]).epsilon(1e-2));
  // Weight updates (after − before, the decay included): as the gradients, nmse <= 1e-3 (a wrong
  // gradient, a skipped step or a wrong lr gives ~1).
  const auto w_cpu = gather_all(cpu->store()), w_gpu = gather_all(gpu->store());
  for (int u = 0; u < layout.num_units(); ++u) {
    std::vector<float> d_cpu(w_cpu[size_t(u)].size()), d_gpu(d_cpu.size());
    for (size_t i = 0; i < d_cpu.size(); ++i) {
      d_cpu[i] = w_cpu[size_t(u)][i] - init[size_t(u)][i];
      d_gpu[i] = w_gpu[size_t(u)][i] - init[size_t(u)][i];
    }
    test::check_nmse("weight updates of unit " + std::to_string(u), d_gpu, d_cpu, 1e-3);
  }
#endif
}

TEST_CASE("device store: --adam_offload steps like the device optimizer") {
  RLHF_SKIP_WITHOUT_CUDA_DEVICE();
#ifdef RLHF_CUDA
  const model::ParamLayout layout(store_config(), HeadKind::kLM);
  const auto init = bf16_units(layout, 3);
  parallel::Zero3OptionsCuda off;
  off.adam_offload = true;
  auto a = gpu_model(layout), b = gpu_model(layout, off);
  for (int u = 0; u < layout.num_units(); ++u) {
    a->store().load_unit(u, init[size_t(u)].data());
    b->store().load_unit(u, init[size_t(u)].data());
  }
  const auto na = sft_steps(*a), nb = sft_steps(*b);
  // The same gradients (the same bf16 weights go into the same kernels) and the same AdamW
  // formula, host (vectorised) against device: fp32 rounding at most (FMA contraction).
  CHECK(nb[0] == na[0]);
  const auto wa = gather_all(a->store()), wb = gather_all(b->store());
  for (int u = 0; u < layout.num_units(); ++u)
    test::check_nmse("offload weights of unit " + std::to_string(u), wb[size_t(u)], wa[size_t(u)],
                     1e-12);
  std::vector<float> ma(size_t(layout.unit(1).numel)), va(ma.size()), mb(ma.size()), vb(ma.size());
  a->store().gather_moments(1, ma.data(), va.data());
  b->store().gather_moments(1, mb.data(), vb.data());
  test::check_nmse("offload first moment", mb, ma, 1e-12);
  test::check_nmse("offload second moment", vb, va, 1e-12);
#endif
}

TEST_CASE("device store: a frozen store holds bf16 weights only") {
  RLHF_SKIP_WITHOUT_CUDA_DEVICE();
#ifdef RLHF_CUDA
  const model::ParamLayout layout(store_config(), HeadKind::kLM);
  parallel::Zero3OptionsCuda o;
  o.frozen = true;
  parallel::Zero3StoreCuda s(layout, nullptr, o);
  auto full = test::random_vec<float>(layout.unit(0).numel, 9);
  s.load_unit(0, full.data());
  std::vector<float> back(full.size());
  s.gather_unit(0, back.data());
  CHECK(back == test::round_bf16(full));
  CHECK(s.memory().grads_bytes == 0);
  CHECK(s.memory().optimizer_bytes == 0);
  CHECK_THROWS_WITH(s.acquire_grads(0), doctest::Contains("frozen"));
  optim::AdamWConfig adam;
  CHECK_THROWS_WITH(s.adamw_step(adam, 1e-3, 1, 1.0f), doctest::Contains("frozen"));
  CHECK_THROWS_WITH(s.provider(), doctest::Contains("no host-side unit provider"));
#endif
}
