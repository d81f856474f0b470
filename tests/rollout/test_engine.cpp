// The generation engine against the training forward: greedy decoding with the KV cache equals
// re-running Transformer::forward_logits on the whole prefix each step; sampling log-probs equal
// the trainer's Transformer::forward_lm with inv_temperature = 1/T; seeds; continuous batching
// gives every request its own completion whatever the batch, order, slot count or KV budget;
// admission stays within the KV budget; n samples share one prefill; input errors.
#include "rollout/engine.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "model/init.h"
#include "model/transformer.h"
#include "tests/rollout/engine_test_util.h"
#include "tests/test_util.h"

using namespace rlhf;
using rollout::Engine;
using rollout::EngineOptions;
using rollout::FinishReason;
using rollout::GenerationRequest;
using rollout::GenerationResult;

namespace {

constexpr int32_t kEos = 60;

// A tiny Llama (or Qwen2 with q/k/v biases): C = 48, 2 layers, 4 heads over 2 KV heads (D = 12),
// F = 80, V = 61, 96 positions.
model::ModelConfig tiny(bool qwen2_bias, model::RopeStyle style, bool tied) {
  model::ModelConfig c = test::tiny_engine_config(qwen2_bias ? "qwen2" : "llama", 96, tied);
  c.rope_style = style;
  return c;
}

// An engine with deterministic random weights (std 0.1 so that the distributions are not flat;
// biases random too, so the bias paths count).
std::unique_ptr<Engine> make_engine(const model::ModelConfig& cfg, EngineOptions opt = {},
                                    uint64_t seed = 7) {
  model::ParamLayout layout(cfg, model::HeadKind::kLM);
  auto e = std::make_unique<Engine>(layout, opt);
  for (int u = 0; u < layout.num_units(); ++u) {
    model::init_unit_params(e->unit_buffer(u), layout.unit(u), seed, 0.1);
    for (const model::TensorInfo& t : layout.unit(u).tensors)
      if (t.name.ends_with(".bias")) {
        auto b = test::random_vec<float>(t.numel, seed + uint64_t(t.offset), -0.2, 0.2);
        std::copy(b.begin(), b.end(), e->unit_buffer(u) + t.offset);
      }
  }
  return e;
}

std::vector<int32_t> prompt_of(int64_t len, uint64_t seed) {
  auto p = test::random_tokens(len, 58, seed);  // ordinary tokens, no BOS/EOS/PAD
  p[0] = 59;                                    // BOS first, as rlhf generate does
  return p;
}

// Greedy by brute force: the whole prefix through forward_logits each step, argmax (lowest id on
// ties), log softmax at temperature 1 in double. Stops on eos (if ≥ 0) or after max_new tokens.
std::vector<int32_t> reference_greedy(model::Transformer<float>& net, model::UnitProvider<float>& p,
                                      const std::vector<int32_t>& prompt, int64_t max_new,
                                      int32_t eos, std::vector<double>* lps) {
  const int64_t V = net.layout().config().vocab_size;
  std::vector<int32_t> seq = prompt, out;
  std::vector<float> logits;
  for (int64_t step = 0; step < max_new; ++step) {
    const int64_t T = static_cast<int64_t>(seq.size());
    logits.resize(size_t(T * V));
    net.forward_logits(p, seq.data(), 1, T, logits.data());
    const float* last = logits.data() + (T - 1) * V;
    int32_t best = 0;
    for (int64_t i = 1; i < V; ++i)
      if (last[i] > last[best]) best = int32_t(i);
    double m = -INFINITY, s = 0;
    for (int64_t i = 0; i < V; ++i) m = std::max(m, double(last[i]));
    for (int64_t i = 0; i < V; ++i) s += std::exp(double(last[i]) - m);
    if (lps) lps->push_back(double(last[best]) - m - std::log(s));
    out.push_back(best);
    if (best == eos) break;
    seq.push_back(best);
  }
  return out;
}

// (request id, sample index) → result, to compare runs whatever their order.
std::map<std::pair<uint64_t, int64_t>, GenerationResult> by_key(std::vector<GenerationResult> v) {
  std::map<std::pair<uint64_t, int64_t>, GenerationResult> m;
  for (auto& r : v) m[{r.request_id, r.sample_index}] = std::move(r);
  return m;
}

void check_same(const std::map<std::pair<uint64_t, int64_t>, GenerationResult>& a,
                const std::map<std::pair<uint64_t, int64_t>, GenerationResult>& b,
                const std::string& what) {
  REQUIRE(a.size() == b.size());
  for (const auto& [key, ra] : a) {
    const auto it = b.find(key);
    REQUIRE(it != b.end());
    const GenerationResult& rb = it->second;
    INFO(what, ": request ", key.first, " sample ", key.second);
    CHECK(ra.tokens == rb.tokens);
    CHECK(ra.logprobs == rb.logprobs);  // bitwise: decode is batch-invariant
    CHECK(ra.finish == rb.finish);
  }
}

// A mix of requests: ragged prompts, several samples, different lengths and sampling settings.
std::vector<GenerationRequest> mixed_requests() {
  std::vector<GenerationRequest> reqs;
  const int64_t lens[] = {3, 17, 1, 9, 25, 6};
  const int64_t samples[] = {1, 3, 1, 2, 1, 2};
  const int64_t max_new[] = {5, 25, 12, 1, 30, 8};
  for (int i = 0; i < 6; ++i) {
    GenerationRequest r;
    r.id = uint64_t(100 + i);
    r.prompt = prompt_of(lens[i], uint64_t(i + 1));
    r.n_samples = samples[i];
    r.max_new_tokens = max_new[i];
    r.sampling.seed = 11;
    r.sampling.temperature = i % 3 == 0 ? 0.8 : (i % 3 == 1 ? 1.0 : 1.3);
    if (i == 1) r.sampling.top_k = 5;
    if (i == 4) r.sampling.top_p = 0.9;
    if (i == 5) r.sampling.greedy = true;
    reqs.push_back(r);
  }
  return reqs;
}

}  // namespace

TEST_CASE("greedy decoding with the KV cache equals forward_logits on the whole prefix") {
  struct Variant {
    bool bias;
    model::RopeStyle style;
    bool tied;
  };
  for (const Variant& v : {Variant{false, model::RopeStyle::kRotateHalf, true},
                           Variant{true, model::RopeStyle::kInterleaved, false}}) {
    const auto cfg = tiny(v.bias, v.style, v.tied);
    model::ParamLayout layout(cfg, model::HeadKind::kLM);
    model::Transformer<float> net(layout);
    for (int64_t batch : {1, 3, 8}) {
      auto probe = make_engine(cfg);
      const int64_t lens[] = {5, 17, 1, 30, 2, 9, 12, 3};
      std::vector<GenerationRequest> reqs;
      for (int64_t i = 0; i < batch; ++i) {
        GenerationRequest r;
        r.id = uint64_t(i);
        r.prompt = prompt_of(lens[i], uint64_t(40 + i));
        r.n_samples = i == 1 ? 3 : 1;  // greedy samples of one prompt must all agree
        r.max_new_tokens = 10 + 2 * i;
        r.sampling.greedy = true;
        reqs.push_back(r);
      }
      // EOS = the 4th token request 0 generates without a stop token, so that at least one
      // sample finishes with "stop" (the reference stops on it too).
      const int32_t eos =
          reference_greedy(net, probe->provider(), reqs[0].prompt, 4, -1, nullptr).back();
      EngineOptions opt;
      opt.eos_token_id = eos;
      auto engine = make_engine(cfg, opt);
      const auto results = engine->generate(reqs);
      REQUIRE(int64_t(results.size()) == batch + (batch > 1 ? 2 : 0));
      int stops = 0;
      for (const GenerationResult& r : results) {
        const GenerationRequest& q = reqs[size_t(r.request_index)];
        std::vector<double> lps;
        const auto ref =
            reference_greedy(net, engine->provider(), q.prompt, q.max_new_tokens, eos, &lps);
        INFO(fmt::format("bias={} tied={} batch={} request {} sample {}", v.bias, v.tied, batch,
                         r.request_index, r.sample_index));
        CHECK(r.tokens == ref);
        REQUIRE(r.logprobs.size() == lps.size());
        for (size_t j = 0; j < lps.size(); ++j) CHECK(std::fabs(r.logprobs[j] - lps[j]) <= 1e-4);
        if (!r.tokens.empty() && r.tokens.back() == eos) {
          CHECK(r.finish == FinishReason::kStop);
          ++stops;
        } else {
          CHECK(r.finish == FinishReason::kLength);
          CHECK(int64_t(r.tokens.size()) == q.max_new_tokens);
        }
      }
      CHECK(stops >= 1);
    }
  }
}

TEST_CASE("sampling log-probs equal the trainer's forward_lm log-probs at inv_temperature 1/T") {
  const auto cfg = tiny(false, model::RopeStyle::kRotateHalf, true);
  model::ParamLayout layout(cfg, model::HeadKind::kLM);
  model::Transformer<float> net(layout);
  // fp32 cache: the same math as the trainer up to kernel order (1e-4). fp16 cache: keys and
  // values rounded to 11 significant bits; measured max 7.3e-4 here (bound 2e-3).
  for (const auto dtype : {rollout::KvDtype::kFloat32, rollout::KvDtype::kFloat16}) {
    EngineOptions eo;
    eo.kv_cache_dtype = dtype;
    const double tol = dtype == rollout::KvDtype::kFloat32 ? 1e-4 : 2e-3;
    auto engine = make_engine(cfg, eo);
    double worst_all = 0;
    for (double T : {0.6, 1.0, 1.4}) {
      std::vector<GenerationRequest> reqs;
      for (int i = 0; i < 3; ++i) {
        GenerationRequest r;
        r.id = uint64_t(i);
        r.prompt = prompt_of(4 + 7 * i, uint64_t(i + 9));
        r.max_new_tokens = 20;
        r.sampling.temperature = T;
        r.sampling.top_k = i == 1 ? 8 : -1;  // the log-prob is the full-vocabulary one regardless
        r.sampling.top_p = i == 2 ? 0.85 : 1.0;
        reqs.push_back(r);
      }
      for (const GenerationResult& r : engine->generate(reqs)) {
        const auto& prompt = reqs[size_t(r.request_index)].prompt;
        std::vector<int32_t> tokens = prompt;
        tokens.insert(tokens.end(), r.tokens.begin(), r.tokens.end());
        const int64_t n = static_cast<int64_t>(tokens.size()), P = int64_t(prompt.size());
        std::vector<int32_t> targets(size_t(n), -1);
        for (int64_t t = P - 1; t + 1 < n; ++t) targets[size_t(t)] = tokens[size_t(t + 1)];
        std::vector<float> lp(static_cast<size_t>(n));
        net.forward_lm(engine->provider(), tokens.data(), targets.data(), 1, n, lp.data(), nullptr,
                       false, float(1.0 / T));
        double worst = 0;
        for (size_t j = 0; j < r.tokens.size(); ++j)
          worst = std::max(worst, std::fabs(double(r.logprobs[j]) - lp[size_t(P - 1) + j]));
        INFO(std::string(rollout::to_string(dtype)), " cache, T=", T, " request ", r.request_index,
             ": max |engine - trainer| = ", worst);
        CHECK(worst <= tol);
        worst_all = std::max(worst_all, worst);
      }
    }
    MESSAGE(std::string(rollout::to_string(dtype)),
            " KV cache: max |engine - trainer| log-prob = ", worst_all);
  }
}

TEST_CASE("same seed, same tokens; different seed, different tokens") {
  auto engine = make_engine(tiny(false, model::RopeStyle::kRotateHalf, true));
  auto reqs = mixed_requests();
  const auto a = by_key(engine->generate(reqs));
  const auto b = by_key(engine->generate(reqs));
  check_same(a, b, "same seed");
  for (auto& r : reqs) r.sampling.seed = 12;
  const auto c = by_key(engine->generate(reqs));
  int differ = 0;
  for (const auto& [key, ra] : a)
    if (!reqs[size_t(key.first - 100)].sampling.is_greedy() && ra.tokens != c.at(key).tokens)
      ++differ;
  CHECK(differ >= 5);  // every sampled completion longer than a token or two changes
  // Samples of one request use different streams.
  CHECK(a.at({101, 0}).tokens != a.at({101, 1}).tokens);
}

TEST_CASE("continuous batching: each request's completion is its own whatever the batch") {
  const auto cfg = tiny(true, model::RopeStyle::kInterleaved, false);
  const auto reqs = mixed_requests();
  auto engine = make_engine(cfg);
  const auto together = by_key(engine->generate(reqs));

  std::map<std::pair<uint64_t, int64_t>, GenerationResult> alone;
  for (const auto& r : reqs)
    for (auto& [k, v] : by_key(engine->generate({r}))) alone[k] = std::move(v);
  check_same(together, alone, "alone vs together");

  auto reversed = reqs;
  std::reverse(reversed.begin(), reversed.end());
  check_same(together, by_key(engine->generate(reversed)), "reversed submission order");

  // The block size moves positions between blocks, never the arithmetic: 16-position blocks
  // (a GPU engine's) and odd 7-position ones give the CPU default's bits.
  REQUIRE(engine->kv_cache().block_size() == rollout::kCpuKvBlockSize);
  for (const int64_t bs : {16, 7}) {
    EngineOptions other;
    other.block_size = bs;
    check_same(together, by_key(make_engine(cfg, other)->generate(reqs)),
               "KV blocks of " + std::to_string(bs) + " positions");
  }

  // The prompts admitted together go through one prefill forward; a smaller prefill budget splits
  // them (1 token: one prompt a forward), never changing a bit.
  CHECK(engine->stats().prefills == 6);
  CHECK(engine->stats().prefill_batches == 1);
  for (const int64_t budget : {20, 1}) {
    EngineOptions other;
    other.prefill_batch_tokens = budget;
    auto e = make_engine(cfg, other);
    check_same(together, by_key(e->generate(reqs)),
               "prefill forwards of at most " + std::to_string(budget) + " tokens");
    CHECK(e->stats().prefills == 6);
    CHECK(e->stats().prefill_batches == (budget == 1 ? 6 : 4));  // 3+17, 1+9, 25, 6 at 20
  }

  EngineOptions two_slots;
  two_slots.max_batch = 2;
  auto narrow = make_engine(cfg, two_slots);
  check_same(together, by_key(narrow->generate(reqs)), "two decode slots");
  CHECK(narrow->stats().max_active <= 2);
  CHECK(narrow->stats().admission_waits >= 1);

  // A KV budget for one longest sample (25 + 30 − 1 = 54 positions = 14 blocks of 4) plus 3
  // blocks: requests must wait for each other.
  EngineOptions small;
  small.block_size = 4;
  const int64_t bytes_per_block = rollout::KvCache(cfg, 1 << 20, 4).bytes_per_block();
  small.kv_cache_bytes = 17 * bytes_per_block;
  auto tight = make_engine(cfg, small);
  check_same(together, by_key(tight->generate(reqs)), "KV budget of 17 blocks");
  CHECK(tight->stats().admission_waits >= 1);
  CHECK(tight->stats().peak_kv_blocks <= 17);
  CHECK(tight->stats().max_active < engine->stats().max_active);
}

TEST_CASE("KV admission: never more blocks than the budget, waiting requests all complete") {
  const auto cfg = tiny(false, model::RopeStyle::kRotateHalf, true);
  EngineOptions opt;
  opt.block_size = 4;
  opt.ignore_eos = true;
  const int64_t block_bytes = rollout::KvCache(cfg, 1 << 20, 4).bytes_per_block();
  opt.kv_cache_bytes = 5 * block_bytes + block_bytes / 2;  // 5 blocks
  auto engine = make_engine(cfg, opt);
  REQUIRE(engine->kv_cache().num_blocks() == 5);
  // Worst case per sample: prompt 3 + 6 new − 1 = 8 positions = 2 blocks: two samples at a time.
  std::vector<GenerationRequest> reqs;
  for (int i = 0; i < 6; ++i) {
    GenerationRequest r;
    r.id = uint64_t(i);
    r.prompt = prompt_of(3, uint64_t(i));
    r.max_new_tokens = 6;
    r.n_samples = i == 2 ? 4 : 1;  // 4 samples never fit at once: two groups of 2, two prefills
    reqs.push_back(r);
  }
  const auto results = engine->generate(reqs);
  const auto& st = engine->stats();
  CHECK(results.size() == 9);
  for (const auto& r : results) {
    CHECK(r.tokens.size() == 6);
    CHECK(r.finish == FinishReason::kLength);
  }
  CHECK(st.max_active == 2);
  CHECK(st.peak_kv_blocks <= 5);
  CHECK(st.peak_kv_blocks * engine->kv_cache().bytes_per_block() <= opt.kv_cache_bytes);
  CHECK(st.admission_waits >= 1);
  CHECK(st.prefills == 7);  // 5 single-sample requests + request 2 in two groups
  CHECK(engine->kv_cache().used_blocks() == 0);  // everything released

  GenerationRequest big;
  big.prompt = prompt_of(3, 1);
  big.max_new_tokens = 40;  // 42 positions = 11 blocks > 5
  CHECK_THROWS_WITH_AS(engine->generate({big}), doctest::Contains("--gen_kv_cache_mb"), Error);
}

TEST_CASE("n samples of a prompt share one prefill; stats add up") {
  auto engine = make_engine(tiny(false, model::RopeStyle::kRotateHalf, true));
  GenerationRequest r;
  r.id = 5;
  r.prompt = prompt_of(13, 3);
  r.n_samples = 4;
  r.max_new_tokens = 9;
  const auto results = engine->generate({r});
  const auto& st = engine->stats();
  CHECK(st.prefills == 1);
  CHECK(st.prefill_tokens == 13);
  CHECK(st.samples == 4);
  int64_t generated = 0;
  for (int64_t i = 0; i < 4; ++i) {
    CHECK(results[size_t(i)].sample_index == i);
    CHECK(results[size_t(i)].request_id == 5);
    generated += int64_t(results[size_t(i)].tokens.size());
  }
  CHECK(st.generated_tokens == generated);
  CHECK(st.decode_tokens == generated - 4);  // each sample's first token comes from the prefill
  CHECK(st.mean_active_batch() > 1.0);
  CHECK(st.mean_active_batch() <= 4.0);
}

TEST_CASE("generation stops at max_position_embeddings; bad requests are clear errors") {
  auto engine = make_engine(tiny(false, model::RopeStyle::kRotateHalf, true));
  GenerationRequest r;
  r.prompt = prompt_of(93, 2);  // 96 positions: room for 3 tokens
  r.max_new_tokens = 10;
  r.sampling.greedy = true;
  EngineOptions opt;
  opt.ignore_eos = true;
  auto no_eos = make_engine(tiny(false, model::RopeStyle::kRotateHalf, true), opt);
  const auto res = no_eos->generate({r});
  CHECK(res[0].tokens.size() == 3);
  CHECK(res[0].finish == FinishReason::kLength);

  r.prompt = prompt_of(96, 2);
  CHECK_THROWS_WITH_AS(engine->generate({r}), doctest::Contains("max_position_embeddings"), Error);
  r.prompt.clear();
  CHECK_THROWS_WITH_AS(engine->generate({r}), doctest::Contains("empty prompt"), Error);
  r.prompt = {59, 61};
  CHECK_THROWS_WITH_AS(engine->generate({r}), doctest::Contains("outside the vocabulary"), Error);
  r.prompt = {59, 3};
  r.sampling.greedy = false;
  r.sampling.top_p = 1.5;
  CHECK_THROWS_WITH_AS(engine->generate({r}), doctest::Contains("top_p"), Error);
  EngineOptions negative;
  negative.block_size = -1;
  CHECK_THROWS_WITH_AS(make_engine(tiny(false, model::RopeStyle::kRotateHalf, true), negative),
                       doctest::Contains("--kv_block_size"), Error);
}

TEST_CASE("unit buffers are the weights the engine reads, and it has no gradients") {
  const auto cfg = tiny(false, model::RopeStyle::kRotateHalf, true);
  auto a = make_engine(cfg);
  auto b = make_engine(cfg, {}, 8);  // other weights
  GenerationRequest r;
  r.prompt = prompt_of(5, 4);
  r.max_new_tokens = 12;
  r.sampling.greedy = true;
  const auto ta = a->generate({r})[0].tokens;
  CHECK(b->generate({r})[0].tokens != ta);
  for (int u = 0; u < a->num_units(); ++u)  // what weight sync will do: overwrite the buffers
    std::copy_n(a->unit_buffer(u), a->layout().unit(u).numel, b->unit_buffer(u));
  CHECK(b->generate({r})[0].tokens == ta);
  CHECK_THROWS_AS(a->provider().acquire_grads(0), Error);
}

TEST_CASE("an error mid-generation leaves the KV cache empty and the engine usable") {
  const auto cfg = tiny(false, model::RopeStyle::kRotateHalf, true);
  auto engine = make_engine(cfg);
  GenerationRequest r;
  r.prompt = prompt_of(6, 1);
  r.max_new_tokens = 8;
  r.n_samples = 3;
  const auto good = engine->generate({r})[0].tokens;
  // NaN in the final norm: every logit is NaN, sampling throws on the first token.
  const int hu = engine->layout().head_unit();
  float* norm = engine->unit_buffer(hu) + engine->layout().unit(hu).at("model.norm.weight").offset;
  const float saved = norm[0];
  norm[0] = NAN;
  CHECK_THROWS_WITH_AS(engine->generate({r, r}), doctest::Contains("not finite"), Error);
  CHECK(engine->kv_cache().used_blocks() == 0);
  norm[0] = saved;
  CHECK(engine->generate({r})[0].tokens == good);
}

TEST_CASE(
    "prompts split over engines, keyed by the global prompt index, give one engine's samples") {
  // What `rlhf generate` does on several ranks: engine e of E completes the prompts
  // [N·e/E, N·(e+1)/E) with request id = the prompt's global index. Every sample must equal the
  // one-engine run's, whatever E; keying by the index inside an engine's block (what a rank-local
  // numbering would do) changes the sampled tokens.
  const auto cfg = tiny(false, model::RopeStyle::kRotateHalf, true);
  auto reqs = mixed_requests();
  for (size_t i = 0; i < reqs.size(); ++i) {
    reqs[i].id = uint64_t(i);  // the prompt index
    reqs[i].sampling.greedy = false;
    reqs[i].sampling.temperature = 1.0;
    reqs[i].sampling.top_k = -1;
    reqs[i].sampling.top_p = 1.0;
    reqs[i].max_new_tokens = 12;
  }
  auto one = make_engine(cfg);
  const auto all = by_key(one->generate(reqs));
  const int64_t N = int64_t(reqs.size());
  for (int E : {2, 3, 4}) {
    std::map<std::pair<uint64_t, int64_t>, GenerationResult> split;
    bool local_differs = false;
    for (int e = 0; e < E; ++e) {
      const int64_t lo = N * e / E, hi = N * (e + 1) / E;
      std::vector<GenerationRequest> block(reqs.begin() + lo, reqs.begin() + hi);
      auto engine = make_engine(cfg);  // another engine with the same weights
      for (auto& [k, v] : by_key(engine->generate(block))) split[k] = std::move(v);
      if (lo == 0) continue;
      // The same block keyed by its local index: other random streams, other tokens.
      for (size_t j = 0; j < block.size(); ++j) block[j].id = uint64_t(j);
      const auto local = engine->generate(block);
      for (const GenerationResult& r : local)
        local_differs |= r.tokens != all.at({uint64_t(lo) + r.request_id, r.sample_index}).tokens;
    }
    check_same(all, split, fmt::format("{} engines", E));
    CHECK_MESSAGE(local_differs, E << " engines: local keys gave the same tokens");
  }
}
