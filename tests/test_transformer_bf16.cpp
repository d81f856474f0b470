// The CPU model's bf16 compute mode (model/layer_bf16.h, Transformer::set_bf16):
//  - one projection, forward and both backward GEMMs, against a double GEMM over the bf16-rounded
//    operands (the definition of the mode), within one bf16 rounding of the outputs;
//  - the whole model's log-probs and parameter gradients against the fp64 model (no rounding)
//  within
//    bf16 tolerances, and further from it than the fp32 model is (the bf16 path really ran);
//  - gradient checkpointing and the forward sweeps give bit-identical results in bf16 too (the
//    per-pass weight copies are reused correctly);
//  - every weight is read as its bf16 value: fp32 weights and the same weights rounded to bf16
//    beforehand give bit-identical outputs and gradients (norm weights, biases, embedding too);
//  - a few AdamW steps of bf16 training track fp32 training;
//  - with attention's products in bf16 too (--attn_implementation onednn), packed into two
//    64-token blocks: log-probs and gradients against fp64 within the same bounds, different from
//    the fp32-kernel attention, and gradient checkpointing bit-identical.
// Every case skips with a message when the build has no oneDNN.
#include <algorithm>
#include <cmath>

#include "model/init.h"
#include "model/layer_bf16.h"
#include "model/local_provider.h"
#include "model/ops/attention_bf16.h"
#include "model/ops/matmul_bf16.h"
#include "model/transformer.h"
#include "parallel/param_store.h"
#include "parallel/train_model.h"
#include "tests/test_util.h"

using namespace rlhf;
using model::HeadKind;

namespace {

bool have_onednn() {
  if (model::onednn_available()) return true;
  MESSAGE("skipped: this build has no oneDNN (bf16 compute on the CPU is off)");
  return false;
}

double rb(double x) {
  return double(model::round_to_bf16(float(x)));
}

// Tolerance of one bf16 rounding of a value whose exact (double) result is ref: the
// fp32-accumulated sum may round to the neighbouring bf16 value (2^-8 relative spacing), plus a
// small absolute floor for values near zero.
bool within_one_bf16(double calc, double ref) {
  return std::fabs(calc - ref) <= std::ldexp(std::fabs(ref), -7) + 1e-6;
}

model::ModelConfig tiny(const char* type, bool tied, int head_dim = 0) {
  model::ModelConfig c;
  c.model_type = type;
  c.hidden_size = 32;
  c.intermediate_size = 48;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = head_dim;
  c.vocab_size = 37;
  c.max_position_embeddings = 32;
  c.tie_word_embeddings = tied;
  c.rms_norm_eps = 1e-5;
  c.bos_token_id = c.eos_token_id = c.pad_token_id = 0;
  return c;
}

// The same random parameters as float and double (norm weights and biases random too).
void init_pair(const model::ParamLayout& layout, model::LocalParams<float>& f,
               model::LocalParams<double>& d, uint64_t seed) {
  d.init(seed, 0.15);
  for (int u = 0; u < layout.num_units(); ++u) {
    for (const auto& t : layout.unit(u).tensors)
      if (t.name.find("norm") != std::string::npos || t.name.find("bias") != std::string::npos) {
        auto r = test::random_vec<double>(t.numel, 1000 + uint64_t(u), 0.5, 1.5);
        std::copy(r.begin(), r.end(), d.params(u) + t.offset);
      }
    for (int64_t i = 0; i < layout.unit(u).numel; ++i) f.params(u)[i] = float(d.params(u)[i]);
  }
}

}  // namespace

TEST_CASE("bf16 projection: forward and both backward GEMMs equal a double GEMM on bf16 operands") {
  if (!have_onednn()) return;
  const int64_t N = 9, IC = 40, OC = 24;
  auto x = test::random_vec<float>(N * IC, 1);
  auto w = test::random_vec<float>(OC * IC, 2, -0.3, 0.3);
  auto bias = test::random_vec<float>(OC, 3);
  auto dy = test::random_vec<float>(N * OC, 4);
  std::vector<model::bfloat16> wb(size_t(OC * IC));
  model::float_to_bf16_n(wb.data(), w.data(), OC * IC);
  model::LayerBf16 b;
  b.w.weight(model::Proj::kO) = wb.data();

  std::vector<float> y(size_t(N * OC));
  model::project_forward_bf16(b, model::Proj::kO, y.data(), x.data(), bias.data(), N, IC, OC);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < OC; ++o) {
      double s = bias[size_t(o)];
      for (int64_t i = 0; i < IC; ++i) s += rb(x[size_t(n * IC + i)]) * rb(w[size_t(o * IC + i)]);
      const float yo = y[size_t(n * OC + o)];
      INFO("y[", n, ",", o, "] = ", yo, " ref ", s);
      CHECK(yo == model::round_to_bf16(yo));  // the output is rounded to bf16
      CHECK(within_one_bf16(yo, s));
    }

  // Backward: dx accumulates onto a prior value (the K/V projections add into d ln1).
  auto dx = test::random_vec<float>(N * IC, 5);
  const std::vector<float> dx0 = dx;
  std::vector<float> dw(size_t(OC * IC), 0.5f), db(size_t(OC), 0.25f);
  model::project_backward_bf16(b, model::Proj::kO, dx.data(), dw.data(), db.data(), dy.data(),
                               x.data(), N, IC, OC, true);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t i = 0; i < IC; ++i) {
      double s = dx0[size_t(n * IC + i)];
      for (int64_t o = 0; o < OC; ++o) s += rb(dy[size_t(n * OC + o)]) * rb(w[size_t(o * IC + i)]);
      const float v = dx[size_t(n * IC + i)];
      CHECK(v == model::round_to_bf16(v));
      CHECK(within_one_bf16(v, s));
    }
  for (int64_t o = 0; o < OC; ++o) {
    double sb = 0.25;
    for (int64_t n = 0; n < N; ++n) sb += dy[size_t(n * OC + o)];  // fp32 dy, unrounded
    CHECK(db[size_t(o)] == doctest::Approx(sb).epsilon(1e-6));
    for (int64_t i = 0; i < IC; ++i) {
      double s = 0.5;
      for (int64_t n = 0; n < N; ++n) s += rb(dy[size_t(n * OC + o)]) * rb(x[size_t(n * IC + i)]);
      // fp32 gradients: only the accumulation's round-off.
      CHECK(dw[size_t(o * IC + i)] == doctest::Approx(s).epsilon(1e-5));
    }
  }
}

TEST_CASE("bf16 model: log-probs and gradients against the fp64 model within bf16 tolerance") {
  if (!have_onednn()) return;
  struct Case {
    const char* name;
    model::ModelConfig cfg;
    HeadKind head;
  };
  const Case cases[] = {
      {"llama untied", tiny("llama", false), HeadKind::kLM},
      {"qwen2 tied, qkv bias", tiny("qwen2", true), HeadKind::kLM},
      {"qwen3 qk-norm, head_dim 6", tiny("qwen3", true, 6), HeadKind::kLM},
      {"value head", tiny("llama", false), HeadKind::kValue},
  };
  for (const Case& cs : cases) {
    CAPTURE(cs.name);
    const int64_t B = 2, T = 9, N = B * T;
    model::ParamLayout layout(cs.cfg, cs.head);
    model::LocalParams<double> Pd(layout);
    model::LocalParams<float> P32(layout), P16(layout);
    init_pair(layout, P32, Pd, 11);
    init_pair(layout, P16, Pd, 11);
    auto tokens = test::random_tokens(N, cs.cfg.vocab_size, 5);
    std::vector<int32_t> targets(N);
    for (int64_t n = 0; n < N; ++n) targets[n] = (n % T == T - 1) ? -1 : tokens[n + 1];
    auto dout = test::random_vec<double>(N, 8);
    std::vector<float> dout_f(dout.begin(), dout.end());

    model::Transformer<double> netd(layout);
    model::Transformer<float> net32(layout), net16(layout);
    net16.set_bf16(true);
    REQUIRE(net16.bf16());
    std::vector<double> outd(N);
    std::vector<float> out32(N), out16(N);
    Pd.zero_grads();
    P32.zero_grads();
    P16.zero_grads();
    if (cs.head == HeadKind::kLM) {
      netd.forward_lm(Pd, tokens.data(), targets.data(), B, T, outd.data(), nullptr, true);
      netd.backward_lm(Pd, dout.data(), nullptr);
      net32.forward_lm(P32, tokens.data(), targets.data(), B, T, out32.data(), nullptr, true);
      net32.backward_lm(P32, dout_f.data(), nullptr);
      net16.forward_lm(P16, tokens.data(), targets.data(), B, T, out16.data(), nullptr, true);
      net16.backward_lm(P16, dout_f.data(), nullptr);
    } else {
      netd.forward_scalar(Pd, tokens.data(), B, T, outd.data(), true);
      netd.backward_scalar(Pd, dout.data());
      net32.forward_scalar(P32, tokens.data(), B, T, out32.data(), true);
      net32.backward_scalar(P32, dout_f.data());
      net16.forward_scalar(P16, tokens.data(), B, T, out16.data(), true);
      net16.backward_scalar(P16, dout_f.data());
    }
    const auto o16 = test::compare_arrays(out16.data(), outd.data(), N);
    const auto o32 = test::compare_arrays(out32.data(), outd.data(), N);
    MESSAGE(o16.summary(std::string(cs.name) + ": bf16 outputs vs fp64"));
    MESSAGE(o32.summary(std::string(cs.name) + ": fp32 outputs vs fp64"));
    // bf16 tolerance: each rounding is <= 2^-9 relative; through two layers and the head the
    // log-probs (|lp| ~ log V ~ 3.6) and values move by a few 1e-2 (measured: <= 2.4e-2 for the
    // log-probs, 4.4e-2 for a value that is a sum with cancellation; nmse <= 6e-5).
    CHECK(o16.finite);
    CHECK(o16.max_abs_err <= 0.1);
    CHECK(o16.nmse <= 1e-3);
    // ... and the bf16 path really ran: it is much further from fp64 than fp32 is.
    CHECK(o16.max_abs_err > 20 * o32.max_abs_err);
    double worst_nmse = 0;
    for (int u = 0; u < layout.num_units(); ++u) {
      const int64_t n = layout.unit(u).numel;
      const auto g16 = test::compare_arrays(P16.grads(u), Pd.grads(u), n);
      worst_nmse = std::max(worst_nmse, g16.nmse);
      INFO(g16.summary(std::string("bf16 grads of ") + layout.unit(u).name));
      // Normalised MSE of the gradients: bf16 operands give ~1e-5..1e-4; a wrong term gives ~1.
      CHECK(g16.finite);
      CHECK(g16.nmse <= 2e-3);
    }
    MESSAGE(std::string(cs.name), ": worst gradient nmse of a unit, bf16 vs fp64: ", worst_nmse);
  }
}

TEST_CASE("bf16 model: gradient checkpointing and forward sweeps are bit-identical") {
  if (!have_onednn()) return;
  const auto cfg = tiny("qwen2", true);
  model::ParamLayout layout(cfg, HeadKind::kLM);
  const int64_t B = 3, T = 7, N = B * T;
  auto tokens = test::random_tokens(N, cfg.vocab_size, 1);
  std::vector<int32_t> targets(tokens.begin() + 1, tokens.end());
  targets.push_back(-1);
  auto dlp = test::random_vec<float>(N, 2);
  std::vector<std::vector<float>> grads[2];
  std::vector<float> lps[2];
  for (int ck = 0; ck < 2; ++ck) {
    model::LocalParams<float> P(layout);
    P.init(7, 0.2);
    model::Transformer<float> net(layout, ck == 1);
    net.set_bf16(true);
    lps[ck].resize(N);
    net.forward_lm(P, tokens.data(), targets.data(), B, T, lps[ck].data(), nullptr, true);
    net.backward_lm(P, dlp.data(), nullptr);
    for (int u = 0; u < layout.num_units(); ++u)
      grads[ck].emplace_back(P.grads(u), P.grads(u) + layout.unit(u).numel);
  }
  CHECK(lps[0] == lps[1]);
  for (size_t u = 0; u < grads[0].size(); ++u) CHECK(grads[0][u] == grads[1][u]);

  // A sweep over two batches (each unit's bf16 copy made once, used for both) = one forward each.
  model::LocalParams<float> P(layout);
  P.init(9, 0.2);
  model::Transformer<float> net(layout);
  net.set_bf16(true);
  const int64_t B2 = 1, T2 = 5;
  auto tok2 = test::random_tokens(B2 * T2, cfg.vocab_size, 3);
  auto tgt2 = test::random_tokens(B2 * T2, cfg.vocab_size, 4);
  std::vector<float> a(N), b(B2 * T2), sa(N), sb(B2 * T2);
  net.forward_lm(P, tokens.data(), targets.data(), B, T, a.data(), nullptr, false);
  net.forward_lm(P, tok2.data(), tgt2.data(), B2, T2, b.data(), nullptr, false);
  std::vector<model::ForwardBatch<float>> batches(2);
  batches[0] = {tokens.data(), targets.data(), B, T, sa.data()};
  batches[1] = {tok2.data(), tgt2.data(), B2, T2, sb.data()};
  net.forward_lm_sweep(P, batches);
  CHECK(sa == a);
  CHECK(sb == b);
  // The copies follow the weights: after a change, the next pass sees it.
  for (int64_t i = 0; i < layout.unit(1).numel; ++i) P.params(1)[i] *= 1.5f;
  std::vector<float> c(N);
  net.forward_lm(P, tokens.data(), targets.data(), B, T, c.data(), nullptr, false);
  CHECK(c != a);
  model::Transformer<float> fresh(layout);
  fresh.set_bf16(true);
  std::vector<float> d(N);
  fresh.forward_lm(P, tokens.data(), targets.data(), B, T, d.data(), nullptr, false);
  CHECK(c == d);
}

TEST_CASE("bf16 model: every weight is read as its bf16 value (norms, biases, embedding too)") {
  if (!have_onednn()) return;
  // Qwen2 (q/k/v biases, packed), untied and tied, LM and scalar heads: the bf16 model on fp32
  // weights computes exactly what it computes on the same weights rounded to bf16 beforehand (what
  // a bf16-gathering ZeRO-3 store or a bf16 weight sync hands out), in outputs and gradients.
  for (bool tied : {false, true})
    for (HeadKind head : {HeadKind::kLM, HeadKind::kValue}) {
      if (tied && head != HeadKind::kLM) continue;
      const auto cfg = tiny("qwen2", tied);
      model::ParamLayout layout(cfg, head);
      const int64_t B = 2, T = 6, N = B * T;
      const auto tokens = test::random_tokens(N, cfg.vocab_size, 11);
      std::vector<int32_t> targets(tokens.begin() + 1, tokens.end());
      targets.push_back(-1);
      const auto dout = test::random_vec<float>(N, 12);
      std::vector<float> out[2];
      std::vector<std::vector<float>> grads[2];
      for (int pre = 0; pre < 2; ++pre) {
        model::LocalParams<float> P(layout);
        model::LocalParams<double> d(layout);
        init_pair(layout, P, d, 5);  // norm weights and biases away from bf16 values
        if (pre == 1)
          for (int u = 0; u < layout.num_units(); ++u)
            model::round_to_bf16_n(P.params(u), layout.unit(u).numel);
        model::Transformer<float> net(layout);
        net.set_bf16(true);
        out[pre].resize(N);
        if (head == HeadKind::kLM) {
          net.forward_lm(P, tokens.data(), targets.data(), B, T, out[pre].data(), nullptr, true);
          net.backward_lm(P, dout.data(), nullptr);
        } else {
          net.forward_scalar(P, tokens.data(), B, T, out[pre].data(), true);
          net.backward_scalar(P, dout.data());
        }
        for (int u = 0; u < layout.num_units(); ++u)
          grads[pre].emplace_back(P.grads(u), P.grads(u) + layout.unit(u).numel);
      }
      INFO("tied ", tied, ", head ", to_string(head));
      CHECK(out[0] == out[1]);
      for (size_t u = 0; u < grads[0].size(); ++u) CHECK(grads[0][u] == grads[1][u]);
    }
}

TEST_CASE("bf16 training: a few AdamW steps track fp32 training") {
  if (!have_onednn()) return;
  const auto cfg = tiny("llama", false);
  model::ParamLayout layout(cfg, HeadKind::kLM);
  const int64_t B = 4, T = 12, N = B * T;
  optim::AdamWConfig adam;
  adam.lr = 3e-3;
  adam.weight_decay = 0.01;
  std::vector<std::vector<double>> losses(2);
  std::vector<std::vector<std::vector<float>>> weights(2);
  for (int bf16 = 0; bf16 < 2; ++bf16) {
    auto net =
        parallel::make_cpu_train_model(std::make_unique<parallel::LocalParamStore>(layout), false,
                                       nullptr, parallel::kSweepResidualBytes, bf16 == 1);
    for (int u = 0; u < layout.num_units(); ++u) {
      std::vector<float> full(size_t(layout.unit(u).numel));
      model::init_unit_params(full.data(), layout.unit(u), 3, 0.1);
      net->store().load_unit(u, full.data());
    }
    for (int s = 0; s < 6; ++s) {
      auto tokens = test::random_tokens(N, cfg.vocab_size, 100 + uint64_t(s % 2));
      std::vector<int32_t> targets(N);
      for (int64_t n = 0; n < N; ++n) targets[n] = (n % T == T - 1) ? -1 : tokens[n + 1];
      std::vector<float> lp(N), dlp(N);
      double loss = 0;
      for (int64_t n = 0; n < N; ++n) dlp[n] = targets[n] >= 0 ? -1.0f / float(B * (T - 1)) : 0;
      net->store().zero_grads();
      net->forward_lm(tokens.data(), targets.data(), B, T, lp.data(), nullptr, true);
      for (int64_t n = 0; n < N; ++n) loss -= targets[n] >= 0 ? lp[n] / double(B * (T - 1)) : 0;
      net->backward_lm(dlp.data(), nullptr);
      parallel::clip_and_step(net->store(), adam, adam.lr, s + 1, 1.0);
      losses[bf16].push_back(loss);
    }
    for (int u = 0; u < layout.num_units(); ++u) {
      weights[bf16].emplace_back(size_t(layout.unit(u).numel));
      net->store().gather_unit(u, weights[bf16].back().data());
    }
  }
  // The two alternating batches are memorised: the loss falls in both precisions.
  CHECK(losses[1].back() < losses[1].front() - 0.05);
  CHECK(losses[0].back() < losses[0].front() - 0.05);
  MESSAGE("losses fp32 ", losses[0].front(), " -> ", losses[0].back(), ", bf16 ", losses[1].front(),
          " -> ", losses[1].back());
  for (size_t s = 0; s < losses[0].size(); ++s) {
    INFO("step ", s, ": fp32 loss ", losses[0][s], ", bf16 loss ", losses[1][s]);
    CHECK(std::fabs(losses[1][s] - losses[0][s]) <= 2e-2);
  }
  // fp32 master weights: 6 AdamW steps at lr 3e-3 move each weight by <= ~2e-2; bf16 gradients
  // change the step directions of some small-gradient weights, never the scale.
  for (size_t u = 0; u < weights[0].size(); ++u) {
    const auto cmp = test::compare_arrays(weights[1][u].data(), weights[0][u].data(),
                                          int64_t(weights[0][u].size()));
    MESSAGE(cmp.summary("bf16 vs fp32 weights after 6 steps, " + layout.unit(int(u)).name));
    CHECK(cmp.max_abs_err <= 2e-2);
    CHECK(cmp.nmse <= 1e-3);
  }
}

namespace {

// Sets model::set_cpu_attention_bf16 for a scope (the flag is process-wide).
struct ScopedBf16Attention {
  bool saved = model::cpu_attention_bf16();
  explicit ScopedBf16Attention(bool on) { model::set_cpu_attention_bf16(on); }
  ~ScopedBf16Attention() { model::set_cpu_attention_bf16(saved); }
  ScopedBf16Attention(const ScopedBf16Attention&) = delete;
  ScopedBf16Attention& operator=(const ScopedBf16Attention&) = delete;
};

}  // namespace

TEST_CASE("bf16 model with bf16 attention products: tracks fp64, checkpointing bit-identical") {
  if (!have_onednn()) return;
  // Two samples of 70 tokens: two 64-token query blocks and key chunks each, GQA.
  auto cfg = tiny("qwen3", true, 8);
  cfg.max_position_embeddings = 128;
  model::ParamLayout layout(cfg, HeadKind::kLM);
  const int64_t B = 2, T = 70, N = B * T;
  auto tokens = test::random_tokens(N, cfg.vocab_size, 21);
  std::vector<int32_t> targets(N);
  for (int64_t n = 0; n < N; ++n) targets[n] = (n % T == T - 1) ? -1 : tokens[n + 1];
  auto dout = test::random_vec<double>(N, 22);
  std::vector<float> dout_f(dout.begin(), dout.end());
  model::LocalParams<double> Pd(layout);
  model::LocalParams<float> Pk(layout), Pa(layout), Pc(layout);
  init_pair(layout, Pk, Pd, 23);
  init_pair(layout, Pa, Pd, 23);
  init_pair(layout, Pc, Pd, 23);
  auto run = [&](model::Transformer<float>& net, model::LocalParams<float>& P, bool onednn) {
    const ScopedBf16Attention scope(onednn);
    std::vector<float> lp(N);
    P.zero_grads();
    net.forward_lm(P, tokens.data(), targets.data(), B, T, lp.data(), nullptr, true);
    net.backward_lm(P, dout_f.data(), nullptr);
    return lp;
  };
  model::Transformer<double> netd(layout);
  std::vector<double> lpd(N);
  Pd.zero_grads();
  netd.forward_lm(Pd, tokens.data(), targets.data(), B, T, lpd.data(), nullptr, true);
  netd.backward_lm(Pd, dout.data(), nullptr);
  model::Transformer<float> kernels(layout), onednn(layout), ckpt(layout, true);
  for (auto* n : {&kernels, &onednn, &ckpt}) n->set_bf16(true);
  const auto lpk = run(kernels, Pk, false);
  const auto lpa = run(onednn, Pa, true);
  const auto lpc = run(ckpt, Pc, true);
  // The same tolerances as the fp32-kernel bf16 model against fp64 (the case above).
  const auto o = test::compare_arrays(lpa.data(), lpd.data(), N);
  MESSAGE(o.summary("bf16 attention products: log-probs vs fp64"));
  CHECK(o.finite);
  CHECK(o.max_abs_err <= 0.1);
  CHECK(o.nmse <= 1e-3);
  CHECK(lpa != lpk);  // the bf16 products really ran
  CHECK(lpc == lpa);  // checkpointing recomputes the same attention
  for (int u = 0; u < layout.num_units(); ++u) {
    const int64_t n = layout.unit(u).numel;
    const auto g = test::compare_arrays(Pa.grads(u), Pd.grads(u), n);
    INFO(g.summary(std::string("bf16-attention grads of ") + layout.unit(u).name));
    CHECK(g.finite);
    CHECK(g.nmse <= 2e-3);
    CHECK(std::equal(Pc.grads(u), Pc.grads(u) + n, Pa.grads(u)));
  }
}

TEST_CASE("bf16 training on one rank: bf16 weight copies made once per step, bitwise the same") {
  if (!have_onednn()) return;
  // Two micro-batches a step: without the copies each of their 4 passes rounds every weight; with
  // LocalBf16Provider the copies are made once after each optimizer step, with the same bits.
  const auto cfg = tiny("qwen2", true);
  model::ParamLayout layout(cfg, HeadKind::kLM);
  const int64_t B = 2, T = 8, N = B * T, steps = 3;
  optim::AdamWConfig adam;
  adam.lr = 3e-3;
  std::vector<std::vector<float>> lps[2], weights[2];
  int64_t converted = 0;
  for (int twins = 0; twins < 2; ++twins) {
    auto store = std::make_unique<parallel::LocalParamStore>(layout, twins == 1);
    parallel::LocalParamStore* local = store.get();
    auto net = parallel::make_cpu_train_model(std::move(store), false, nullptr,
                                              parallel::kSweepResidualBytes, true);
    for (int u = 0; u < layout.num_units(); ++u) {
      std::vector<float> full(size_t(layout.unit(u).numel));
      model::init_unit_params(full.data(), layout.unit(u), 5, 0.1);
      net->store().load_unit(u, full.data());
    }
    for (int64_t s = 0; s < steps; ++s) {
      net->store().zero_grads();
      for (int mb = 0; mb < 2; ++mb) {
        auto tokens = test::random_tokens(N, cfg.vocab_size, uint64_t(10 * s + mb));
        std::vector<int32_t> targets(tokens.begin() + 1, tokens.end());
        targets.push_back(-1);
        std::vector<float> lp(N), dlp(N, -0.05f);
        net->forward_lm(tokens.data(), targets.data(), B, T, lp.data(), nullptr, true);
        net->backward_lm(dlp.data(), nullptr);
        lps[twins].push_back(lp);
      }
      parallel::clip_and_step(net->store(), adam, adam.lr, s + 1, 1.0);
    }
    for (int u = 0; u < layout.num_units(); ++u) {
      weights[twins].emplace_back(size_t(layout.unit(u).numel));
      net->store().gather_unit(u, weights[twins].back().data());
    }
    if (twins == 1) {
      REQUIRE(local->bf16_provider() != nullptr);
      converted = local->bf16_provider()->converted();
    } else {
      CHECK(local->bf16_provider() == nullptr);
    }
  }
  CHECK(lps[0] == lps[1]);
  CHECK(weights[0] == weights[1]);
  // One copy of each unit a step: all but the final norm's unit (hidden_size values), which holds
  // no GEMM weight (the tied head reads the embedding's copy).
  CHECK(converted == steps * (layout.total_numel() - cfg.hidden_size));
  MESSAGE("bf16 copies made: ", converted, " elements over ", steps, " steps of 2 micro-batches");
}

TEST_CASE("bf16 weight copies of a local store follow writes through local() and load_unit") {
  if (!have_onednn()) return;
  const auto cfg = tiny("llama", false);
  model::ParamLayout layout(cfg, HeadKind::kLM);
  const int64_t B = 1, T = 6, N = B * T;
  auto tokens = test::random_tokens(N, cfg.vocab_size, 1);
  std::vector<int32_t> targets(tokens.begin() + 1, tokens.end());
  targets.push_back(-1);
  parallel::LocalParamStore store(layout, true);
  store.local().init(3, 0.2);
  model::Transformer<float> net(layout);
  net.set_bf16(true);
  auto lp = [&](parallel::ParamStore& s) {
    std::vector<float> out(N);
    net.forward_lm(s.provider(), tokens.data(), targets.data(), B, T, out.data(), nullptr, false);
    return out;
  };
  auto fresh = [&]() {  // a store without copies holding the same weights
    parallel::LocalParamStore plain(layout);
    for (int u = 0; u < layout.num_units(); ++u) {  // gather_unit: no write access, no refresh
      std::vector<float> full(size_t(layout.unit(u).numel));
      store.gather_unit(u, full.data());
      plain.load_unit(u, full.data());
    }
    return lp(plain);
  };
  const auto a = lp(store);
  CHECK(net.bf16_converted_elements() == 0);  // every GEMM weight came from the copies
  CHECK(a == fresh());
  for (int64_t i = 0; i < layout.unit(1).numel; ++i) store.local().params(1)[i] *= 1.5f;
  const auto b = lp(store);
  CHECK(b != a);
  CHECK(b == fresh());
  std::vector<float> w(size_t(layout.unit(2).numel));
  model::init_unit_params(w.data(), layout.unit(2), 9, 0.2);
  store.load_unit(2, w.data());
  const auto c = lp(store);
  CHECK(c != b);
  CHECK(c == fresh());
}
