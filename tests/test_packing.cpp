// Sample packing (--packing_samples): the varlen attention against one call per sample, and the
// whole model on packed rows against the same samples right-padded in rows of their own —
// log-probs, entropies, values and every parameter gradient — plus the packed token budget and
// pack_rows.
#include <algorithm>
#include <string>
#include <vector>

#include "core/error.h"
#include "model/local_provider.h"
#include "model/ops/attention.h"
#include "model/transformer.h"
#include "rl/packing.h"
#include "rl/token_budget.h"
#include "tests/test_util.h"

using namespace rlhf;
using model::HeadKind;

TEST_CASE("packing: varlen attention is bit for bit one attention call per sample") {
  // Lengths cross the 64-row block of the CPU kernel and include a 1-token sample.
  const std::vector<int32_t> len = {5, 1, 70, 13};
  const int64_t H = 4, Hkv = 2, D = 8, n = int64_t(len.size());
  std::vector<int32_t> cu = {0};
  for (int32_t l : len) cu.push_back(cu.back() + l);
  const int64_t N = cu.back();
  int64_t att_elems = 0;
  for (int32_t l : len) att_elems += H * l * l;
  auto q = test::random_vec<float>(N * H * D, 1), k = test::random_vec<float>(N * Hkv * D, 2),
       v = test::random_vec<float>(N * Hkv * D, 3), dout = test::random_vec<float>(N * H * D, 4);
  std::vector<float> out(N * H * D), att(att_elems), dq(N * H * D), dk(N * Hkv * D),
      dv(N * Hkv * D);
  model::attention_forward_varlen_cpu(out.data(), att.data(), q.data(), k.data(), v.data(),
                                      cu.data(), n, H, Hkv, D);
  model::attention_backward_varlen_cpu(dq.data(), dk.data(), dv.data(), dout.data(), att.data(),
                                       q.data(), k.data(), v.data(), cu.data(), n, H, Hkv, D);
  int64_t att_at = 0;
  for (int64_t s = 0; s < n; ++s) {
    const int64_t t0 = cu[s], T = len[s];
    std::vector<float> o1(T * H * D), a1(H * T * T), dq1(T * H * D), dk1(T * Hkv * D),
        dv1(T * Hkv * D);
    model::attention_forward_cpu(o1.data(), a1.data(), q.data() + t0 * H * D,
                                 k.data() + t0 * Hkv * D, v.data() + t0 * Hkv * D, 1, T, H, Hkv, D);
    model::attention_backward_cpu(dq1.data(), dk1.data(), dv1.data(), dout.data() + t0 * H * D,
                                  a1.data(), q.data() + t0 * H * D, k.data() + t0 * Hkv * D,
                                  v.data() + t0 * Hkv * D, 1, T, H, Hkv, D);
    INFO("sample " << s);
    CHECK(std::equal(o1.begin(), o1.end(), out.begin() + t0 * H * D));
    CHECK(std::equal(a1.begin(), a1.end(), att.begin() + att_at));
    CHECK(std::equal(dq1.begin(), dq1.end(), dq.begin() + t0 * H * D));
    CHECK(std::equal(dk1.begin(), dk1.end(), dk.begin() + t0 * Hkv * D));
    CHECK(std::equal(dv1.begin(), dv1.end(), dv.begin() + t0 * Hkv * D));
    att_at += H * T * T;
  }
  // Bad boundaries: one clear error.
  const std::vector<int32_t> bad = {0, 5, 5, 20};
  CHECK_THROWS_AS(model::attention_forward_varlen_cpu(out.data(), att.data(), q.data(), k.data(),
                                                      v.data(), bad.data(), 3, H, Hkv, D),
                  Error);
}

namespace {

model::ModelConfig packing_config(bool qwen3, bool tied) {
  model::ModelConfig c;
  c.model_type = qwen3 ? "qwen3" : "llama";
  c.hidden_size = 16;
  c.intermediate_size = 20;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  if (qwen3) c.head_dim = 6;
  c.vocab_size = 11;
  c.max_position_embeddings = 8;  // a packed row (15 tokens) may exceed it; its samples may not
  c.tie_word_embeddings = tied;
  c.rms_norm_eps = 1e-5;
  c.bos_token_id = c.eos_token_id = c.pad_token_id = 0;
  return c;
}

// Three samples of 5, 3 and 7 tokens: padded (B = 3, T = 7; targets −1 on the padding and at each
// sample's last token, plus one ignored target inside) and packed (B = 1, T = 15).
struct Samples {
  std::vector<int64_t> len = {5, 3, 7};
  int64_t B = 3, T = 7;
  std::vector<int32_t> tokens, targets;  // padded (B, T)
  rl::PackedRows packed;
  // Position of padded token (r, t) in the packed row.
  int64_t at(int64_t r, int64_t t) const { return packed.start[size_t(r)] + t; }
};

Samples make_samples(int64_t V) {
  Samples s;
  const auto toks = test::random_tokens(s.B * s.T, V, 7);
  s.tokens.assign(size_t(s.B * s.T), 0);
  s.targets.assign(size_t(s.B * s.T), -1);
  for (int64_t r = 0; r < s.B; ++r)
    for (int64_t t = 0; t < s.len[size_t(r)]; ++t) {
      s.tokens[size_t(r * s.T + t)] = toks[size_t(r * s.T + t)];
      if (t > 0) s.targets[size_t(r * s.T + t - 1)] = toks[size_t(r * s.T + t)];
    }
  s.targets[size_t(2 * s.T + 3)] = -1;
  s.packed = rl::pack_rows(s.tokens.data(), s.targets.data(), s.B, s.T, s.len);
  return s;
}

// One forward (for backward) and backward of the head `head` on the padded and the packed layout
// with the same per-token loss weights; the outputs of real tokens and every gradient must agree
// to tol (relative to the largest gradient of the tensor).
template <typename T>
void check_packed_model(const model::ModelConfig& cfg, HeadKind head, bool checkpointing,
                        double tol, const std::string& name) {
  const Samples s = make_samples(cfg.vocab_size);
  model::ParamLayout layout(cfg, head);
  model::LocalParams<T> P(layout);
  P.init(123, 0.3);
  model::Transformer<T> net(layout, checkpointing);
  const int64_t N = s.B * s.T, Np = s.packed.T;
  const auto w = test::random_vec<T>(N, 8);  // padded per-token loss weights
  std::vector<T> wp(static_cast<size_t>(Np)), wpe(static_cast<size_t>(Np));
  const auto we = test::random_vec<T>(N, 9);
  for (int64_t r = 0; r < s.B; ++r)
    for (int64_t t = 0; t < s.len[size_t(r)]; ++t) {
      wp[size_t(s.at(r, t))] = w[size_t(r * s.T + t)];
      wpe[size_t(s.at(r, t))] = we[size_t(r * s.T + t)];
    }
  std::vector<T> wpad(w), wepad(we);  // zero on the padding: it takes no part in the loss
  for (int64_t r = 0; r < s.B; ++r)
    for (int64_t t = s.len[size_t(r)]; t < s.T; ++t)
      wpad[size_t(r * s.T + t)] = wepad[size_t(r * s.T + t)] = 0;

  std::vector<std::vector<T>> grads[2];
  std::vector<T> out[2], ent[2];
  for (int packed = 0; packed < 2; ++packed) {
    P.zero_grads();
    const int64_t B = packed ? 1 : s.B, Tl = packed ? Np : s.T;
    const int32_t* tok = packed ? s.packed.tokens.data() : s.tokens.data();
    const model::SeqLens seqs = packed ? s.packed.seqs() : model::SeqLens{};
    out[packed].assign(size_t(B * Tl), T(0));
    ent[packed].assign(size_t(B * Tl), T(0));
    if (head == HeadKind::kLM) {
      const int32_t* tgt = packed ? s.packed.targets.data() : s.targets.data();
      net.forward_lm(P, tok, tgt, B, Tl, out[packed].data(), ent[packed].data(), true, T(1.25),
                     seqs);
      net.backward_lm(P, packed ? wp.data() : wpad.data(), packed ? wpe.data() : wepad.data());
    } else {
      net.forward_scalar(P, tok, B, Tl, out[packed].data(), true, seqs);
      net.backward_scalar(P, packed ? wp.data() : wpad.data());
    }
    for (int u = 0; u < layout.num_units(); ++u)
      grads[packed].emplace_back(P.grads(u), P.grads(u) + layout.unit(u).numel);
  }
  for (int64_t r = 0; r < s.B; ++r)
    for (int64_t t = 0; t < s.len[size_t(r)]; ++t) {
      INFO(name << " sample " << r << " token " << t);
      CHECK(double(out[1][size_t(s.at(r, t))]) ==
            doctest::Approx(double(out[0][size_t(r * s.T + t)])).epsilon(tol));
      if (head == HeadKind::kLM)
        CHECK(double(ent[1][size_t(s.at(r, t))]) ==
              doctest::Approx(double(ent[0][size_t(r * s.T + t)])).epsilon(tol));
    }
  for (int u = 0; u < layout.num_units(); ++u) {
    const auto c = test::compare_arrays(grads[1][size_t(u)].data(), grads[0][size_t(u)].data(),
                                        int64_t(grads[0][size_t(u)].size()));
    double scale = 0;
    for (T g : grads[0][size_t(u)]) scale = std::max(scale, std::abs(double(g)));
    INFO(c.summary(name + " unit " + layout.unit(u).name));
    CHECK(scale > 0);
    CHECK(c.max_abs_err <= tol * scale);
  }
}

}  // namespace

TEST_CASE("packing: packed rows = padded rows in outputs and every gradient (double)") {
  // Tolerance 1e-10 relative: the packed and padded passes sum the same terms in another order
  // (GEMMs over other row counts), so they agree to a few ulps of double.
  for (bool qwen3 : {false, true})
    for (bool tied : {false, true})
      for (HeadKind head : {HeadKind::kLM, HeadKind::kValue})
        for (bool ckpt : {false, true}) {
          const std::string name = fmt::format("qwen3={} tied={} head={} ckpt={}", qwen3, tied,
                                               model::to_string(head), ckpt);
          check_packed_model<double>(packing_config(qwen3, tied), head, ckpt, 1e-10, name);
        }
}

TEST_CASE("packing: packed rows = padded rows in float") {
  // fp32: the same sums in another order, 1e-4 relative (outputs and gradients ~1e-6 measured).
  check_packed_model<float>(packing_config(false, false), HeadKind::kLM, false, 1e-4, "fp32 lm");
  check_packed_model<float>(packing_config(true, true), HeadKind::kValue, false, 1e-4,
                            "fp32 value");
}

TEST_CASE("packing: a packed forward sweep equals the packed forward, samples bit for bit") {
  const auto cfg = packing_config(false, true);
  const Samples s = make_samples(cfg.vocab_size);
  model::ParamLayout layout(cfg, HeadKind::kLM);
  model::LocalParams<float> P(layout);
  P.init(5, 0.3);
  model::Transformer<float> net(layout, false);
  std::vector<float> lp(static_cast<size_t>(s.packed.T)), swept(static_cast<size_t>(s.packed.T)),
      padded(s.tokens.size());
  net.forward_lm(P, s.packed.tokens.data(), s.packed.targets.data(), 1, s.packed.T, lp.data(),
                 nullptr, false, 1.0f, s.packed.seqs());
  // A padded batch and the packed one in one sweep: each equals its own forward.
  std::vector<model::ForwardBatch<float>> batches = {
      {s.tokens.data(), s.targets.data(), s.B, s.T, padded.data()},
      {s.packed.tokens.data(), s.packed.targets.data(), 1, s.packed.T, swept.data(),
       s.packed.seqs()}};
  net.forward_lm_sweep(P, batches);
  CHECK(swept == lp);
  std::vector<float> padded1(s.tokens.size());
  net.forward_lm(P, s.tokens.data(), s.targets.data(), s.B, s.T, padded1.data(), nullptr, false);
  CHECK(padded == padded1);
  // A sample longer than max_position_embeddings is refused; the packed row itself may be longer.
  const std::vector<int32_t> cu = {0, 2, int32_t(s.packed.T)};  // a 13-token sample
  CHECK_THROWS_WITH_AS(
      net.forward_lm(P, s.packed.tokens.data(), s.packed.targets.data(), 1, s.packed.T, lp.data(),
                     nullptr, false, 1.0f, model::SeqLens{cu.data(), 2}),
      doctest::Contains("exceeds max_position_embeddings"), Error);
  const std::vector<int32_t> short_cu = {0, 5, 9};  // does not cover the row
  CHECK_THROWS_AS(
      net.forward_lm(P, s.packed.tokens.data(), s.packed.targets.data(), 1, s.packed.T, lp.data(),
                     nullptr, false, 1.0f, model::SeqLens{short_cu.data(), 2}),
      Error);
}

TEST_CASE("packing: token budgets count packed tokens; pack_rows drops the padding") {
  const std::vector<int64_t> len = {6, 2, 9, 3, 3};
  // Padded: (items) x (longest) <= 12 gives {6, 2} {9} {3, 3}; packed: sums <= 12 or 20.
  using Runs = std::vector<std::pair<int64_t, int64_t>>;
  CHECK(rl::token_budget_runs(len, 12) == Runs{{0, 2}, {2, 3}, {3, 5}});
  CHECK(rl::token_budget_runs(len, 12, 1, true) == Runs{{0, 2}, {2, 4}, {4, 5}});
  CHECK(rl::token_budget_runs(len, 20, 1, true) == Runs{{0, 4}, {4, 5}});
  const std::vector<int32_t> tok = {1, 2, 0, 3, 0, 0, 4, 5, 6};
  const rl::PackedRows p = rl::pack_rows(tok.data(), nullptr, 3, 3, {2, 1, 3});
  CHECK(p.tokens == std::vector<int32_t>{1, 2, 3, 4, 5, 6});
  CHECK(p.cu == std::vector<int32_t>{0, 2, 3, 6});
  CHECK(p.start == std::vector<int64_t>{0, 2, 3});
  CHECK(p.T == 6);
  CHECK_THROWS_AS(rl::pack_rows(tok.data(), nullptr, 3, 3, {2, 0, 3}), Error);
}
