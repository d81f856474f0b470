// Multi-turn generation (rollout::TurnHooks): the action mask of an episode against one built by
// hand; observations prefilled onto the sample's KV blocks give the log-probs of a full forward
// over the whole sequence (the trainer's forward_logits) and the tokens of a brute-force greedy
// loop that re-runs the whole sequence each step; the episode does not depend on the batch; the
// single-turn path is unchanged; cut observations, done, EOS and bad observation tokens.
#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <vector>

#include "core/error.h"
#include "model/init.h"
#include "model/transformer.h"
#include "rollout/engine.h"
#include "rollout/samples.h"
#include "tests/rollout/engine_test_util.h"
#include "tests/test_util.h"

using namespace rlhf;
using rollout::Engine;
using rollout::EngineOptions;
using rollout::FinishReason;
using rollout::GenerationRequest;
using rollout::GenerationResult;
using rollout::TurnEnd;
using rollout::TurnHooks;

namespace {

// A tiny Llama: C = 48, 2 layers, 4 heads over 2 KV heads, V = 61, 128 positions; EOS 60.
model::ModelConfig tiny() {
  return test::tiny_engine_config("llama", 128);
}

std::unique_ptr<Engine> make_engine(EngineOptions opt = {}) {
  model::ParamLayout layout(tiny(), model::HeadKind::kLM);
  auto e = std::make_unique<Engine>(layout, opt);
  for (int u = 0; u < layout.num_units(); ++u)
    model::init_unit_params(e->unit_buffer(u), layout.unit(u), 7, 0.1);
  return e;
}

std::vector<int32_t> prompt_of(int64_t len, uint64_t seed) {
  auto p = test::random_tokens(len, 58, seed);
  p[0] = 59;
  return p;
}

// The observation the test environment appends after turn k of sample s: k + 2 tokens.
std::vector<int32_t> observation(int64_t s, int64_t k) {
  std::vector<int32_t> o;
  for (int64_t j = 0; j < k + 2; ++j) o.push_back(int32_t((7 * s + 5 * k + 3 * j) % 58));
  return o;
}

// Hooks: a turn ends after `per_turn` sampled tokens (a stand-in for a stop string); the
// environment appends observation(sample, turn) and is done after `done_after` turns.
TurnHooks fixed_turn_hooks(int64_t per_turn, int64_t done_after, int64_t max_turns,
                           std::vector<TurnEnd>* seen = nullptr) {
  TurnHooks h;
  h.ends_turn = [per_turn](const std::vector<int32_t>& r, int64_t begin) {
    return int64_t(r.size()) - begin == per_turn;
  };
  h.on_turn_end = [=](std::vector<TurnEnd>& ends) {
    for (TurnEnd& e : ends) {
      if (seen) seen->push_back(e);
      e.observation = observation(e.sample_index, e.turn);
      e.done = e.turn + 1 >= done_after;
    }
  };
  h.max_turns = max_turns;
  return h;
}

}  // namespace

TEST_CASE("multi-turn: the action mask and tokens of an episode, built by hand") {
  EngineOptions opt;
  opt.ignore_eos = true;  // turns end only where the hooks say
  auto engine = make_engine(opt);
  GenerationRequest r;
  r.id = 3;
  r.prompt = prompt_of(6, 11);
  r.n_samples = 2;
  r.sampling.temperature = 1.0;
  SUBCASE("max_turns ends it") {
    r.max_new_tokens = 40;
    std::vector<TurnEnd> seen;
    const TurnHooks h = fixed_turn_hooks(3, 99, 3, &seen);
    const auto res = engine->generate({r}, {}, &h);
    REQUIRE(res.size() == 2);
    for (const GenerationResult& g : res) {
      // 3 sampled, obs(turn 0) = 2, 3 sampled, obs(turn 1) = 3, 3 sampled: max_turns = 3.
      const std::vector<uint8_t> mask = {1, 1, 1, 0, 0, 1, 1, 1, 0, 0, 0, 1, 1, 1};
      CHECK(g.action_mask == mask);
      CHECK(g.finish == FinishReason::kMaxTurns);
      CHECK(g.turns == 3);
      REQUIRE(g.tokens.size() == mask.size());
      const auto o0 = observation(g.sample_index, 0), o1 = observation(g.sample_index, 1);
      CHECK(std::vector<int32_t>(g.tokens.begin() + 3, g.tokens.begin() + 5) == o0);
      CHECK(std::vector<int32_t>(g.tokens.begin() + 8, g.tokens.begin() + 11) == o1);
      for (size_t t = 0; t < mask.size(); ++t)
        if (!mask[t]) CHECK(g.logprobs[t] == 0.0f);
    }
    // The hook saw each sample at turns 0, 1, 2 (sorted by sample within a step), with the
    // response so far and where the turn began.
    REQUIRE(seen.size() == 6);
    std::map<int64_t, std::vector<int64_t>> begins;
    for (const TurnEnd& e : seen) begins[e.sample_index].push_back(e.turn_begin);
    CHECK(begins[0] == std::vector<int64_t>{0, 5, 11});
    CHECK(begins[1] == std::vector<int64_t>{0, 5, 11});
  }
  SUBCASE("done ends it") {
    r.max_new_tokens = 40;
    const TurnHooks h = fixed_turn_hooks(3, 2, 8);
    for (const GenerationResult& g : engine->generate({r}, {}, &h)) {
      CHECK(g.action_mask == std::vector<uint8_t>{1, 1, 1, 0, 0, 1, 1, 1});
      CHECK(g.finish == FinishReason::kEnvDone);
      CHECK(g.turns == 2);
    }
  }
  SUBCASE("the length limit counts observations and cuts them") {
    r.max_new_tokens = 7;  // 3 sampled + 2 obs + 2 sampled: length
    const TurnHooks h = fixed_turn_hooks(3, 99, 8);
    for (const GenerationResult& g : engine->generate({r}, {}, &h)) {
      CHECK(g.action_mask == std::vector<uint8_t>{1, 1, 1, 0, 0, 1, 1});
      CHECK(g.finish == FinishReason::kLength);
    }
    r.max_new_tokens = 4;  // 3 sampled + the observation cut to 1 token: no room to sample
    for (const GenerationResult& g : engine->generate({r}, {}, &h)) {
      CHECK(g.action_mask == std::vector<uint8_t>{1, 1, 1, 0});
      CHECK(g.tokens.back() == observation(g.sample_index, 0)[0]);
      CHECK(g.finish == FinishReason::kLength);
    }
  }
  SUBCASE("a stop string without an environment ends the sample") {
    r.max_new_tokens = 40;
    TurnHooks h = fixed_turn_hooks(4, 99, 8);
    h.on_turn_end = nullptr;
    for (const GenerationResult& g : engine->generate({r}, {}, &h)) {
      CHECK(g.tokens.size() == 4);
      CHECK(g.finish == FinishReason::kStopString);
      CHECK(g.turns == 1);
    }
  }
  SUBCASE("an observation token outside the vocabulary is an error naming it") {
    r.max_new_tokens = 40;
    TurnHooks h = fixed_turn_hooks(3, 99, 8);
    h.on_turn_end = [](std::vector<TurnEnd>& ends) {
      for (TurnEnd& e : ends) e.observation = {5, 61};
    };
    CHECK_THROWS_WITH_AS(engine->generate({r}, {}, &h), doctest::Contains("observation token 61"),
                         Error);
    // The engine stays usable: its KV blocks went back to the pool.
    CHECK(engine->kv_cache().free_blocks() == engine->kv_cache().num_blocks());
  }
}

TEST_CASE("multi-turn: KV reuse gives the log-probs of a full forward and of a full re-prefill") {
  auto engine = make_engine();
  model::ParamLayout layout(tiny(), model::HeadKind::kLM);
  model::Transformer<float> net(layout);
  const int64_t V = tiny().vocab_size;
  std::vector<GenerationRequest> reqs;
  for (int i = 0; i < 3; ++i) {
    GenerationRequest r;
    r.id = uint64_t(10 + i);
    r.prompt = prompt_of(4 + 5 * i, uint64_t(20 + i));
    r.n_samples = 2;
    r.max_new_tokens = 50;
    r.sampling.temperature = 0.8;
    reqs.push_back(r);
  }
  const TurnHooks h = fixed_turn_hooks(4, 99, 4);
  const auto res = engine->generate(reqs, {}, &h);
  int64_t multi = 0;
  for (const GenerationResult& g : res) {
    // The whole sequence through the trainer's forward at once: log softmax(logits / T) at every
    // sampled token equals what the engine sampled with (fp32 orders differ: 1e-4).
    std::vector<int32_t> seq = reqs[size_t(g.request_index)].prompt;
    const int64_t P = int64_t(seq.size());
    seq.insert(seq.end(), g.tokens.begin(), g.tokens.end());
    const int64_t T = int64_t(seq.size()) - 1;
    std::vector<float> logits(size_t(T * V));
    net.forward_logits(engine->provider(), seq.data(), 1, T, logits.data());
    double worst = 0;
    for (size_t k = 0; k < g.tokens.size(); ++k) {
      if (!g.action_mask[k]) continue;
      const float* row = logits.data() + (P - 1 + int64_t(k)) * V;
      double m = -INFINITY, s = 0;
      for (int64_t v = 0; v < V; ++v) m = std::max(m, double(row[v]) / 0.8);
      for (int64_t v = 0; v < V; ++v) s += std::exp(double(row[v]) / 0.8 - m);
      const double ref = double(row[g.tokens[k]]) / 0.8 - m - std::log(s);
      worst = std::max(worst, std::fabs(ref - double(g.logprobs[k])));
    }
    INFO("request ", g.request_index, " sample ", g.sample_index, " turns ", g.turns);
    CHECK(worst <= 1e-4);
    multi += g.turns > 1;
  }
  CHECK(multi >= 4);  // most episodes had observations (EOS may end a few early)

  // Greedy: the engine's episode equals a brute-force loop that runs the whole sequence again
  // every step (with the observations inserted), tokens exactly.
  GenerationRequest g = reqs[1];
  g.sampling.greedy = true;
  g.n_samples = 1;
  const TurnHooks hg = fixed_turn_hooks(5, 3, 8);
  const GenerationResult out = engine->generate({g}, {}, &hg).at(0);
  std::vector<int32_t> seq = g.prompt, resp;
  std::vector<uint8_t> mask;
  int64_t turn = 0, begin = 0;
  while (int64_t(resp.size()) < g.max_new_tokens) {
    const int64_t T = int64_t(seq.size());
    std::vector<float> logits(size_t(T * V));
    net.forward_logits(engine->provider(), seq.data(), 1, T, logits.data());
    const float* last = logits.data() + (T - 1) * V;
    const int32_t best = int32_t(std::max_element(last, last + V) - last);
    seq.push_back(best);
    resp.push_back(best);
    mask.push_back(1);
    if (best == tiny().eos_token_id) break;
    if (int64_t(resp.size()) - begin == 5) {
      if (turn + 1 >= 3) break;  // done after 3 turns
      for (int32_t o : observation(0, turn)) {
        seq.push_back(o);
        resp.push_back(o);
        mask.push_back(0);
      }
      ++turn;
      begin = int64_t(resp.size());
    }
  }
  CHECK(out.tokens == resp);
  CHECK(out.action_mask == mask);
}

TEST_CASE("multi-turn: an episode does not depend on the batch; no hooks = the single-turn path") {
  std::vector<GenerationRequest> reqs;
  for (int i = 0; i < 5; ++i) {
    GenerationRequest r;
    r.id = uint64_t(i);
    r.prompt = prompt_of(3 + 4 * i, uint64_t(30 + i));
    r.n_samples = 1 + i % 3;
    r.max_new_tokens = 20 + 7 * i;
    reqs.push_back(r);
  }
  const TurnHooks h = fixed_turn_hooks(3, 4, 6);
  EngineOptions one;
  one.max_batch = 1;
  const auto a = make_engine(one)->generate(reqs, {}, &h);
  const auto b = make_engine()->generate(reqs, {}, &h);
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    INFO("sample ", i);
    CHECK(a[i].tokens == b[i].tokens);
    CHECK(a[i].logprobs == b[i].logprobs);  // bitwise: observation rows are decode rows
    CHECK(a[i].action_mask == b[i].action_mask);
  }
  // Hooks that never end a turn but at EOS (which ends the episode) change nothing but the mask.
  TurnHooks eos_only;
  eos_only.on_turn_end = [](std::vector<TurnEnd>& ends) {
    for (TurnEnd& e : ends) e.observation = {1, 2, 3};  // ignored after EOS
  };
  eos_only.max_turns = 5;
  auto engine = make_engine();
  const auto plain = engine->generate(reqs);
  const auto hooked = engine->generate(reqs, {}, &eos_only);
  REQUIRE(plain.size() == hooked.size());
  for (size_t i = 0; i < plain.size(); ++i) {
    CHECK(plain[i].tokens == hooked[i].tokens);
    CHECK(plain[i].logprobs == hooked[i].logprobs);
    CHECK(plain[i].finish == hooked[i].finish);
    CHECK(plain[i].action_mask.empty());
    CHECK(hooked[i].action_mask == std::vector<uint8_t>(hooked[i].tokens.size(), 1));
  }
}

TEST_CASE("multi-turn: observations fed one decode step each give the same episodes, bitwise") {
  // What a backend that takes one row per sequence (the GPU engine) does, on the CPU engine:
  // the same rows at the same positions, spread over steps; the sequence samples nothing until
  // its last observation token is in the cache.
  std::vector<GenerationRequest> reqs;
  for (int i = 0; i < 4; ++i) {
    GenerationRequest r;
    r.id = uint64_t(40 + i);
    r.prompt = prompt_of(3 + 3 * i, uint64_t(50 + i));
    r.n_samples = 1 + i % 2;
    r.max_new_tokens = 24 + 5 * i;
    r.sampling.temperature = 0.9;
    reqs.push_back(r);
  }
  const TurnHooks h = fixed_turn_hooks(3, 4, 6);
  EngineOptions by_row;
  by_row.observations_row_by_row = true;
  auto e_rows = make_engine(by_row);
  auto e_step = make_engine();
  const auto a = e_step->generate(reqs, {}, &h);
  const auto b = e_rows->generate(reqs, {}, &h);
  REQUIRE(a.size() == b.size());
  int64_t observed = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    INFO("sample ", i);
    CHECK(a[i].tokens == b[i].tokens);
    CHECK(a[i].logprobs == b[i].logprobs);
    CHECK(a[i].action_mask == b[i].action_mask);
    CHECK(a[i].turns == b[i].turns);
    for (uint8_t m : a[i].action_mask) observed += m == 0;
  }
  CHECK(observed > 0);
  // Row by row takes one more decode step per observation token than it has samples.
  CHECK(e_rows->stats().decode_steps > e_step->stats().decode_steps);
  CHECK(e_rows->stats().observation_tokens == e_step->stats().observation_tokens);
}

TEST_CASE(
    "multi-turn samples survive serialize_samples; the untagged single-turn form still reads") {
  rollout::Sample a;
  a.prompt_pos = 3;
  a.sample_index = 1;
  a.prompt = {1, 2};
  a.response = {5, 6, 7, 8};
  a.gen_logprobs = {-1, 0, 0, -2};
  a.stopped = true;
  a.finish = FinishReason::kEnvDone;
  a.action_mask = {1, 0, 0, 1};
  a.turns = 2;
  a.has_env_reward = true;
  a.env_reward = 0.25;
  rollout::Sample b;
  b.response = {9};
  b.gen_logprobs = {-0.5};
  const auto bytes = rollout::serialize_samples({a, b});
  const auto back = rollout::deserialize_samples(bytes.data(), bytes.size());
  REQUIRE(back.size() == 2);
  CHECK(back[0].action_mask == a.action_mask);
  CHECK(back[0].finish == FinishReason::kEnvDone);
  CHECK(back[0].turns == 2);
  CHECK(back[0].has_env_reward);
  CHECK(back[0].env_reward == 0.25);
  CHECK(back[1].action_mask.empty());
  CHECK(rollout::action_tokens(back[0]) == 2);
  CHECK(rollout::action_tokens(back[1]) == 1);
  // The earlier form: count, then (pos, index, stopped, prompt, response, logprobs) per sample.
  std::vector<uint8_t> old;
  auto put = [&](const void* p, size_t n) {
    old.insert(old.end(), static_cast<const uint8_t*>(p), static_cast<const uint8_t*>(p) + n);
  };
  const int64_t one = 1, pos = 4, idx = 0, np = 1, nr = 1;
  const uint8_t stopped = 1;
  const int32_t tok = 7;
  const float lp = -0.5f;
  put(&one, 8);
  put(&pos, 8);
  put(&idx, 8);
  put(&stopped, 1);
  put(&np, 8);
  put(&tok, 4);
  put(&nr, 8);
  put(&tok, 4);
  put(&nr, 8);
  put(&lp, 4);
  const auto v1 = rollout::deserialize_samples(old.data(), old.size());
  REQUIRE(v1.size() == 1);
  CHECK(v1[0].prompt_pos == 4);
  CHECK(v1[0].finish == FinishReason::kStop);
  CHECK(v1[0].action_mask.empty());
}
