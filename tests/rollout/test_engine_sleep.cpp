// Engine sleep (--vllm_enable_sleep) on the CPU: sleep frees the KV cache's host storage and the
// backend's weight copies (the bytes memory_plan() promises), refuses while sequences are in
// flight, and after new weights arrive in the unit buffers (what weight sync writes) and wake(),
// generation equals that of an engine that never slept and was given the same weights, bit for
// bit — in fp32 and, where oneDNN is built in, in bf16.
#include <memory>
#include <vector>

#include "core/error.h"
#include "model/init.h"
#include "model/ops/matmul_bf16.h"
#include "rollout/engine.h"
#include "tests/rollout/engine_test_util.h"
#include "tests/test_util.h"

using namespace rlhf;
using rollout::Engine;
using rollout::EngineOptions;
using rollout::GenerationRequest;
using rollout::GenerationResult;

namespace {

// A tiny Qwen2 (q/k/v biases): C = 48, 2 layers, 4 heads over 2 KV heads, F = 80, V = 61.
model::ModelConfig tiny() {
  return test::tiny_engine_config("qwen2", 96);
}

// Deterministic random weights from `seed` into the engine's unit buffers (what loading and
// weight sync write).
void write_weights(Engine& e, uint64_t seed) {
  const model::ParamLayout& layout = e.layout();
  for (int u = 0; u < layout.num_units(); ++u)
    model::init_unit_params(e.unit_buffer(u), layout.unit(u), seed, 0.1);
}

std::vector<GenerationRequest> requests(bool greedy) {
  std::vector<GenerationRequest> reqs;
  for (int i = 0; i < 4; ++i) {
    GenerationRequest r;
    r.id = uint64_t(i);
    r.prompt = test::random_tokens(3 + 4 * i, 58, 70 + uint64_t(i));
    r.prompt[0] = 59;
    r.n_samples = 1 + i % 2;
    r.max_new_tokens = 12;
    r.sampling.greedy = greedy;
    r.sampling.temperature = 0.9;
    r.sampling.seed = 11;
    reqs.push_back(r);
  }
  return reqs;
}

void check_same(const std::vector<GenerationResult>& a, const std::vector<GenerationResult>& b) {
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    CHECK(a[i].tokens == b[i].tokens);
    CHECK(a[i].logprobs == b[i].logprobs);  // bit for bit
  }
}

}  // namespace

TEST_CASE("engine sleep: frees KV storage and weight copies; after wake, a never-slept engine's") {
  for (bool bf16 : {false, true}) {
    if (bf16 && !model::onednn_available()) {
      MESSAGE("skipped bf16: this build has no oneDNN");
      continue;
    }
    CAPTURE(bf16);
    const model::ParamLayout layout(tiny(), model::HeadKind::kLM);
    EngineOptions o;
    o.kv_cache_bytes = 1 << 20;
    o.block_size = 16;
    o.bf16 = bf16;
    for (bool greedy : {true, false}) {
      CAPTURE(greedy);
      Engine e(layout, o);
      write_weights(e, 7);
      const auto first = e.generate(requests(greedy));
      const Engine::MemoryPlan plan = e.memory_plan();
      CHECK_FALSE(plan.backend.device);
      CHECK(plan.backend.kv_cache == e.kv_cache().capacity_bytes());
      CHECK(plan.backend.weights > 0);
      CHECK(plan.backend.sleep_frees == plan.backend.weights + plan.backend.kv_cache);
      // The freed bytes: the KV storage and every packed / bf16 copy (counted from the vectors
      // themselves) equal the plan's (computed from the shapes).
      CHECK(e.sleep() == plan.backend.sleep_frees);
      CHECK(e.sleeping());
      CHECK(e.kv_cache().storage_released());
      CHECK(e.sleep() == 0);  // already asleep
      CHECK_THROWS_WITH_AS(e.generate(requests(greedy)), doctest::Contains("asleep"), Error);
      write_weights(e, 8);                               // the trainer's next weights
      CHECK(e.wake() == e.kv_cache().capacity_bytes());  // the copies come back in generate()
      CHECK_FALSE(e.sleeping());
      CHECK(e.wake() == 0);
      const auto after = e.generate(requests(greedy));

      Engine fresh(layout, o);  // never slept, the same weights
      write_weights(fresh, 8);
      check_same(after, fresh.generate(requests(greedy)));
      // ... and the new weights were used (different from the first weights' samples).
      bool differ = false;
      for (size_t i = 0; i < first.size(); ++i) differ |= first[i].tokens != after[i].tokens;
      CHECK(differ);
    }
  }
}

TEST_CASE("engine sleep: refused while sequences are in flight, the generation unharmed") {
  const model::ParamLayout layout(tiny(), model::HeadKind::kLM);
  EngineOptions o;
  o.kv_cache_bytes = 1 << 20;
  o.block_size = 16;
  Engine e(layout, o);
  write_weights(e, 7);
  const auto reference = e.generate(requests(true));
  int refused = 0;
  const auto during =
      e.generate(requests(true), [&](const rollout::EngineStats&, int64_t done, int64_t total) {
        (void)done;
        (void)total;
        CHECK_THROWS_WITH_AS(e.sleep(), doctest::Contains("in flight"), Error);
        ++refused;
      });
  CHECK(refused > 0);
  CHECK_FALSE(e.sleeping());
  check_same(during, reference);
  CHECK(e.sleep() > 0);  // once every sequence has finished
}

TEST_CASE("kv cache: release_storage keeps the bookkeeping; refused with blocks in use") {
  const model::ModelConfig c = tiny();
  for (int64_t eb : {4, 2}) {
    CAPTURE(eb);
    rollout::KvCache kv(c, 1 << 16, 4, eb);
    std::vector<int32_t> ids;
    REQUIRE(kv.allocate(2, ids));
    CHECK_THROWS_WITH_AS(kv.release_storage(), doctest::Contains("in flight"), Error);
    kv.release(ids);
    const int64_t peak = kv.peak_used_blocks();
    CHECK(kv.release_storage() == kv.capacity_bytes());
    CHECK(kv.storage_released());
    CHECK(kv.release_storage() == 0);
    CHECK(kv.free_blocks() == kv.num_blocks());
    CHECK(kv.peak_used_blocks() == peak);
    CHECK(kv.restore_storage() == kv.capacity_bytes());
    CHECK(kv.restore_storage() == 0);
    // Usable again: a row written reads back (fp16 rounds: values that fp16 holds exactly).
    ids.clear();
    REQUIRE(kv.allocate(1, ids));
    const int64_t row = c.num_key_value_heads * c.D();
    std::vector<float> k(static_cast<size_t>(row)), v(static_cast<size_t>(row));
    for (int64_t i = 0; i < row; ++i) {
      k[size_t(i)] = float(i) * 0.25f;
      v[size_t(i)] = -float(i) * 0.5f;
    }
    kv.write(0, ids.data(), 0, 1, k.data(), v.data());
    const int64_t D = c.D();
    for (int64_t h = 0; h < c.num_key_value_heads; ++h)
      for (int64_t d = 0; d < D; ++d) {
        const int64_t at = int64_t(ids[0]) * 4 * row + h * 4 * D + d;  // (block, head, pos 0, d)
        const float kk =
            eb == 4 ? kv.k<float>(0)[at] : model::f16_to_float(kv.k<model::f16>(0)[at]);
        CHECK(kk == k[size_t(h * D + d)]);
      }
  }
}
