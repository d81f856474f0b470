// Partial rollouts: the engine's generation quota interrupts samples at the step the quota is met;
// a continuation (GenerationRequest::prefix, re-prefilled, or resumed on the KV blocks the engine
// kept) gives the tokens of the uninterrupted sample when the weights did not change (greedy and
// sampled); kept blocks stay until a call continues the sample, asks for it anew or needs the
// blocks, and after a weight update a kept
// sample decodes on its older keys and values; the pool (rl/partial_rollout.h) records per-token
// weight versions, drops stale samples and regenerates them, keeps each group on one engine, and
// round-trips through its checkpoint form.
#include <algorithm>
#include <cmath>
#include <functional>
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

std::unique_ptr<Engine> make_engine(uint64_t seed = 7, bool keep_kv = false,
                                    int64_t kv_cache_bytes = int64_t(1) << 30) {
  model::ParamLayout layout(tiny(), model::HeadKind::kLM);
  EngineOptions opt;
  opt.ignore_eos = true;  // lengths set by max_new_tokens alone
  opt.keep_interrupted_kv = keep_kv;
  opt.kv_cache_bytes = kv_cache_bytes;
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

// Continues the interrupted results of `first` (from `reqs`) round after round, quota 1 each (the
// shortest group left), until every sample finished; after each round calls checked(next) with
// that round's requests. Returns the finished results by (id, sample) and the rounds in `rounds`
// (the first one included).
std::map<Key, GenerationResult> continue_all(
    Engine& engine, const std::vector<GenerationRequest>& reqs, std::vector<GenerationResult> first,
    int& rounds, const std::function<void(const std::vector<GenerationRequest>&)>& checked = {}) {
  std::map<Key, GenerationResult> done;
  std::vector<GenerationResult> res = std::move(first);
  std::vector<GenerationRequest> round_reqs = reqs;
  for (rounds = 1;; ++rounds) {
    REQUIRE(rounds < 10);
    for (GenerationResult& g : res)
      if (!g.interrupted) done[{g.request_id, g.sample_index}] = g;
    std::vector<GenerationRequest> next = continuations(round_reqs, res);
    if (next.empty()) break;
    for (auto& r : next) r.group = int64_t(r.id);
    round_reqs = next;
    res = engine.generate(round_reqs, {}, nullptr, 1);
    if (checked) checked(next);
  }
  return done;
}

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
    int rounds = 0;
    const std::map<Key, GenerationResult> done = continue_all(*engine, reqs, first, rounds);
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
    pool.deal(1);
    auto rq = pool.requests(pending, 0, sp, max_new);
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
  CHECK(PartialPool::engine_quotas(std::vector<int64_t>{5}, 5) == std::vector<int64_t>{5});
  CHECK(PartialPool::engine_quotas(std::vector<int64_t>{2, 1}, 3) == std::vector<int64_t>{2, 1});
  CHECK(PartialPool::engine_quotas(std::vector<int64_t>{4, 3}, 3) == std::vector<int64_t>{2, 1});
  CHECK(PartialPool::engine_quotas(std::vector<int64_t>{1, 1, 0}, 4) ==
        std::vector<int64_t>{1, 1, 0});
  CHECK(PartialPool::engine_quotas(std::vector<int64_t>{0, 3}, 2) == std::vector<int64_t>{0, 2});
}

TEST_CASE("partial rollouts: a group stays on the engine it was dealt to") {
  const int64_t n = 2;
  rl::PartialPool pool(n, 8);
  const auto reqs = requests(true, n);
  const auto add = [&](int i) {
    pool.add_fresh({int64_t(reqs[size_t(i)].id)}, {reqs[size_t(i)].prompt});
  };
  for (int i = 0; i < 3; ++i) add(i);
  pool.deal(2);
  std::vector<int> engines;
  for (const auto& g : pool.groups()) engines.push_back(g.engine);
  CHECK(engines == std::vector<int>{0, 1, 0});
  // Group 0 finishes: groups 1 and 2 keep engines 1 and 0 (dealt again in pool order they would
  // swap), and a group added later goes to the engine with the fewest pending groups (a tie: 0).
  std::vector<rollout::Sample> finished(static_cast<size_t>(n));
  for (int64_t j = 0; j < n; ++j) {
    finished[size_t(j)].prompt_pos = 0;  // index into the pending groups
    finished[size_t(j)].sample_index = j;
    finished[size_t(j)].prompt = reqs[0].prompt;
    finished[size_t(j)].response = {1, 2};
  }
  CHECK(pool.merge(std::move(finished), pool.pending_groups()) == 0);
  add(3);
  pool.deal(2);
  engines.clear();
  for (const auto& g : pool.groups()) engines.push_back(g.engine);
  CHECK(engines == std::vector<int>{0, 1, 0, 0});
  add(4);
  pool.deal(2);
  CHECK(pool.groups()[4].engine == 1);
  CHECK(pool.engine_quotas(3, 2) == std::vector<int64_t>{2, 1});
  const auto max_new = [](const std::vector<int32_t>&) { return int64_t(8); };
  const std::vector<int64_t> pending = pool.pending_groups();
  const auto r1 = pool.requests(pending, 1, reqs[0].sampling, max_new);
  REQUIRE(r1.size() == 2);  // groups 1 and 4, one request of n samples each (nothing generated)
  CHECK(r1[0].group == 0);  // keys index the pending groups: 1, 2, 3, 4
  CHECK(r1[1].group == 3);
  CHECK(r1[0].id == reqs[1].id);
  CHECK(r1[1].id == reqs[4].id);
  CHECK(r1[0].n_samples == n);
  // The checkpoint form keeps each group's engine; fewer engines deal again what is out of range.
  rl::PartialPool copy(n, 8);
  copy.from_json(pool.to_json());
  REQUIRE(copy.groups().size() == 5);
  for (size_t g = 0; g < 5; ++g) CHECK(copy.groups()[g].engine == pool.groups()[g].engine);
  copy.deal(1);
  for (const auto& g : copy.groups()) CHECK(g.engine == 0);
}

TEST_CASE("partial rollouts: kept KV blocks continue a sample exactly, with no prefill") {
  for (const bool greedy : {true, false}) {
    const char* mode = greedy ? "greedy" : "sampled at T = 1";
    INFO(mode);
    auto engine = make_engine(7, /*keep_kv=*/true);
    const auto reqs = requests(greedy, 2);
    std::map<Key, GenerationResult> whole;
    for (auto& g : engine->generate(reqs)) whole[{g.request_id, g.sample_index}] = g;
    CHECK(engine->kept_sequences() == 0);  // nothing interrupted
    std::vector<GenerationResult> res = engine->generate(reqs, {}, nullptr, 2);
    CHECK(engine->kept_sequences() == 6);  // groups 2, 3, 4: two samples each
    CHECK(engine->stats().kept == 6);
    CHECK(engine->kv_cache().used_blocks() > 0);
    int rounds = 0;
    const std::map<Key, GenerationResult> done =
        continue_all(*engine, reqs, res, rounds, [&](const std::vector<GenerationRequest>& next) {
          // Every continuation went on from its kept blocks: nothing prefilled.
          CHECK(engine->stats().resumed == int64_t(next.size()));
          CHECK(engine->stats().prefill_tokens == 0);
          int64_t positions = 0;
          for (const auto& r : next) positions += int64_t(r.prompt.size() + r.prefix.size()) - 1;
          CHECK(engine->stats().resumed_positions == positions);
        });
    CHECK(rounds == 4);
    CHECK(engine->kept_sequences() == 0);
    CHECK(engine->kv_cache().used_blocks() == 0);
    REQUIRE(done.size() == whole.size());
    for (const auto& [key, w] : whole) {
      INFO("request ", key.first, " sample ", key.second);
      const GenerationResult& d = done.at(key);
      CHECK(d.tokens == w.tokens);  // the same cache as the uninterrupted decode: bit for bit
      CHECK(d.logprobs == w.logprobs);
    }
  }
}

TEST_CASE("partial rollouts: kept KV blocks stay until continued, asked for anew or needed") {
  // Every sample of requests() fits one 256-position block: a cache of 8 blocks holds the 6 kept
  // samples and 2 more.
  const int64_t block_bytes = make_engine()->kv_cache().bytes_per_block();
  auto engine = make_engine(7, /*keep_kv=*/true, 8 * block_bytes);
  REQUIRE(engine->kv_cache().num_blocks() == 8);
  const auto reqs = requests(false, 2);
  std::map<Key, GenerationResult> whole;
  for (auto& g : make_engine()->generate(reqs)) whole[{g.request_id, g.sample_index}] = g;
  const auto interrupt = [&] {
    auto res = engine->generate(reqs, {}, nullptr, 2);
    REQUIRE(engine->kept_sequences() == 6);
    return res;
  };
  // A call that continues one and asks for another with other tokens: those two leave, the other
  // four stay and continue from their blocks in the call after.
  auto res = interrupt();
  std::vector<GenerationRequest> next = continuations(reqs, res);
  REQUIRE(next.size() == 6);
  std::vector<GenerationRequest> rest(next.begin() + 2, next.end());
  next.resize(2);
  next[1].prefix.pop_back();  // no longer the kept tokens: prefilled again
  next[1].prefix_logprobs.pop_back();
  engine->generate(next);
  CHECK(engine->stats().resumed == 1);
  CHECK(engine->stats().prefills == 1);
  CHECK(engine->stats().kept_evicted == 1);
  CHECK(engine->kept_sequences() == 4);
  CHECK(engine->kv_cache().used_blocks() == 4);
  engine->generate(rest);
  CHECK(engine->stats().resumed == 4);
  CHECK(engine->kept_sequences() == 0);
  CHECK(engine->kv_cache().used_blocks() == 0);
  // A call for other prompts (an evaluation between steps) leaves them be where the cache has
  // room; fresh requests for the same samples supersede them.
  res = interrupt();
  GenerationRequest other = reqs[4];
  other.id = 999;
  other.prompt = test::random_tokens(9, 58, 77);
  engine->generate({other});
  CHECK(engine->stats().kept_evicted == 0);
  CHECK(engine->kept_sequences() == 6);
  interrupt();
  CHECK(engine->stats().kept_evicted == 6);
  CHECK(engine->kv_cache().used_blocks() == 6);
  // Continued after the call in between, every sample is the uninterrupted one, bit for bit.
  res = interrupt();
  engine->generate({other});
  int rounds = 0;
  std::map<Key, GenerationResult> done =
      continue_all(*engine, reqs, res, rounds, [&](const std::vector<GenerationRequest>& n) {
        CHECK(engine->stats().resumed == int64_t(n.size()));
      });
  REQUIRE(done.size() == whole.size());
  for (const auto& [key, w] : whole) {
    CHECK(done.at(key).tokens == w.tokens);
    CHECK(done.at(key).logprobs == w.logprobs);
  }
  // A call that needs their blocks takes them, oldest first: 4 samples of `other` need 4 blocks,
  // 2 are free. Its tokens are those of an engine with an empty cache, and the evicted samples'
  // continuations are prefilled again (tokens unchanged, log-probs within the prefill's rounding).
  res = interrupt();
  other.n_samples = 4;
  const auto alone = make_engine()->generate({other});
  const auto beside = engine->generate({other});
  CHECK(engine->stats().kept_evicted == 2);
  CHECK(engine->kept_sequences() == 4);
  REQUIRE(beside.size() == alone.size());
  for (size_t i = 0; i < alone.size(); ++i) {
    CHECK(beside[i].tokens == alone[i].tokens);
    CHECK(beside[i].logprobs == alone[i].logprobs);
  }
  int64_t resumed = 0;
  done = continue_all(*engine, reqs, res, rounds, [&](const std::vector<GenerationRequest>&) {
    resumed += engine->stats().resumed;
  });
  CHECK(resumed == 4 + 4 + 2);  // rounds 2-4 continue 6, 4 and 2; 2 of round 2's were evicted
  for (const auto& [key, w] : whole) {
    INFO("request ", key.first, " sample ", key.second);
    CHECK(done.at(key).tokens == w.tokens);
    const auto& lp = done.at(key).logprobs;
    REQUIRE(lp.size() == w.logprobs.size());
    for (size_t t = 0; t < lp.size(); ++t) CHECK(std::abs(lp[t] - w.logprobs[t]) < 2e-5);
  }
  // release_kept() and sleep() free them all.
  interrupt();
  CHECK(engine->release_kept() == 6);
  CHECK(engine->kv_cache().used_blocks() == 0);
  interrupt();
  CHECK(engine->sleep() > 0);
  CHECK(engine->kept_sequences() == 0);
  engine->wake();
  // A continuation with a larger worst case takes more blocks on top of its kept ones.
  res = interrupt();
  next = continuations(reqs, res);
  for (auto& r : next) r.max_new_tokens += 300;
  engine->generate(next);
  CHECK(engine->stats().resumed == int64_t(next.size()));
  CHECK(engine->kv_cache().used_blocks() == 0);
}

TEST_CASE("partial rollouts: after a weight update a kept sample decodes on its older keys") {
  // Changing only the final norm (and head) leaves every layer's keys and values as they were:
  // continuing from kept blocks then matches prefilling again. Changing a layer does not: the
  // kept blocks hold the older weights' keys and values, which a prefill would recompute.
  model::ParamLayout layout(tiny(), model::HeadKind::kLM);
  const auto reqs = requests(true, 1);
  const auto continued = [&](bool keep, int unit) {
    auto engine = make_engine(7, keep);
    auto res = engine->generate(reqs, {}, nullptr, 2);
    model::init_unit_params(engine->unit_buffer(unit), layout.unit(unit), 99, 0.1);
    std::vector<GenerationResult> out = engine->generate(continuations(reqs, res));
    CHECK(engine->stats().resumed == (keep ? 3 : 0));
    return out;
  };
  const auto close = [](const std::vector<GenerationResult>& a,
                        const std::vector<GenerationResult>& b) {
    REQUIRE(a.size() == b.size());
    double worst = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      REQUIRE(a[i].logprobs.size() == b[i].logprobs.size());
      for (size_t t = 0; t < a[i].logprobs.size(); ++t)
        worst = std::max(worst, double(std::abs(a[i].logprobs[t] - b[i].logprobs[t])));
    }
    return worst;
  };
  const int head = layout.head_unit(), layer = layout.layer_unit(0);
  CHECK(close(continued(true, head), continued(false, head)) < 2e-5);
  CHECK(close(continued(true, layer), continued(false, layer)) > 1e-3);
}
