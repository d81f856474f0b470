// The whole model on the GPU (TransformerCuda) against the CPU model (Transformer<float>) on the
// same bf16-valued weights and tokens: log-probs, entropy, values, and every parameter gradient,
// over tied/untied heads, both RoPE styles, GQA, q/k/v bias, the value head, gradient
// checkpointing and the chunked LM head; the packed q/k/v path (one GEMM, RoPE in the split)
// against the three separate projections.
#include "model/transformer.h"

#include <functional>

#include "model/local_provider.h"
#include "tests/ops/cuda_test_util.h"

#ifdef RLHF_CUDA
#include "model/transformer_cuda.h"
#endif

using namespace rlhf;
using model::HeadKind;

#ifdef RLHF_CUDA
namespace {

// Every unit's params (bf16) and grads (fp32) whole in device memory: the simplest
// UnitProviderCuda (the production one is parallel/zero3_cuda.h).
class TestParamsCuda : public model::UnitProviderCuda {
 public:
  TestParamsCuda(model::LocalParams<float>& host, cudaStream_t s) : layout_(host.layout()), s_(s) {
    for (int u = 0; u < layout_.num_units(); ++u) {
      const int64_t n = layout_.unit(u).numel;
      std::vector<float> p(host.params(u), host.params(u) + n);
      params_.push_back(std::make_unique<test::DeviceBuffer<test::bf16>>(test::to_bf16(p)));
      grads_.push_back(
          std::make_unique<test::DeviceBuffer<float>>(std::vector<float>(size_t(n), 0.0f)));
    }
  }
  const model::bf16* acquire_params(int u) override {
    ++acquired.at(size_t(u));
    return params_.at(size_t(u))->get();
  }
  void release_params(int) override {}
  float* acquire_grads(int u) override { return grads_.at(size_t(u))->get(); }
  void release_grads(int) override {}
  cudaStream_t stream() const override { return s_; }
  std::vector<float> grads(int u) const { return grads_.at(size_t(u))->download(); }
  std::vector<int> acquired = std::vector<int>(64, 0);  // acquire_params calls per unit
  bool guards_intact() const {
    for (const auto& p : params_)
      if (!p->guards_intact()) return false;
    for (const auto& g : grads_)
      if (!g->guards_intact()) return false;
    return true;
  }

 private:
  const model::ParamLayout& layout_;
  cudaStream_t s_;
  std::vector<std::unique_ptr<test::DeviceBuffer<test::bf16>>> params_;
  std::vector<std::unique_ptr<test::DeviceBuffer<float>>> grads_;
};

model::ModelConfig small_config(model::RopeStyle style, bool tied, bool bias, int64_t H,
                                int64_t Hkv) {
  model::ModelConfig c = test::small_gpu_config(H, Hkv);
  c.model_type = bias ? "qwen2" : "llama";
  c.rope_style = style;
  c.tie_word_embeddings = tied;
  return c;
}

struct Case {
  std::string name;
  model::ModelConfig cfg;
  HeadKind head;
  bool checkpointing = false;
  int64_t logit_chunk_bytes = model::TransformerCuda::kLogitChunkBytes;
};

// Bounds (nmse against the fp32 CPU model on the same bf16 weights). The GPU model rounds every
// activation to bf16 (relative error 2^-9 per op) and keeps the residual stream and activation
// gradients in bf16; through 2 layers that compounds to a relative error of ~1% per element.
//  - lp, entropy: measured nmse <= 5e-7 (emulator); values (one bf16-rounded output per token)
//    1.5e-5. Bound 1e-4, while a wrong op (say a missing residual or a transposed weight) gives
//    nmse ~1e-1.
//  - parameter gradients: products of two bf16-rounded activation(-gradient) streams summed over
//    N tokens; measured nmse up to 7.6e-5; bound 1e-3. A gradient of the wrong tensor or sign is
//    nmse ~1.
constexpr double kNmseOutputs = 1e-4;
constexpr double kNmseGrads = 1e-3;

void check_case(const Case& cs) {
  const int64_t B = 3, T = 13, N = B * T;
  model::ParamLayout layout(cs.cfg, cs.head);
  model::LocalParams<float> P(layout);
  P.init(7, 0.05);
  for (int u = 0; u < layout.num_units(); ++u)
    for (const auto& t : layout.unit(u).tensors)
      if (t.name.find("norm") != std::string::npos || t.name.find("bias") != std::string::npos) {
        auto r = test::random_vec<float>(t.numel, 1000 + u, 0.5, 1.5);
        std::copy(r.begin(), r.end(), P.params(u) + t.offset);
      }
  test::round_params_bf16(P);  // both sides see exactly the bf16 weights
  const auto tokens = test::random_tokens(N, cs.cfg.vocab_size, 5);
  std::vector<int32_t> targets(N);
  for (int64_t n = 0; n < N; ++n) targets[n] = (n % T == T - 1) ? -1 : tokens[n + 1];
  targets[4] = -1;
  const auto a = test::random_vec<float>(N, 8), b = test::random_vec<float>(N, 9);
  const float inv_temp = 1.0f / 0.7f;

  model::Transformer<float> cpu(layout, false);
  std::vector<float> out_ref(N), ent_ref(N), out(N), ent(N);
  test::TestStream s;
  TestParamsCuda D(P, s.get());
  model::TransformerCuda gpu(layout, cs.checkpointing, cs.logit_chunk_bytes);
  MESSAGE(cs.name << ": q/k/v " << std::string(gpu.fused_qkv() ? "packed (one GEMM)" : "separate"));
  if (cs.head == HeadKind::kLM) {
    cpu.forward_lm(P, tokens.data(), targets.data(), B, T, out_ref.data(), ent_ref.data(), true,
                   inv_temp);
    cpu.backward_lm(P, a.data(), b.data());
    gpu.forward_lm(D, tokens.data(), targets.data(), B, T, out.data(), ent.data(), true, inv_temp);
    gpu.backward_lm(D, a.data(), b.data());
    test::check_nmse(cs.name + " lp", out, out_ref, kNmseOutputs);
    test::check_nmse(cs.name + " entropy", ent, ent_ref, kNmseOutputs);
    for (int64_t n = 0; n < N; ++n)
      if (targets[n] == -1) CHECK(out[n] == 0.0f);
  } else {
    cpu.forward_scalar(P, tokens.data(), B, T, out_ref.data(), true);
    cpu.backward_scalar(P, a.data());
    gpu.forward_scalar(D, tokens.data(), B, T, out.data(), true);
    gpu.backward_scalar(D, a.data());
    test::check_nmse(cs.name + " values", out, out_ref, kNmseOutputs);
  }
  for (int u = 0; u < layout.num_units(); ++u) {
    const int64_t n = layout.unit(u).numel;
    std::vector<float> ref(P.grads(u), P.grads(u) + n);
    test::check_nmse(cs.name + " grads of unit " + std::to_string(u), D.grads(u), ref, kNmseGrads);
  }
  CHECK(D.guards_intact());
}

// lp and every unit's gradients of one LM forward + backward (B = 2 sequences of T tokens,
// random tokens and dlp from `seed`) of a fresh TransformerCuda that `make` builds on P's
// weights. For comparing variants of the GPU model with each other.
struct LmRun {
  std::vector<float> lp;
  std::vector<std::vector<float>> grads;  // by unit
};
LmRun run_lm(const model::ParamLayout& layout, model::LocalParams<float>& P, int64_t T,
             uint64_t seed, const std::function<model::TransformerCuda()>& make) {
  const int64_t B = 2, N = B * T;
  const auto tokens = test::random_tokens(N, layout.config().vocab_size, seed);
  std::vector<int32_t> targets(tokens.begin() + 1, tokens.end());
  targets.push_back(-1);
  const auto dlp = test::random_vec<float>(N, seed + 1);
  test::TestStream s;
  TestParamsCuda D(P, s.get());
  model::TransformerCuda gpu = make();
  LmRun r;
  r.lp.resize(size_t(N));
  gpu.forward_lm(D, tokens.data(), targets.data(), B, T, r.lp.data(), nullptr, true);
  gpu.backward_lm(D, dlp.data(), nullptr);
  for (int u = 0; u < layout.num_units(); ++u) r.grads.push_back(D.grads(u));
  return r;
}

}  // namespace
#endif

TEST_CASE("transformer cuda vs cpu: lp, entropy, values and every gradient") {
  RLHF_SKIP_WITHOUT_CUDA_DEVICE();
#ifdef RLHF_CUDA
  using model::RopeStyle;
  check_case({"lm(rotate_half,untied,GQA)",
              small_config(RopeStyle::kRotateHalf, false, false, 4, 2), HeadKind::kLM});
  check_case({"lm(interleaved,tied,qkv bias,MHA)",
              small_config(RopeStyle::kInterleaved, true, true, 4, 4), HeadKind::kLM});
  check_case({"lm(checkpointing)", small_config(RopeStyle::kRotateHalf, true, false, 4, 1),
              HeadKind::kLM, true});
  // 2 rows of logits per chunk: forward and backward go over 20 chunks, backward recomputes.
  check_case({"lm(chunked head)", small_config(RopeStyle::kRotateHalf, false, true, 8, 2),
              HeadKind::kLM, false, 2 * 256 * 2});
  check_case(
      {"value head", small_config(RopeStyle::kRotateHalf, false, false, 4, 2), HeadKind::kValue});
  // Qwen3: q_norm/k_norm between the (unpacked) projections and RoPE, head_dim 32 != C / H.
  model::ModelConfig q3 = small_config(RopeStyle::kRotateHalf, true, false, 4, 2);
  q3.model_type = "qwen3";
  q3.head_dim = 32;
  check_case({"lm(qwen3 q/k norm, head_dim 32)", q3, HeadKind::kLM});
  check_case({"lm(qwen3, checkpointing)", q3, HeadKind::kLM, true});
#endif
}

TEST_CASE("transformer cuda: checkpointing and the chunked head change nothing") {
  RLHF_SKIP_WITHOUT_CUDA_DEVICE();
#ifdef RLHF_CUDA
  // The same GPU model three ways must give the same bits: recomputation repeats the forward
  // kernels on the same inputs, and a chunked head computes the same rows.
  const auto cfg = small_config(model::RopeStyle::kRotateHalf, true, false, 4, 2);
  model::ParamLayout layout(cfg, HeadKind::kLM);
  model::LocalParams<float> P(layout);
  P.init(3, 0.05);
  std::vector<std::vector<float>> lps;
  std::vector<std::vector<std::vector<float>>> grads;  // [variant][unit]
  for (int variant = 0; variant < 3; ++variant) {
    LmRun r = run_lm(layout, P, 9, 1, [&] {
      return model::TransformerCuda(
          layout, variant == 1,
          variant == 2 ? 3 * 256 * 2 : model::TransformerCuda::kLogitChunkBytes);
    });
    lps.push_back(std::move(r.lp));
    grads.push_back(std::move(r.grads));
  }
  CHECK(lps[1] == lps[0]);
  CHECK(lps[2] == lps[0]);
  for (int u = 0; u < layout.num_units(); ++u) {
    CHECK(grads[1][u] == grads[0][u]);
    // The chunked head sums the head weight's gradient (the tied embedding here) chunk by chunk:
    // another fp32 summation order for that unit, the same bits everywhere else.
    if (u == layout.embedding_unit())
      test::check_nmse("chunked head: embedding grads", grads[2][u], grads[0][u],
                       test::kNmseF32Out);
    else
      CHECK(grads[2][u] == grads[0][u]);
  }
#endif
}

TEST_CASE("transformer cuda: the packed q/k/v path follows the separate projections") {
  RLHF_SKIP_WITHOUT_CUDA_DEVICE();
#ifdef RLHF_CUDA
  // Packed when q·C, kv·C (and q, kv with biases) are multiples of the 64-element alignment.
  CHECK(model::TransformerCuda(
            model::ParamLayout(small_config(model::RopeStyle::kRotateHalf, false, true, 8, 2),
                               HeadKind::kLM))
            .fused_qkv() == false);  // kv = 16: the biases are not back to back
  for (bool bias : {false, true}) {
    const auto cfg = small_config(model::RopeStyle::kInterleaved, false, bias, 4, 4);
    model::ParamLayout layout(cfg, HeadKind::kLM);
    model::LocalParams<float> P(layout);
    P.init(4, 0.05);
    LmRun run[2];
    for (int fused = 0; fused < 2; ++fused)
      run[fused] = run_lm(layout, P, 11, 2, [&] {
        model::TransformerCuda gpu(layout);
        REQUIRE(gpu.fused_qkv());
        gpu.set_fused_qkv(fused == 1);
        CHECK(gpu.fused_qkv() == (fused == 1));
        return gpu;
      });
    // The forward computes the same products and sums (the split rotates exactly as
    // rope_forward_cuda): measured bit-identical lp on the emulator; on a GPU cuBLASLt may pick
    // another K-order for the wider output, a bf16 rounding flip (bound: one bf16 rounding). In
    // backward the packed path sums dq·Wq + dk·Wk + dv·Wv in one fp32 GEMM and rounds dx to bf16
    // once, where the separate path rounds after each of the three: measured nmse 1e-5 on the
    // first layer's gradients, inside the CPU-comparison bound. A wrong slice of the packed
    // weight or a missing inverse rotation gives nmse ~1.
    const std::string name = bias ? "packed q/k/v with bias" : "packed q/k/v";
    test::check_nmse(name + " lp", run[1].lp, run[0].lp, test::kNmseBf16Out);
    for (int u = 0; u < layout.num_units(); ++u)
      test::check_nmse(name + " grads of unit " + std::to_string(u), run[1].grads[u],
                       run[0].grads[u], kNmseGrads);
  }
#endif
}

TEST_CASE("transformer cuda: bad token ids are refused on the host") {
  RLHF_SKIP_WITHOUT_CUDA_DEVICE();
#ifdef RLHF_CUDA
  const auto cfg = small_config(model::RopeStyle::kRotateHalf, false, false, 4, 2);
  model::ParamLayout layout(cfg, HeadKind::kLM);
  model::LocalParams<float> P(layout);
  P.init(3, 0.05);
  test::TestStream s;
  TestParamsCuda D(P, s.get());
  model::TransformerCuda gpu(layout);
  std::vector<int32_t> tokens = {1, 2, 256, 3}, targets = {2, 3, 4, -1};
  std::vector<float> lp(4);
  CHECK_THROWS_WITH(
      gpu.forward_lm(D, tokens.data(), targets.data(), 1, 4, lp.data(), nullptr, false),
      doctest::Contains("token id 256 at position 2"));
  tokens[2] = 5;
  targets[1] = -2;
  CHECK_THROWS_WITH(
      gpu.forward_lm(D, tokens.data(), targets.data(), 1, 4, lp.data(), nullptr, false),
      doctest::Contains("target -2 at position 1"));
  CHECK_THROWS_WITH(gpu.backward_lm(D, lp.data(), nullptr), doctest::Contains("backward_lm needs"));
#endif
}

TEST_CASE(
    "transformer cuda: a forward sweep gives one forward a batch's outputs, one acquire a unit") {
  RLHF_SKIP_WITHOUT_CUDA_DEVICE();
#ifdef RLHF_CUDA
  const std::vector<Case> cases = {
      {"llama tied lm", small_config(model::RopeStyle::kRotateHalf, true, false, 4, 2),
       HeadKind::kLM},
      {"qwen2 untied lm, chunked head",
       small_config(model::RopeStyle::kInterleaved, false, true, 4, 2), HeadKind::kLM, false,
       5 * 256 * 2},
      {"value head", small_config(model::RopeStyle::kRotateHalf, false, false, 4, 4),
       HeadKind::kValue}};
  for (const Case& cs : cases) {
    SUBCASE(cs.name.c_str()) {
      model::ParamLayout layout(cs.cfg, cs.head);
      model::LocalParams<float> P(layout);
      P.init(7, 0.05);
      const bool lm = cs.head == HeadKind::kLM;
      const std::vector<int64_t> Bs{3, 1, 2}, Ts{7, 9, 4};
      std::vector<std::vector<int32_t>> tokens, targets;
      for (size_t i = 0; i < Bs.size(); ++i) {
        tokens.push_back(test::random_tokens(Bs[i] * Ts[i], cs.cfg.vocab_size, 50 + i));
        targets.push_back(test::random_tokens(Bs[i] * Ts[i], cs.cfg.vocab_size, 60 + i));
        targets.back()[1] = -1;
      }
      test::TestStream s;
      TestParamsCuda D(P, s.get());
      model::TransformerCuda gpu(layout, false, cs.logit_chunk_bytes);
      const float inv_temp = 1.0f / 0.7f;
      std::vector<std::vector<float>> one(Bs.size()), swept(Bs.size());
      for (size_t i = 0; i < Bs.size(); ++i) {
        one[i].assign(size_t(Bs[i] * Ts[i]), 0.0f);
        if (lm)
          gpu.forward_lm(D, tokens[i].data(), targets[i].data(), Bs[i], Ts[i], one[i].data(),
                         nullptr, false, inv_temp);
        else
          gpu.forward_scalar(D, tokens[i].data(), Bs[i], Ts[i], one[i].data(), false);
      }
      const std::vector<int> per_batch = D.acquired;
      std::fill(D.acquired.begin(), D.acquired.end(), 0);
      std::vector<model::ForwardBatch<float>> batches;
      for (size_t i = 0; i < Bs.size(); ++i) {
        swept[i].assign(size_t(Bs[i] * Ts[i]), -99.0f);
        batches.push_back({tokens[i].data(), targets[i].data(), Bs[i], Ts[i], swept[i].data()});
      }
      if (lm)
        gpu.forward_lm_sweep(D, batches, inv_temp);
      else
        gpu.forward_scalar_sweep(D, batches);
      for (size_t i = 0; i < Bs.size(); ++i) CHECK(swept[i] == one[i]);
      for (int u = 0; u < layout.num_units(); ++u) {
        CHECK(per_batch[size_t(u)] == 3 * D.acquired[size_t(u)]);
        CHECK(D.acquired[size_t(u)] == ((cs.cfg.tie_word_embeddings && lm && u == 0) ? 2 : 1));
      }
      // A bad id in the last batch is refused on the host before anything runs.
      if (lm) {
        tokens[2][3] = int32_t(cs.cfg.vocab_size);
        CHECK_THROWS_WITH_AS(gpu.forward_lm_sweep(D, batches, inv_temp),
                             doctest::Contains("token id"), Error);
      }
      CHECK(D.guards_intact());
    }
  }
#endif
}

TEST_CASE("transformer cuda: packed rows (sample packing) follow the CPU packed model") {
  RLHF_SKIP_WITHOUT_CUDA_DEVICE();
#ifdef RLHF_CUDA
  // Samples of 7, 40, 1 and 20 tokens in one row of 68: the 40-token sample crosses key tiles of
  // 32 and query tiles of 16, and starts inside both. The CPU packed model equals the padded one
  // (tests/test_packing.cpp); the GPU one is held to the CPU-comparison bounds of check_case.
  const std::vector<int32_t> cu = {0, 7, 47, 48, 68};
  const int64_t N = cu.back(), n = int64_t(cu.size()) - 1;
  for (HeadKind head : {HeadKind::kLM, HeadKind::kValue}) {
    const auto cfg = small_config(model::RopeStyle::kRotateHalf, false, false, 4, 2);
    model::ParamLayout layout(cfg, head);
    model::LocalParams<float> P(layout);
    P.init(3, 0.05);
    test::round_params_bf16(P);
    const auto tokens = test::random_tokens(N, cfg.vocab_size, 21);
    std::vector<int32_t> targets(size_t(N), -1);
    for (int64_t s = 0; s < n; ++s)
      for (int32_t t = cu[s]; t + 1 < cu[s + 1]; ++t) targets[size_t(t)] = tokens[size_t(t + 1)];
    const auto a = test::random_vec<float>(N, 8);
    const model::SeqLens seqs{cu.data(), n};
    model::Transformer<float> cpu(layout, false);
    std::vector<float> out_ref(static_cast<size_t>(N)), out(static_cast<size_t>(N)),
        swept(static_cast<size_t>(N));
    test::TestStream s;
    TestParamsCuda D(P, s.get());
    model::TransformerCuda gpu(layout);
    const std::string name = head == HeadKind::kLM ? "packed lm" : "packed value";
    if (head == HeadKind::kLM) {
      cpu.forward_lm(P, tokens.data(), targets.data(), 1, N, out_ref.data(), nullptr, true, 1.0f,
                     seqs);
      cpu.backward_lm(P, a.data(), nullptr);
      gpu.forward_lm(D, tokens.data(), targets.data(), 1, N, out.data(), nullptr, true, 1.0f, seqs);
      gpu.backward_lm(D, a.data(), nullptr);
      gpu.forward_lm_sweep(D, {{tokens.data(), targets.data(), 1, N, swept.data(), seqs}});
    } else {
      cpu.forward_scalar(P, tokens.data(), 1, N, out_ref.data(), true, seqs);
      cpu.backward_scalar(P, a.data());
      gpu.forward_scalar(D, tokens.data(), 1, N, out.data(), true, seqs);
      gpu.backward_scalar(D, a.data());
      gpu.forward_scalar_sweep(D, {{tokens.data(), nullptr, 1, N, swept.data(), seqs}});
    }
    test::check_nmse(name + " outputs", out, out_ref, kNmseOutputs);
    CHECK(swept == out);  // the sweep runs the same kernels on the same shapes
    for (int u = 0; u < layout.num_units(); ++u) {
      const int64_t numel = layout.unit(u).numel;
      std::vector<float> ref(P.grads(u), P.grads(u) + numel);
      test::check_nmse(name + " grads of unit " + std::to_string(u), D.grads(u), ref, kNmseGrads);
    }
    CHECK(D.guards_intact());
  }
#endif
}
