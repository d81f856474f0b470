// `rlhf bench partial` on a tiny model (bench/bench_partial.h): the row is produced, the carried
// samples of the keep steps continue on the KV their engine kept (no prefill of their tokens),
// the recompute steps prefill them again, and every kind of step generates what it must. On the
// CPU engine, and on the GPU engine where there is a device (the emulator in CI: the numbers mean
// nothing there). Named *_cuda.cpp so that the emulator binary runs it too.
#include "bench/bench_partial.h"

#include <mpi.h>

#include "tests/ops/cuda_test_util.h"
#include "tests/rollout/engine_test_util.h"

using namespace rlhf;

namespace {

// One bench partial row for a tiny model: 8 groups a step, 4 new tokens, one straggler of 16.
nlohmann::json run_tiny(const model::ModelConfig& config, bool cuda) {
  test::init_mpi();
  bench::BenchPartialOptions o;
  o.config = config;
  o.samples = 8;
  o.short_tokens = 4;
  o.long_factor = 4;
  o.prompt_len = 4;
  o.steps = 4;
  o.cuda = cuda;
  std::vector<nlohmann::json> rows;
  bench::run_bench_partial(o, [&](const nlohmann::json& r) { rows.push_back(r); });
  REQUIRE(rows.size() == 1);
  return rows[0];
}

void check_row(const nlohmann::json& r) {
  INFO(r.dump());
  CHECK(r["bench"] == "partial");
  CHECK(r["steps"].get<int64_t>() == 3);
  CHECK(r["sync_step_s"].get<double>() > 0);
  CHECK(r["ratio"].get<double>() > 0);
  CHECK(r["ratio_recompute"].get<double>() > 0);
  // The straggler and some of the margin's groups are carried every step; those with tokens go
  // on from their kept blocks, so the keep steps prefill fewer tokens than the recompute steps.
  CHECK(r["carried_mean"].get<double>() > 0);
  CHECK(r["partial_kv_resumed_mean"].get<double>() > 0);
  CHECK(r["partial_prefill_tokens"].get<int64_t>() <
        r["partial_recompute_prefill_tokens"].get<int64_t>());
  // A synchronous step generates 7 × 4 + 16 tokens.
  CHECK(r["gen_tokens_sync"].get<int64_t>() == 7 * 4 + 16);
  CHECK(r["gen_tokens_partial"].get<int64_t>() > 0);
}

}  // namespace

TEST_CASE("bench partial: keep and recompute steps on a tiny CPU engine") {
  test::ScopedThreads t(1);
  check_row(run_tiny(test::tiny_engine_config("llama", 64), false));
}

TEST_CASE("bench partial: keep and recompute steps on a tiny GPU engine") {
  RLHF_SKIP_WITHOUT_CUDA_DEVICE();
#ifdef RLHF_CUDA
  check_row(run_tiny(test::small_gpu_config(4, 2, 97), true));
#endif
}
