// Tensor-parallel engine (TP 2, Megatron-style split of heads and MLP columns, all-reduce on the
// engine's comm): greedy tokens equal the TP 1 engine's on the same weights, log-probs agree to
// fp32 summation order, both ranks of the engine return bit-identical results, its KV cache holds
// half the KV heads, and a TP size that does not divide the heads is refused; the same with LoRA
// adapters (each rank applies its slice of them, unmerged in prefill, merged in decode).
#include <doctest/doctest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "model/init.h"
#include "model/lora.h"
#include "parallel/comm.h"
#include "parallel/mpi_check.h"
#include "rollout/engine.h"
#include "tests/mpi/train_util.h"
#include "tests/rollout/engine_test_util.h"
#include "tests/test_util.h"

using namespace rlhf;

namespace {

model::ModelConfig tp_config(bool qwen2_bias, int64_t kv_heads) {
  return test::tiny_engine_config(qwen2_bias ? "qwen2" : "llama", 96, !qwen2_bias, kv_heads);
}

std::unique_ptr<rollout::Engine> make_engine(const model::ModelConfig& cfg, parallel::Comm* tp) {
  model::ParamLayout layout(cfg, model::HeadKind::kLM);
  rollout::EngineOptions o;
  o.tp_comm = tp;
  o.kv_cache_bytes = 4 << 20;
  auto e = std::make_unique<rollout::Engine>(layout, o);
  for (int u = 0; u < layout.num_units(); ++u) {
    model::init_unit_params(e->unit_buffer(u), layout.unit(u), 5, 0.1);
    for (const model::TensorInfo& t : layout.unit(u).tensors)
      if (t.name.ends_with(".bias")) {
        auto b = test::random_vec<float>(t.numel, 9 + uint64_t(t.offset), -0.2, 0.2);
        std::copy(b.begin(), b.end(), e->unit_buffer(u) + t.offset);
      }
  }
  return e;
}

std::vector<rollout::GenerationRequest> requests(bool greedy) {
  std::vector<rollout::GenerationRequest> reqs;
  const int64_t lens[] = {1, 7, 19, 4, 30};
  for (int i = 0; i < 5; ++i) {
    rollout::GenerationRequest r;
    r.id = uint64_t(i);
    r.prompt = test::random_tokens(lens[i], 58, uint64_t(20 + i));
    r.prompt[0] = 59;
    r.n_samples = i % 2 + 1;
    r.max_new_tokens = 16 + 3 * i;
    r.sampling.greedy = greedy;
    r.sampling.seed = 3;
    reqs.push_back(r);
  }
  return reqs;
}

// Largest |log-prob difference| over the results whose tokens are equal.
double max_logprob_diff(const std::vector<rollout::GenerationResult>& a,
                        const std::vector<rollout::GenerationResult>& b) {
  double d = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].tokens != b[i].tokens) continue;
    for (size_t t = 0; t < a[i].logprobs.size(); ++t)
      d = std::max(d, double(std::fabs(a[i].logprobs[t] - b[i].logprobs[t])));
  }
  return d;
}

}  // namespace

TEST_CASE("tensor-parallel engine (TP 2) with LoRA adapters: TP 1's tokens, every sync re-sliced") {
  const int world = parallel::comm_size(MPI_COMM_WORLD);
  const int rank = parallel::comm_rank(MPI_COMM_WORLD);
  if (world % 2 != 0) return;
  MPI_Comm pair_mpi = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, rank / 2, rank, &pair_mpi);
  auto pair = parallel::make_comm(pair_mpi, "engine_comm");
  for (const bool qwen2 : {false, true}) {  // qwen2: q/k/v biases
    const auto cfg = tp_config(qwen2, 2);
    auto base = make_engine(cfg, nullptr);  // the same weights without adapters
    auto one = make_engine(cfg, nullptr);
    auto two = make_engine(cfg, pair.get());
    for (const uint64_t sync : {1, 2}) {  // a second adapter sync: sliced and merged afresh
      test::set_random_adapters(*one, sync);
      test::set_random_adapters(*two, sync);
      for (const bool greedy : {true, false}) {
        INFO(cfg.model_type, greedy ? " greedy" : " sampled", " sync ", sync);
        const auto reqs = requests(greedy);
        const auto a = one->generate(reqs);
        const auto b = two->generate(reqs);
        REQUIRE(a.size() == b.size());
        size_t equal = 0;  // sampled too: log-probs 1e-6 apart pick the same tokens
        for (size_t i = 0; i < a.size(); ++i) equal += a[i].tokens == b[i].tokens;
        CHECK(equal == a.size());
        const double tp_diff = max_logprob_diff(a, b);
        CHECK(tp_diff < 1e-4);
        // The adapters change the model: a sliced-away adapter would be the base model.
        const auto c = base->generate(reqs);
        int64_t differ = 0;
        for (size_t i = 0; i < a.size(); ++i) differ += a[i].tokens != c[i].tokens;
        if (rank == 0)
          MESSAGE("TP 2 vs TP 1 max |d log-prob| ", tp_diff, "; adapters vs base: ", differ, " of ",
                  a.size(), " results differ, max |d log-prob| ", max_logprob_diff(a, c));
        CHECK((differ > 0 || max_logprob_diff(a, c) > 1e-2));
        CHECK(test::same_on_all_ranks(test::results_fingerprint(b), pair_mpi));
      }
    }
    // Sleep frees the adapter slices and the merge scratch with the rest (the plan's count).
    const rollout::Engine::MemoryPlan plan = two->memory_plan();
    CHECK(two->sleep() == plan.backend.sleep_frees);
    CHECK(two->wake() > 0);
    const auto reqs = requests(true);
    const auto a = one->generate(reqs);
    const auto b = two->generate(reqs);
    for (size_t i = 0; i < a.size(); ++i) CHECK(a[i].tokens == b[i].tokens);
  }
  pair.reset();
  MPI_Comm_free(&pair_mpi);
}

TEST_CASE("tensor-parallel engine (TP 2): greedy tokens equal TP 1, ranks agree bit for bit") {
  const int world = parallel::comm_size(MPI_COMM_WORLD);
  const int rank = parallel::comm_rank(MPI_COMM_WORLD);
  if (world % 2 != 0) return;
  MPI_Comm pair_mpi = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, rank / 2, rank, &pair_mpi);
  auto pair = parallel::make_comm(pair_mpi, "engine_comm");
  REQUIRE(pair->size() == 2);
  for (const bool qwen2 : {false, true}) {
    const auto cfg = tp_config(qwen2, 2);
    auto one = make_engine(cfg, nullptr);
    auto two = make_engine(cfg, pair.get());
    CHECK(two->tp_size() == 2);
    CHECK(two->tp_rank() == rank % 2);
    CHECK(two->kv_cache().bytes_per_token() * 2 == one->kv_cache().bytes_per_token());
    for (const bool greedy : {true, false}) {
      INFO(cfg.model_type, greedy ? " greedy" : " sampled");
      const auto reqs = requests(greedy);
      const auto a = one->generate(reqs);
      const auto b = two->generate(reqs);
      REQUIRE(a.size() == b.size());
      double max_diff = 0;
      for (size_t i = 0; i < a.size(); ++i) {
        if (greedy) CHECK(a[i].tokens == b[i].tokens);
        if (a[i].tokens != b[i].tokens) continue;
        for (size_t t = 0; t < a[i].logprobs.size(); ++t)
          max_diff = std::max(max_diff, double(std::fabs(a[i].logprobs[t] - b[i].logprobs[t])));
      }
      CHECK(max_diff < 1e-4);
      // Both ranks of the engine return the same results, bit for bit.
      CHECK(test::same_on_all_ranks(test::results_fingerprint(b), pair_mpi));
    }
  }
  // Weights changed after construction (as weight sync does) are sliced again by generate().
  {
    const auto cfg = tp_config(false, 2);
    auto one = make_engine(cfg, nullptr);
    auto two = make_engine(cfg, pair.get());
    const auto reqs = requests(true);
    (void)two->generate(reqs);
    for (auto* e : {one.get(), two.get()})
      for (int u = 0; u < e->num_units(); ++u)
        model::init_unit_params(e->unit_buffer(u), e->layout().unit(u), 77, 0.1);
    const auto a = one->generate(reqs);
    const auto b = two->generate(reqs);
    for (size_t i = 0; i < a.size(); ++i) CHECK(a[i].tokens == b[i].tokens);
  }
  // 1 KV head cannot be split over 2 ranks.
  CHECK_THROWS_AS(make_engine(tp_config(false, 1), pair.get()), Error);
  pair.reset();
  MPI_Comm_free(&pair_mpi);
}

TEST_CASE(
    "tensor-parallel engine (TP 2): sleep frees the slices too; woken, a fresh engine's bits") {
  const int world = parallel::comm_size(MPI_COMM_WORLD);
  const int rank = parallel::comm_rank(MPI_COMM_WORLD);
  if (world % 2 != 0) return;
  MPI_Comm pair_mpi = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, rank / 2, rank, &pair_mpi);
  auto pair = parallel::make_comm(pair_mpi, "engine_comm");
  const auto cfg = tp_config(true, 2);  // q/k/v biases: the column-parallel bias slices count
  const auto reqs = requests(true);
  auto slept = make_engine(cfg, pair.get());
  (void)slept->generate(reqs);
  const rollout::Engine::MemoryPlan plan = slept->memory_plan();
  CHECK(slept->sleep() == plan.backend.sleep_frees);  // KV + slices + packed panels + head
  for (int u = 0; u < slept->num_units(); ++u)        // the weight sync's new weights
    model::init_unit_params(slept->unit_buffer(u), slept->layout().unit(u), 77, 0.1);
  CHECK(slept->wake() == slept->kv_cache().capacity_bytes());
  auto fresh = make_engine(cfg, pair.get());
  for (int u = 0; u < fresh->num_units(); ++u)
    model::init_unit_params(fresh->unit_buffer(u), fresh->layout().unit(u), 77, 0.1);
  CHECK(test::results_fingerprint(slept->generate(reqs)) ==
        test::results_fingerprint(fresh->generate(reqs)));
  slept.reset();
  fresh.reset();
  pair.reset();
  MPI_Comm_free(&pair_mpi);
}
