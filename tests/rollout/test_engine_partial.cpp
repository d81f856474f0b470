// Partial rollouts: the engine's generation quota interrupts samples at the step the quota is met;
// a continuation (GenerationRequest::prefix, re-prefilled) gives the tokens of the uninterrupted
// sample when the weights did not change (greedy and sampled); the pool (rl/partial_rollout.h)
// records per-token weight versions, drops stale samples and regenerates them, and round-trips
// through its checkpoint form.
#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <vector>

#include "core/error.h"
#include "model/init.h"
#include "rl/partial_rollout.h"
#include "rollout/engine.h"
#include "tests/rollout/engine_test_util.h"
#include "tests/test_util.h"

using namespace rlhf;
using rollout::Engine;
using rollout::EngineOptions;
using rollout::GenerationRequest;
using rollout::GenerationResult;

namespace {

// A tiny Llama: C = 48, 2 layers, 4 heads over 2 KV heads, F = 80, V = 61, 128 positions.
model::ModelConfig tiny() {
  return test::tiny_engine_config("llama", 128);
}

std::unique_ptr<Engine> make_engine(uint64_t seed = 7) {
  model::ParamLayout layout(tiny(), model::HeadKind::kLM);
  EngineOptions opt;
  opt.ignore_eos = true;  // lengths set by max_new_tokens alone
  auto e = std::make_unique<Engine>(layout, opt);
  for (int u = 0; u < layout.num_units(); ++u)
    model::init_unit_params(e->unit_buffer(u), layout.unit(u), seed, 0.1);
  return e;
}

// Five groups (one request each, group key = index) of n samples with max_new 4, 6, 10, 20, 30.
std::vector<GenerationRequest> requests(bool greedy, int64_t n) {
  std::vector<GenerationRequest> reqs;
  const int64_t max_new[] = {4, 6, 10, 20, 30};
  for (int i = 0; i < 5; ++i) {
    GenerationRequest r;
    r.id = uint64_t(200 + i);
    r.prompt = test::random_tokens(3 + i, 58, uint64_t(i + 1));
    r.prompt[0] = 59;
    r.n_samples = n;
    r.max_new_tokens = max_new[i];
    r.sampling.seed = 5;
    r.sampling.temperature = 1.0;
    r.sampling.greedy = greedy;
    r.group = i;
    reqs.push_back(r);
  }
  return reqs;
}

// Continuation requests for every interrupted result (one sample each, its tokens as prefix).
std::vector<GenerationRequest> continuations(const std::vector<GenerationRequest>& reqs,
                                             const std::vector<GenerationResult>& res) {
  std::vector<GenerationRequest> out;
  for (const GenerationResult& g : res) {
    if (!g.interrupted) continue;
    GenerationRequest r = reqs[size_t(g.request_index)];
    r.n_samples = 1;
    r.first_sample_index = g.sample_index;
    r.prefix = g.tokens;
    r.prefix_logprobs = g.logprobs;
    out.push_back(std::move(r));
  }
  return out;
}

using Key = std::pair<uint64_t, int64_t>;

}  // namespace

TEST_CASE("partial rollouts: the quota interrupts at its step; continuing = uninterrupted") {
  for (const bool greedy : {true, false}) {
    const char* mode = greedy ? "greedy" : "sampled at T = 1";
    INFO(mode);
    auto engine = make_engine();
    const auto reqs = requests(greedy, 2);
    std::map<Key, GenerationResult> whole;
    for (auto& g : engine->generate(reqs)) whole[{g.request_id, g.sample_index}] = g;
    // Quota 2 groups: every sample runs in one batch (the KV budget holds all), so generation
    // stops at the step where the 6-token group finished; the others have 6 tokens each.
    std::vector<GenerationResult> first = engine->generate(reqs, {}, nullptr, 2);
    REQUIRE(first.size() == 10);
    for (const GenerationResult& g : first) {
      CHECK(g.interrupted == (g.request_index >= 2));
      CHECK(int64_t(g.tokens.size()) ==
            std::min<int64_t>(6, reqs[size_t(g.request_index)].max_new_tokens));
      CHECK(g.logprobs.size() == g.tokens.size());
    }
    // Continue round after round (quota 1: the shortest group left) until nothing is left.
    std::map<Key, GenerationResult> done;
    std::vector<GenerationResult> res = first;
    std::vector<GenerationRequest> round_reqs = reqs;
    int rounds = 1;
    for (;;) {
      for (GenerationResult& g : res)
        if (!g.interrupted) done[{g.request_id, g.sample_index}] = g;
      std::vector<GenerationRequest> next = continuations(round_reqs, res);
      if (next.empty()) break;
      for (auto& r : next) r.group = int64_t(r.id);
      round_reqs = next;
      res = engine->generate(round_reqs, {}, nullptr, 1);
      ++rounds;
      REQUIRE(rounds < 10);
    }
    CHECK(rounds == 4);  // 4|6, then 10, 20, 30
    REQUIRE(done.size() == whole.size());
    for (const auto& [key, w] : whole) {
      const GenerationResult& d = done.at(key);
      INFO("request ", key.first, " sample ", key.second);
      CHECK(d.tokens == w.tokens);
      CHECK(d.finish == w.finish);
      REQUIRE(d.logprobs.size() == w.logprobs.size());
      // The prefix's cache is rebuilt by a prefill, not the decode steps: the same log-probs up
      // to the kernels' summation order.
      for (size_t t = 0; t < w.logprobs.size(); ++t)
        CHECK(std::abs(d.logprobs[t] - w.logprobs[t]) < 2e-5);
    }
  }
}

TEST_CASE("partial rollouts: the engine's request checks") {
  auto engine = make_engine();
  auto reqs = requests(true, 1);
  reqs[0].prefix.assign(4, 1);  // as long as max_new_tokens: no room
  CHECK_THROWS_WITH_AS(engine->generate(reqs), doctest::Contains("leaves no room"), Error);
  reqs[0].prefix.assign(2, 1);
  reqs[0].prefix_logprobs.assign(1, 0.0f);
  CHECK_THROWS_WITH_AS(engine->generate(reqs), doctest::Contains("prefix log-probs"), Error);
  reqs[0].prefix_logprobs.clear();
  reqs[0].prefix[1] = 61;
  CHECK_THROWS_WITH_AS(engine->generate(reqs), doctest::Contains("outside the vocabulary"), Error);
}

TEST_CASE("partial rollouts: the pool records versions, drops stale samples, regenerates them") {
  auto engine = make_engine();
  const int64_t n = 2;
  rl::PartialPool pool(n, /*max_staleness=*/1);
  const auto reqs = requests(true, n);
  std::vector<int64_t> positions;
  std::vector<std::vector<int32_t>> prompts;
  for (const auto& r : reqs) {
    positions.push_back(int64_t(r.id));
    prompts.push_back(r.prompt);
  }
  pool.add_fresh(positions, prompts);
  const auto max_new = [&](const std::vector<int32_t>& p) {
    for (const auto& r : reqs)
      if (r.prompt == p) return r.max_new_tokens;
    return int64_t(0);
  };
  rollout::SamplingParams sp = reqs[0].sampling;
  // One round at version v on one engine: every pending group, quota q.
  const auto round = [&](int64_t version, int64_t q) {
    const std::vector<int64_t> pending = pool.pending_groups();
    auto rq = pool.requests(pending, 0, 1, sp, max_new);
    auto res = engine->generate(rq, {}, nullptr, q);
    auto samples = pool.to_samples(rq, std::move(res), pending, version);
    rollout::sort_samples(samples);
    return pool.merge(std::move(samples), pending);
  };
  CHECK(round(0, 2) == 6);  // groups 2, 3, 4 interrupted at 6 tokens, two samples each
  CHECK(pool.complete_groups() == 2);
  rl::PartialStats st;
  auto taken = pool.take(2, 0, st);
  REQUIRE(taken.size() == 4);
  CHECK(st.age_max == 0);
  CHECK(st.carried == 6);
  CHECK(round(1, 1) == 4);  // the 10-token group finishes; 20 and 30 stop at 10 tokens
  // The 10-token group: tokens 0..5 from version 0, 6..9 from version 1.
  const rollout::Sample& s = pool.groups()[0].samples[1];
  REQUIRE(s.response.size() == 10);
  CHECK(s.versions == std::vector<int32_t>{0, 0, 0, 0, 0, 0, 1, 1, 1, 1});
  rl::PartialStats st2;
  taken = pool.take(1, 1, st2);
  REQUIRE(taken.size() == 2);
  CHECK(st2.age_max == 1);
  CHECK(st2.age_mean == 1.0);
  CHECK(st2.trained_carried == 2);
  CHECK(st2.old_token_fraction == doctest::Approx(0.6));
  // Checkpoint form: the same pool back.
  rl::PartialPool copy(n, 1);
  copy.from_json(pool.to_json());
  REQUIRE(copy.groups().size() == pool.groups().size());
  for (size_t g = 0; g < copy.groups().size(); ++g)
    for (int64_t j = 0; j < n; ++j) {
      const auto& a = copy.groups()[g].samples[size_t(j)];
      const auto& b = pool.groups()[g].samples[size_t(j)];
      CHECK(a.response == b.response);
      CHECK(a.versions == b.versions);
      CHECK(a.gen_logprobs == b.gen_logprobs);
      CHECK(a.interrupted == b.interrupted);
    }
  // At version 2 the remaining samples' oldest tokens (version 0) are 2 versions old > 1: all 4
  // dropped and regenerated from their prompts, their tokens then all of version 2.
  CHECK(pool.drop_stale(1) == 0);
  CHECK(pool.drop_stale(2) == 4);
  for (const auto& g : pool.groups())
    for (const auto& x : g.samples) CHECK((x.interrupted && x.response.empty()));
  CHECK(round(2, 2) == 0);
  std::map<Key, GenerationResult> whole;
  for (auto& g : engine->generate(reqs)) whole[{g.request_id, g.sample_index}] = g;
  for (const auto& g : pool.groups())
    for (const auto& x : g.samples) {
      CHECK(x.response == whole.at({uint64_t(g.pos), x.sample_index}).tokens);
      CHECK(std::all_of(x.versions.begin(), x.versions.end(), [](int32_t v) { return v == 2; }));
    }
}

TEST_CASE("partial rollouts: engine quotas add up and never exceed an engine's groups") {
  using rl::PartialPool;
  CHECK(PartialPool::engine_quotas(5, 5, 1) == std::vector<int64_t>{5});
  CHECK(PartialPool::engine_quotas(3, 3, 2) == std::vector<int64_t>{2, 1});
  CHECK(PartialPool::engine_quotas(7, 3, 2) == std::vector<int64_t>{2, 1});
  CHECK(PartialPool::engine_quotas(2, 4, 3) == std::vector<int64_t>{1, 1, 0});
}
