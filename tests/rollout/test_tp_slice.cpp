// One rank's slice of a projection with its LoRA adapter (rollout/tp_slice.h), for every
// projection of a layer with biases and TP 2 and 4: the merged slice W_s + (α/r)·B_s·A_s equals
// the slice of the merged full weight bit for bit (the slice taken here by index arithmetic), the
// bias goes with the output rows or to rank 0 alone, the unmerged adapter branch on the slices
// gives this rank's output columns (column parallel) or, summed over the ranks, the full branch
// (row parallel); and model::lora_merge_cpu against a double-precision reference.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "model/arch.h"
#include "model/lora.h"
#include "model/projections.h"
#include "rollout/engine_backend.h"
#include "rollout/tp_slice.h"
#include "tests/rollout/engine_test_util.h"
#include "tests/test_util.h"

using namespace rlhf;

namespace {

// Rows [r0, r0 + n) and columns [c0, c0 + m) of a row-major matrix with `cols` columns.
std::vector<float> block(const std::vector<float>& a, int64_t cols, int64_t r0, int64_t n,
                         int64_t c0, int64_t m) {
  std::vector<float> out;
  for (int64_t r = r0; r < r0 + n; ++r)
    for (int64_t c = c0; c < c0 + m; ++c) out.push_back(a[size_t(r * cols + c)]);
  return out;
}

bool same_bits(const float* a, const std::vector<float>& b) {
  return std::memcmp(a, b.data(), b.size() * sizeof(float)) == 0;
}

}  // namespace

TEST_CASE("tp slice: merged LoRA slices equal the slices of the merged weight, bit for bit") {
  const int64_t r = 3;
  const float scale = 16.0f / 3.0f;
  for (const int T : {2, 4}) {
    // llama with attention_bias: q/k/v (column) and o_proj (row) biases; 4 KV heads for 4 ranks.
    model::ModelConfig cfg = test::tiny_engine_config("llama", 64, false, 4);
    cfg.attention_bias = true;
    const model::LayerSpec full_spec = model::layer_spec(cfg);
    for (const model::ProjInfo& pi : model::kProjections) {
      const model::Projection full = model::projection(full_spec, pi.id);
      const bool column = pi.split == model::TpSplit::kColumn;
      const auto W = test::random_vec<float>(full.in * full.out, 11 + uint64_t(pi.id), -0.5, 0.5);
      const auto b = test::random_vec<float>(full.out, 21 + uint64_t(pi.id), -0.5, 0.5);
      const auto A = test::random_vec<float>(r * full.in, 31 + uint64_t(pi.id), -0.5, 0.5);
      const auto B = test::random_vec<float>(full.out * r, 41 + uint64_t(pi.id), -0.5, 0.5);
      std::vector<float> merged = W;
      model::lora_merge_cpu(merged.data(), A.data(), B.data(), scale, r, full.in, full.out);
      model::LoraProjView<float> adapter;
      adapter.A = A.data();
      adapter.B = B.data();
      adapter.r = r;
      // The unmerged branch of the full adapter on N rows of input.
      const int64_t N = 5;
      const auto x = test::random_vec<float>(N * full.in, 51 + uint64_t(pi.id), -1.0, 1.0);
      std::vector<float> y_full(size_t(N * full.out), 0.0f), y_sum(y_full.size(), 0.0f);
      model::lora_forward_cpu(y_full.data(), x.data(), adapter, scale, N, full.in, full.out);
      rollout::TpProjSlice sl;
      for (int rank = 0; rank < T; ++rank) {
        CAPTURE(T);
        CAPTURE(rank);
        CAPTURE(pi.name);
        const model::LayerSpec spec =
            rollout::tp_layer_spec(cfg, rollout::TpGroup{nullptr, T, rank});
        const model::Projection p = model::projection(spec, pi.id);
        REQUIRE(p.in * p.out * T == full.in * full.out);
        const int64_t o0 = column ? rank * p.out : 0, i0 = column ? 0 : rank * p.in;
        rollout::tp_slice_projection(p, T, rank, W.data(), p.bias ? b.data() : nullptr, adapter,
                                     sl);
        // The base slice, and the merged slice against the slice of the merged weight.
        CHECK(same_bits(sl.weight, block(W, full.in, o0, p.out, i0, p.in)));
        std::vector<float> m(sl.weight, sl.weight + p.in * p.out);
        REQUIRE(sl.lora.A != nullptr);
        CHECK(sl.lora.r == r);
        model::lora_merge_cpu(m.data(), sl.lora.A, sl.lora.B, scale, r, p.in, p.out);
        CHECK(same_bits(m.data(), block(merged, full.in, o0, p.out, i0, p.in)));
        // Column parallel: this rank's rows of B, all of A; row parallel: its columns of A.
        CHECK(same_bits(sl.lora.A, block(A, full.in, 0, r, i0, p.in)));
        CHECK(same_bits(sl.lora.B, block(B, r, o0, p.out, 0, r)));
        // The bias: this rank's entries (column), or whole on rank 0 alone (row).
        CHECK(p.bias == (pi.block == model::ProjBlock::kAttention));
        if (!p.bias)
          CHECK(sl.bias == nullptr);
        else if (column)
          CHECK(same_bits(sl.bias, block(b, full.out, 0, 1, o0, p.out)));
        else
          CHECK(sl.bias == (rank == 0 ? b.data() : nullptr));
        const int64_t copied =
            int64_t(sl.w.size() + sl.b.size() + sl.lora_a.size() + sl.lora_b.size());
        CHECK(rollout::tp_slice_copied_floats(p, p.bias, r) == copied);
        // The unmerged branch on this rank's input columns: its output columns (column), or a
        // partial sum of the full branch (row).
        const std::vector<float> xs = block(x, full.in, 0, N, i0, p.in);
        std::vector<float> ys(size_t(N * p.out), 0.0f);
        model::lora_forward_cpu(ys.data(), xs.data(), sl.lora, scale, N, p.in, p.out);
        for (int64_t n = 0; n < N; ++n)
          for (int64_t o = 0; o < p.out; ++o)
            y_sum[size_t(n * full.out + o0 + o)] += ys[size_t(n * p.out + o)];
      }
      CAPTURE(pi.name);
      for (size_t k = 0; k < y_full.size(); ++k)
        CHECK(y_sum[k] == doctest::Approx(y_full[k]).epsilon(1e-5));
      // No adapter: no LoRA view.
      rollout::tp_slice_projection(
          model::projection(rollout::tp_layer_spec(cfg, {nullptr, T, 1}), pi.id), T, 1, W.data(),
          nullptr, model::LoraProjView<float>{}, sl);
      CHECK(sl.lora.A == nullptr);
    }
  }
  // A projection without a split is refused.
  model::ProjInfo none = model::proj_info(model::Proj::kQ);
  none.split = model::TpSplit::kNone;
  model::Projection p =
      model::projection(model::layer_spec(test::tiny_engine_config("llama", 64)), model::Proj::kQ);
  p.info = &none;
  std::vector<float> w(size_t(p.in * p.out));
  rollout::TpProjSlice sl;
  CHECK_THROWS_AS(
      rollout::tp_slice_projection(p, 2, 0, w.data(), nullptr, model::LoraProjView<float>{}, sl),
      Error);
}

TEST_CASE("lora_merge_cpu: W + sign·scale·B·A against a double-precision reference") {
  for (const auto& [r, in, out] : {std::array<int64_t, 3>{1, 7, 5}, {8, 300, 9}, {16, 513, 70}}) {
    CAPTURE(r);
    CAPTURE(in);
    CAPTURE(out);
    const auto W = test::random_vec<float>(out * in, 1, -1.0, 1.0);
    const auto A = test::random_vec<float>(r * in, 2, -1.0, 1.0);
    const auto B = test::random_vec<float>(out * r, 3, -1.0, 1.0);
    std::vector<float> m = W;
    model::lora_merge_cpu(m.data(), A.data(), B.data(), 0.75f, r, in, out);
    double worst = 0;
    for (int64_t o = 0; o < out; ++o)
      for (int64_t i = 0; i < in; ++i) {
        double ref = 0;
        for (int64_t k = 0; k < r; ++k) ref += double(B[size_t(o * r + k)]) * A[size_t(k * in + i)];
        ref = W[size_t(o * in + i)] + 0.75 * ref;
        worst = std::max(worst, std::fabs(ref - m[size_t(o * in + i)]));
      }
    CHECK(worst < 1e-5 * double(r));
    model::lora_merge_cpu(m.data(), A.data(), B.data(), 0.75f, r, in, out, -1.0f);  // unmerge
    for (size_t k = 0; k < W.size(); ++k) CHECK(m[k] == doctest::Approx(W[k]).epsilon(1e-5));
  }
}
