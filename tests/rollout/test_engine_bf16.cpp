// The CPU engine in bf16 (EngineOptions::bf16) against the bf16 trainer (Transformer::set_bf16):
// greedy decoding with the KV cache (prefill through oneDNN, decode through the bf16 packed kernel)
// gives the tokens of the trainer's bf16 forward_logits argmax over the whole prefix, with
// log-probs within a stated tolerance; decode stays batch-invariant (a request's completion is
// bitwise its own in any batch). Skips with a message when the build has no oneDNN.
#include <cmath>
#include <map>

#include "model/init.h"
#include "model/ops/matmul_bf16.h"
#include "model/transformer.h"
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
model::ModelConfig tiny_bf16_model() {
  return test::tiny_engine_config("qwen2", 64);
}

std::unique_ptr<Engine> bf16_engine(const model::ParamLayout& layout, bool bf16) {
  EngineOptions o;
  o.bf16 = bf16;
  o.eos_token_id = -2;  // no stop token: every request runs to its length
  auto e = std::make_unique<Engine>(layout, o);
  for (int u = 0; u < layout.num_units(); ++u) {
    // std 0.15: distributions far from flat, so argmax ties are unlikely.
    model::init_unit_params(e->unit_buffer(u), layout.unit(u), 21, 0.15);
    for (const model::TensorInfo& t : layout.unit(u).tensors)
      if (t.name.ends_with(".bias")) {
        auto b = test::random_vec<float>(t.numel, 5 + uint64_t(t.offset), -0.2, 0.2);
        std::copy(b.begin(), b.end(), e->unit_buffer(u) + t.offset);
      }
  }
  return e;
}

GenerationRequest greedy_request(uint64_t id, int64_t prompt_len, int64_t max_new) {
  GenerationRequest r;
  r.id = id;
  r.prompt = test::random_tokens(prompt_len, 58, 70 + id);
  r.prompt[0] = 59;
  r.max_new_tokens = max_new;
  r.sampling.greedy = true;
  return r;
}

}  // namespace

TEST_CASE("bf16 engine: greedy tokens equal the bf16 trainer's argmax; decode is batch-invariant") {
  if (!model::onednn_available()) {
    MESSAGE("skipped: this build has no oneDNN (bf16 compute on the CPU is off)");
    return;
  }
  const model::ModelConfig cfg = tiny_bf16_model();
  model::ParamLayout layout(cfg, model::HeadKind::kLM);
  model::Transformer<float> net(layout);
  net.set_bf16(true);
  auto engine = bf16_engine(layout, true);
  std::vector<GenerationRequest> reqs;
  for (int i = 0; i < 3; ++i) reqs.push_back(greedy_request(uint64_t(i), 3 + 7 * i, 10));
  const auto results = engine->generate(reqs);
  REQUIRE(results.size() == reqs.size());
  const int64_t V = cfg.vocab_size;
  double max_lp_diff = 0;
  for (const GenerationResult& r : results) {
    const GenerationRequest& q = reqs[size_t(r.request_index)];
    // The reference: the whole prefix through the bf16 trainer each step, argmax, log softmax.
    std::vector<int32_t> seq = q.prompt, ref;
    std::vector<double> ref_lp;
    for (int64_t step = 0; step < q.max_new_tokens; ++step) {
      const int64_t T = int64_t(seq.size());
      std::vector<float> logits(size_t(T * V));
      net.forward_logits(engine->provider(), seq.data(), 1, T, logits.data());
      const float* last = logits.data() + (T - 1) * V;
      int32_t best = 0;
      for (int64_t i = 1; i < V; ++i)
        if (last[i] > last[best]) best = int32_t(i);
      double m = -INFINITY, s = 0;
      for (int64_t i = 0; i < V; ++i) m = std::max(m, double(last[i]));
      for (int64_t i = 0; i < V; ++i) s += std::exp(double(last[i]) - m);
      ref_lp.push_back(double(last[best]) - m - std::log(s));
      ref.push_back(best);
      seq.push_back(best);
    }
    INFO("request ", r.request_index);
    CHECK(r.tokens == ref);
    REQUIRE(r.logprobs.size() == ref_lp.size());
    for (size_t j = 0; j < ref_lp.size(); ++j)
      max_lp_diff = std::max(max_lp_diff, std::fabs(double(r.logprobs[j]) - ref_lp[j]));
  }
  // The engine's GEMMs sum the same bf16 products in another order (the packed kernel vs
  // oneDNN) and round their outputs to bf16, so an activation may land one bf16 step away.
  MESSAGE("max |engine lp - trainer lp| in bf16 = ", max_lp_diff);
  CHECK(max_lp_diff <= 2e-2);

  // The bf16 engine is not the fp32 one: the same requests decode to other log-probs.
  auto fp32 = bf16_engine(layout, false);
  const auto r32 = fp32->generate(reqs);
  double lp_gap = 0;
  for (const GenerationResult& a : r32)
    for (const GenerationResult& b : results)
      if (a.request_index == b.request_index)
        for (size_t j = 0; j < std::min(a.logprobs.size(), b.logprobs.size()); ++j)
          lp_gap = std::max(lp_gap, double(std::fabs(a.logprobs[j] - b.logprobs[j])));
  MESSAGE("max |bf16 engine lp - fp32 engine lp| = ", lp_gap);
  CHECK(lp_gap > 1e-4);

  // Batch invariance: each request alone gives bitwise its completion in the batch.
  for (const GenerationResult& r : results) {
    const auto alone = engine->generate({reqs[size_t(r.request_index)]});
    REQUIRE(alone.size() == 1);
    CHECK(alone[0].tokens == r.tokens);
    CHECK(alone[0].logprobs == r.logprobs);
  }
}
