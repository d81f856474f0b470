// `rlhf bench gemm` on a tiny shape (it has no other test: at the model's shapes it takes a
// minute): every GEMM row and the attention rows are emitted with their fields, the fp32 attention
// kernels' row is the reference of the speedups, and the bf16 tiles' row appears exactly when the
// build has oneDNN.
#include "bench/bench_gemm.h"

#include <string>
#include <vector>

#include "model/ops/matmul_bf16.h"
#include "tests/test_util.h"

using namespace rlhf;

TEST_CASE("bench gemm: GEMM rows and the training attention rows on a tiny shape") {
  bench::BenchGemmOptions o;
  o.model = "tiny";
  o.config.hidden_size = 32;
  o.config.intermediate_size = 48;
  o.config.num_attention_heads = 4;
  o.config.num_key_value_heads = 2;
  o.config.vocab_size = 64;
  o.config.num_hidden_layers = 1;
  o.rows = 96;
  o.seq_len = 48;
  o.min_seconds = 0.001;
  std::vector<nlohmann::json> rows;
  bench::run_bench_gemm(o, [&](const nlohmann::json& r) { rows.push_back(r); });
  std::vector<nlohmann::json> att;
  int gemm_rows = 0;
  for (const auto& r : rows) {
    if (r["bench"] == "gemm_attention") att.push_back(r);
    if (r["bench"] == "gemm") ++gemm_rows;
  }
  const bool onednn = model::onednn_available();
  // 4 distinct linear shapes (q/o share 32x32) of 3 GEMMs + the LM head's forward, 1 or 3 impls.
  CHECK(gemm_rows == (3 * 3 + 1) * (onednn ? 3 : 1));
  REQUIRE(att.size() == (onednn ? 2u : 1u));
  CHECK(att[0]["impl"] == "sgemm_fp32");
  CHECK(att[0]["speedup_vs_fp32"].get<double>() == 1.0);
  for (const auto& r : att) {
    CHECK(r["B"] == 2);
    CHECK(r["T"] == 48);
    CHECK(r["H"] == 4);
    CHECK(r["Hkv"] == 2);
    CHECK(r["D"] == 8);
    CHECK(r["forward_us"].get<double>() > 0);
    CHECK(r["backward_us"].get<double>() > 0);
    CHECK(r["gflops_per_s"].get<double>() > 0);
  }
  if (onednn) CHECK(att[1]["impl"] == "onednn_bf16");
}
