// LoRA on the CUDA backend (model/lora_cuda.h, parallel/lora_model_cuda.h, the GPU engine's
// merge) against the CPU LoRA path: the adapter branch and its gradients against
// lora_forward_cpu / lora_backward_cpu on the same bf16 values (dropout masks bit for bit); the
// GPU LoRA model against the CPU LoRA model of the same weights and adapters (log-probs, values,
// adapter gradients, one AdamW step, the adapters-off reference); the GPU engine's merged weights
// against the CPU model with the adapters, re-merged from the frozen base at each sync.
#include <mpi.h>

#include <algorithm>
#include <cmath>

#include "model/local_provider.h"
#include "model/lora.h"
#include "model/transformer.h"
#include "parallel/lora_store.h"
#include "parallel/zero3.h"
#include "rollout/engine.h"
#include "tests/ops/cuda_test_util.h"

#ifdef RLHF_CUDA
#include "model/lora_cuda.h"
#include "model/transformer_cuda.h"
#include "parallel/lora_model_cuda.h"
#include "parallel/zero3_cuda.h"
#include "rollout/engine_cuda.h"
#endif

using namespace rlhf;
using model::HeadKind;

#ifdef RLHF_CUDA
namespace {

// Bounds (nmse against the fp32 CPU path on the same bf16 values). The GPU branch rounds its
// (N, r) intermediate and its output to bf16 (relative error 2^-9 each) and stores B pre-scaled
// in bf16; one branch's outputs and gradients measure nmse ~1e-6 on the emulator, bound 1e-4. A
// missing scale, a transposed factor or a wrong mask gives nmse ~1e-1 or more.
constexpr double kNmseBranch = 1e-4;
// Through the whole model (2 layers, bf16 activations), the bounds of test_transformer_cuda.cpp:
// log-probs 1e-4 (measured 2.4e-7 to 4.1e-7 on the emulator), adapter gradients and the AdamW
// update 1e-3 (measured 6.9e-5 to 9.1e-5, the base model's gradients' level). The scalar head's
// values (one bf16-rounded dot product of small, cancelling terms, ~0.03 here) measure 2e-4: bound
// 1e-3. A wrong projection, offset or scale gives nmse ~1e-1 or more.
constexpr double kNmseOutputs = 1e-4;
constexpr double kNmseValues = 1e-3;
constexpr double kNmseGrads = 1e-3;

parallel::Comm& self_comm() {
  test::init_mpi();
  static std::unique_ptr<parallel::Comm> self = parallel::make_comm(MPI_COMM_SELF, "self");
  return *self;
}

model::LoraConfig lora_cfg(double dropout, uint64_t seed) {
  model::LoraConfig c;
  c.rank = 8;
  c.alpha = 20.0;  // scale 2.5: not a power of two, so the pre-scaled bf16 B rounds
  c.targets = model::parse_target_modules("all-linear");
  c.dropout = dropout;
  c.seed = seed;
  return c;
}

// PEFT's init, then B ~ U(-0.1, 0.1) (B != 0: the adapters change the model, by about as much as
// the base weights' own size), bf16-valued so both backends compute with the same A and B.
std::vector<float> random_adapter(const model::LoraLayout& ll, uint64_t seed) {
  std::vector<float> a(size_t(ll.numel()), 0.0f);
  model::lora_init(ll, a.data(), seed);
  for (const model::TensorInfo& t : ll.tensors())
    if (t.name.find("lora_B") != std::string::npos) {
      auto r = test::random_vec<float>(t.numel, seed + uint64_t(t.offset), -0.1, 0.1);
      std::copy(r.begin(), r.end(), a.begin() + t.offset);
    }
  return test::round_bf16(a);
}

// Base weights, bf16-valued, norms and the score head around 1.
void init_base(model::LocalParams<float>& P) {
  P.init(7, 0.05);
  const model::ParamLayout& layout = P.layout();
  for (int u = 0; u < layout.num_units(); ++u)
    for (const auto& t : layout.unit(u).tensors)
      if (t.name.find("norm") != std::string::npos) {
        auto r = test::random_vec<float>(t.numel, 1000 + u, 0.5, 1.5);
        std::copy(r.begin(), r.end(), P.params(u) + t.offset);
      }
  test::round_params_bf16(P);
}

// The CPU LoRA model and the GPU one over the same base and adapters.
struct Pair {
  std::unique_ptr<parallel::TrainModel> cpu, gpu;
  parallel::LoraStore& cpu_store() { return dynamic_cast<parallel::LoraStore&>(cpu->store()); }
  parallel::LoraStore& gpu_store() { return dynamic_cast<parallel::LoraStore&>(gpu->store()); }
};

Pair make_pair(const model::ParamLayout& layout, model::LocalParams<float>& P,
               model::LoraConfig cfg, const std::vector<float>* adapters,
               bool checkpointing = false) {
  cfg.save_score = layout.head() != HeadKind::kLM;
  Pair p;
  parallel::Zero3Options o;
  o.frozen = true;
  auto cbase = std::make_unique<parallel::Zero3Store>(layout, self_comm(), o);
  parallel::Zero3OptionsCuda oc;
  oc.frozen = true;
  auto gbase = std::make_unique<parallel::Zero3StoreCuda>(layout, nullptr, oc);
  auto cs = std::make_unique<parallel::LoraStore>(std::move(cbase), cfg, self_comm(), 3);
  auto gs = std::make_unique<parallel::LoraStore>(std::move(gbase), cfg, self_comm(), 3, false);
  for (int u = 0; u < layout.num_units(); ++u) {
    cs->load_unit(u, P.params(u));
    gs->load_unit(u, P.params(u));
  }
  if (adapters != nullptr) {
    std::vector<float> a = *adapters;
    const int64_t so = cs->lora_layout().score_offset();
    if (so >= 0)  // keep the trained score copy the load gave (the base's head)
      std::copy(cs->adapters() + so, cs->adapters() + so + layout.config().hidden_size,
                a.begin() + so);
    cs->load_adapters(a.data());
    gs->load_adapters(a.data());
  }
  p.cpu = parallel::make_cpu_train_model(std::move(cs), false);
  p.gpu = parallel::make_lora_cuda_model(std::move(gs), checkpointing, nullptr);
  return p;
}

std::vector<float> grads_of(parallel::LoraStore& s) {
  return {s.adapter_grads(), s.adapter_grads() + s.lora_layout().numel()};
}
std::vector<float> adapters_of(parallel::LoraStore& s) {
  return {s.adapters(), s.adapters() + s.lora_layout().numel()};
}

}  // namespace
#endif

TEST_CASE("lora cuda: the adapter branch and its gradients match the CPU's; same dropout masks") {
  RLHF_SKIP_WITHOUT_CUDA_DEVICE();
#ifdef RLHF_CUDA
  const int64_t N = 37, in = 48, out = 40, r = 8;
  const float scale = 2.5f;
  const auto x = test::random_bf16_values(N * in, 1), dy = test::random_bf16_values(N * out, 2);
  const auto A = test::random_bf16_values(r * in, 3, -0.2, 0.2);
  const auto B = test::random_bf16_values(out * r, 4, -0.5, 0.5);
  const auto y0 = test::random_bf16_values(N * out, 5), dx0 = test::random_bf16_values(N * in, 6);
  std::vector<float> Bs(B.size());
  for (size_t i = 0; i < B.size(); ++i) Bs[i] = scale * B[i];
  test::TestStream s;
  for (double p : {0.0, 0.3}) {
    CAPTURE(p);
    const uint64_t key = model::lora_dropout_key(11, 22, 1, model::Proj::kUp);
    // CPU reference in fp32 on the same values.
    std::vector<float> y = y0, dx = dx0, dA(A.size(), 0.0f), dB(B.size(), 0.0f);
    model::LoraProjView<float> v;
    v.A = A.data();
    v.B = B.data();
    v.dA = dA.data();
    v.dB = dB.data();
    v.r = r;
    v.dropout = p;
    v.key = key;
    model::lora_forward_cpu(y.data(), x.data(), v, scale, N, in, out);
    model::lora_backward_cpu(dx.data(), dy.data(), x.data(), v, scale, N, in, out);
    // GPU.
    test::DeviceBuffer<test::bf16> gx(test::to_bf16(x)), gdy(test::to_bf16(dy)),
        gA(test::to_bf16(A)), gBs(test::to_bf16(Bs)), gy(test::to_bf16(y0)),
        gdx(test::to_bf16(dx0));
    test::DeviceBuffer<float> gdA(std::vector<float>(A.size(), 0.0f)),
        gdB(std::vector<float>(B.size(), 0.0f));
    model::LoraDeviceAdapter a;
    a.A = gA.get();
    a.Bs = gBs.get();
    a.dA = gdA.get();
    a.dB = gdB.get();
    a.r = r;
    a.scale = scale;
    a.dropout = p;
    a.key = key;
    model::lora_forward_cuda(gy.get(), gx.get(), a, N, in, out, s.get());
    model::lora_backward_cuda(gdx.get(), gdy.get(), gx.get(), a, N, in, out, s.get());
    s.sync();
    test::check_nmse("y", test::download_f32(gy), y, kNmseBranch);
    test::check_nmse("dx", test::download_f32(gdx), dx, kNmseBranch);
    test::check_nmse("dA", gdA.download(), dA, kNmseBranch);
    test::check_nmse("dB", gdB.download(), dB, kNmseBranch);
    test::check_guards("branch", gx, gdy, gA, gBs, gy, gdx, gdA, gdB);
  }
  // The mask itself, element by element: the device hash is the host's.
  const double p = 0.25;
  const uint64_t key = model::lora_dropout_key(5, 9, 0, model::Proj::kQ);
  test::DeviceBuffer<test::bf16> ones(test::to_bf16(std::vector<float>(size_t(N * in), 1.0f)));
  model::lora_dropout_cuda(ones.get(), ones.get(), p, key, N, in, s.get());
  s.sync();
  const std::vector<float> m = test::download_f32(ones);
  int64_t wrong = 0, kept = 0;
  for (int64_t n = 0; n < N; ++n)
    for (int64_t i = 0; i < in; ++i) {
      const bool keep = model::lora_dropout_keep(key, n, i, in, p);
      kept += keep;
      const float want = keep ? test::to_f32(test::to_bf16(float(1.0 / (1.0 - p)))) : 0.0f;
      wrong += m[size_t(n * in + i)] != want;
    }
  CHECK(wrong == 0);
  CHECK(kept > 0);
  CHECK(kept < N * in);
#endif
}

TEST_CASE(
    "lora cuda: the GPU LoRA model matches the CPU LoRA model; one AdamW step; adapters off") {
  RLHF_SKIP_WITHOUT_CUDA_DEVICE();
#ifdef RLHF_CUDA
  for (HeadKind head : {HeadKind::kLM, HeadKind::kReward})
    for (double dropout : {0.0, 0.1}) {
      if (head == HeadKind::kReward && dropout > 0) continue;
      CAPTURE(model::to_string(head));
      CAPTURE(dropout);
      const model::ModelConfig cfg = test::small_gpu_config(4, 2, 97);
      const model::ParamLayout layout(cfg, head);
      model::LocalParams<float> P(layout);
      init_base(P);
      model::LoraConfig lc = lora_cfg(dropout, 17);
      lc.save_score = head != HeadKind::kLM;  // as make_pair's stores
      const model::LoraLayout ll(model::layer_spec(cfg), int(cfg.num_hidden_layers), lc);
      const std::vector<float> adapters = random_adapter(ll, 4);
      Pair m = make_pair(layout, P, lc, &adapters);
      const int64_t B = 2, T = 11, N = B * T;
      const auto tokens = test::random_tokens(N, cfg.vocab_size, 5);
      std::vector<int32_t> targets(static_cast<size_t>(N));
      for (int64_t n = 0; n < N; ++n)
        targets[size_t(n)] = n % T == T - 1 ? -1 : tokens[size_t(n + 1)];
      const auto dout = test::random_vec<float>(N, 8);
      std::vector<float> out_c(static_cast<size_t>(N)), out_g(static_cast<size_t>(N));
      m.cpu_store().zero_grads();
      m.gpu_store().zero_grads();
      if (head == HeadKind::kLM) {
        m.cpu->forward_lm(tokens.data(), targets.data(), B, T, out_c.data(), nullptr, true);
        m.gpu->forward_lm(tokens.data(), targets.data(), B, T, out_g.data(), nullptr, true);
        m.cpu->backward_lm(dout.data(), nullptr);
        m.gpu->backward_lm(dout.data(), nullptr);
      } else {
        m.cpu->forward_scalar(tokens.data(), B, T, out_c.data(), true);
        m.gpu->forward_scalar(tokens.data(), B, T, out_g.data(), true);
        m.cpu->backward_scalar(dout.data());
        m.gpu->backward_scalar(dout.data());
      }
      test::check_nmse("outputs", out_g, out_c, head == HeadKind::kLM ? kNmseOutputs : kNmseValues);
      const std::vector<float> gc = grads_of(m.cpu_store()), gg = grads_of(m.gpu_store());
      test::check_nmse("adapter gradients", gg, gc, kNmseGrads);
      if (head == HeadKind::kLM) {  // gradient checkpointing recomputes the same bits (masks too)
        Pair ck = make_pair(layout, P, lc, &adapters, true);
        std::vector<float> out_k(static_cast<size_t>(N));
        ck.gpu_store().zero_grads();
        ck.gpu->forward_lm(tokens.data(), targets.data(), B, T, out_k.data(), nullptr, true);
        ck.gpu->backward_lm(dout.data(), nullptr);
        CHECK(out_k == out_g);
        CHECK(grads_of(ck.gpu_store()) == gg);
      }
      if (ll.score_offset() >= 0) {  // the trained score head's gradient, on its own
        const auto b = gc.begin() + ll.score_offset(), e = b + cfg.hidden_size;
        const auto bg = gg.begin() + ll.score_offset();
        test::check_nmse("score head gradient", std::vector<float>(bg, bg + cfg.hidden_size),
                         std::vector<float>(b, e), kNmseGrads);
      }
      // One AdamW step on each store. eps = 1 makes the first step lr·g/(|g| + 1), proportional
      // to the gradient (with a tiny eps it would be lr·sign(g), and the sign of near-zero
      // gradients is noise): the updates then compare like the gradients.
      optim::AdamWConfig ac;
      ac.eps = 1.0;
      ac.weight_decay = 0.01;
      const std::vector<float> before = adapters_of(m.cpu_store());
      const double nc = m.cpu_store().grad_sq_norm(), ng = m.gpu_store().grad_sq_norm();
      CHECK(std::abs(ng - nc) <= 5e-2 * nc);  // the gradients' nmse bound, as a norm
      m.cpu_store().adamw_step(ac, 1e-2, 1, 1.0f);
      m.gpu_store().adamw_step(ac, 1e-2, 1, 1.0f);
      std::vector<float> dc = adapters_of(m.cpu_store()), dg = adapters_of(m.gpu_store());
      for (size_t i = 0; i < dc.size(); ++i) {
        dc[i] -= before[i];
        dg[i] -= before[i];
      }
      test::check_nmse("AdamW update", dg, dc, kNmseGrads);
      // The stepped adapters reach the device before the next forward.
      if (head == HeadKind::kLM) {
        m.cpu->forward_lm(tokens.data(), targets.data(), B, T, out_c.data(), nullptr, false);
        m.gpu->forward_lm(tokens.data(), targets.data(), B, T, out_g.data(), nullptr, false);
        test::check_nmse("outputs after the step", out_g, out_c, kNmseOutputs);
        // The reference policy: adapters off, the base alone.
        auto ref_c = parallel::adapters_off_view(*m.cpu),
             ref_g = parallel::adapters_off_view(*m.gpu);
        std::vector<float> rc(static_cast<size_t>(N)), rg(static_cast<size_t>(N)), adapted(out_g);
        ref_c->forward_lm(tokens.data(), targets.data(), B, T, rc.data(), nullptr, false);
        ref_g->forward_lm(tokens.data(), targets.data(), B, T, rg.data(), nullptr, false);
        test::check_nmse("reference (adapters off)", rg, rc, kNmseOutputs);
        const test::ArrayCompare diff = test::compare_arrays(adapted.data(), rg.data(), N);
        CHECK_MESSAGE(diff.nmse > 1e-3,
                      "the adapters change the model: " << diff.summary("on vs off"));
      }
    }
#endif
}

TEST_CASE("lora cuda: the GPU engine merges the synced adapters from the frozen base") {
  RLHF_SKIP_WITHOUT_CUDA_DEVICE();
#ifdef RLHF_CUDA
  const model::ModelConfig cfg = test::small_gpu_config(4, 2, 97);
  const model::ParamLayout layout(cfg, HeadKind::kLM);
  model::LocalParams<float> P(layout);
  init_base(P);
  const model::LoraConfig lc = lora_cfg(0.0, 1);
  const model::LoraLayout ll(model::layer_spec(cfg), int(cfg.num_hidden_layers), lc);
  rollout::EngineWeights W(layout);
  for (int u = 0; u < layout.num_units(); ++u)
    std::copy(P.params(u), P.params(u) + layout.unit(u).numel, W.unit_buffer(u));
  const int64_t bs = 4;
  rollout::KvCache kv(cfg, 64 * 2 * 2 * 2 * 2 * bs * 32, bs, 2, false);
  rollout::EngineCuda e(layout, std::move(kv), 4, false, {}, &W);
  std::vector<float> engine_adapters(size_t(ll.numel()), 0.0f);  // the engine's sync target
  e.set_lora(&ll, engine_adapters.data());
  const int64_t Tp = 9, V = cfg.vocab_size;
  const auto prompt = test::random_tokens(Tp, V, 3);
  const std::vector<int32_t> blocks = {0, 1, 2};
  for (uint64_t sync = 0; sync < 2; ++sync) {  // two syncs: each merge starts from the base
    CAPTURE(sync);
    const std::vector<float> a = random_adapter(ll, 40 + sync);
    std::copy(a.begin(), a.end(), engine_adapters.begin());
    e.prepare_weights(false);
    const float* lg = e.prefill(prompt.data(), Tp, blocks.data());
    const std::vector<float> got(lg, lg + V);
    e.prepare_weights(false);  // merging again changes nothing
    const float* lg2 = e.prefill(prompt.data(), Tp, blocks.data());
    CHECK(std::equal(got.begin(), got.end(), lg2));
    // The CPU model with the adapters unmerged: the last prompt position's logits.
    model::Transformer<float> net(layout);
    net.set_lora(&ll, a.data(), nullptr);
    std::vector<float> ref(size_t(Tp * V));
    net.forward_logits(P, prompt.data(), 1, Tp, ref.data());
    test::check_nmse("engine logits vs the CPU LoRA model", got,
                     std::vector<float>(ref.end() - V, ref.end()), 2e-4);
  }
  for (int u = 0; u < layout.num_units(); ++u)  // the host base is never written
    CHECK(std::equal(P.params(u), P.params(u) + layout.unit(u).numel, W.unit_buffer(u)));
#endif
}
