// Multi-turn episodes (rl::generate_episodes with an environment) on tensor-parallel engines: only
// the engine's TP rank 0 asks the environment (the other ranks hold make_environment's stand-in,
// which throws if asked) and broadcasts its answers, so every rank of the group returns the same
// samples bit for bit — tokens, log-probs, action masks, turns, finish reasons, rewards — and on
// the CPU those equal the TP 1 engine's (greedy: tokens, masks, turns and rewards exactly,
// log-probs within 1e-4 as in test_engine_tp.cpp). An environment program is started once per
// engine (on TP rank 0). An environment failing on TP rank 0 is the same error on every rank of
// the group, without a hang, and leaves the engine usable. On GPU engines (NCCL; the emulator in
// CI) the group agrees bit for bit and follows the TP 1 GPU engine's samples within the bf16
// tolerance of test_engine_tp_cuda.cpp.
#include <doctest/doctest.h>
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "core/error.h"
#include "io/tokenizer.h"
#include "model/config.h"
#include "model/ops/half.h"
#include "parallel/comm.h"
#include "parallel/mpi_check.h"
#include "rl/env_share.h"
#include "rl/environment.h"
#include "rl/episodes.h"
#include "rollout/engine.h"
#include "tests/mpi/train_util.h"
#include "tests/test_util.h"

using namespace rlhf;

namespace {

// Byte-level (vocab 259), 8 heads over 4 KV heads, intermediate 176: TP 2 and TP 4 split it.
model::ModelConfig byte_config() {
  model::ModelConfig c;
  c.model_type = "llama";
  c.hidden_size = 64;
  c.intermediate_size = 176;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 8;
  c.num_key_value_heads = 4;
  c.vocab_size = io::ByteTokenizer::kVocabSize;
  c.max_position_embeddings = 96;
  c.rms_norm_eps = 1e-5;
  c.bos_token_id = io::ByteTokenizer::kBos;
  c.eos_token_id = io::ByteTokenizer::kEos;
  c.pad_token_id = io::ByteTokenizer::kPad;
  return c;
}

// Random weights rounded to bf16 values (exact on the GPU engine too), norms around 1, a 4x
// sharper LM head (fewer near-ties).
std::unique_ptr<rollout::Engine> make_engine(parallel::Comm* tp, bool cuda) {
  const model::ParamLayout layout(byte_config(), model::HeadKind::kLM);
  rollout::EngineOptions o;
  o.tp_comm = tp;
  o.cuda = cuda;
  o.kv_cache_bytes = 4 << 20;
  o.gpu_memory_utilization = 0.05;
  o.max_batch = 8;
  auto e = std::make_unique<rollout::Engine>(layout, o);
  for (int u = 0; u < layout.num_units(); ++u) {
    const model::UnitLayout& ul = layout.unit(u);
    auto v = test::random_vec<float>(ul.numel, 11 + uint64_t(u), -0.12, 0.12);
    for (const model::TensorInfo& t : ul.tensors)
      if (t.name.find("norm") != std::string::npos)
        for (int64_t i = 0; i < t.numel; ++i) v[size_t(t.offset + i)] += 1.0f;
    if (const model::TensorInfo* h = ul.find("lm_head.weight"))
      for (int64_t i = 0; i < h->numel; ++i) v[size_t(h->offset + i)] *= 4.0f;
    for (float& x : v) x = model::round_to_bf16(x);
    std::copy(v.begin(), v.end(), e->unit_buffer(u));
  }
  return e;
}

// 4 prompts x 2 samples, greedy (the two samples of a prompt differ by the toy's answers only).
struct Batch {
  io::ByteTokenizer tok;
  std::vector<std::string> texts = {"ab", "hello", "xyz", "q"};
  std::vector<rollout::GenerationRequest> reqs;
  std::vector<rl::EpisodeContext> ctx;
  Batch() {
    for (size_t i = 0; i < texts.size(); ++i) {
      rollout::GenerationRequest r;
      r.id = 30 + i;
      r.prompt = tok.encode(texts[i], true, false);
      r.n_samples = 2;
      r.max_new_tokens = 40;
      r.sampling.greedy = true;
      reqs.push_back(r);
      ctx.push_back({&texts[i], nullptr});
    }
  }
};

// Stop strings that end turns often: the bytes the TP 1 engine writes at response positions 2..3
// of each single-turn sample (the same on every rank: the TP 1 engine is deterministic).
std::vector<std::string> stop_strings(rollout::Engine& one, const Batch& b) {
  std::set<std::string> s;
  for (const rollout::Sample& x : rl::generate_episodes(one, b.reqs, b.ctx, 0, b.tok, {}))
    for (size_t t = 2; t < 4 && t < x.response.size(); ++t)
      if (x.response[t] < 256) s.insert(std::string(1, char(x.response[t])));
  return {s.begin(), s.end()};
}

// FNV-1a over everything a sample carries.
uint64_t fingerprint(const std::vector<rollout::Sample>& v) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&](const void* p, size_t n) {
    for (size_t i = 0; i < n; ++i) h = (h ^ static_cast<const uint8_t*>(p)[i]) * 1099511628211ull;
  };
  for (const rollout::Sample& s : v) {
    mix(s.response.data(), s.response.size() * sizeof(int32_t));
    mix(s.gen_logprobs.data(), s.gen_logprobs.size() * sizeof(float));
    mix(s.action_mask.data(), s.action_mask.size());
    const int64_t meta[] = {s.turns, int64_t(s.finish), s.has_env_reward};
    mix(meta, sizeof(meta));
    mix(&s.env_reward, sizeof(s.env_reward));
  }
  return h;
}

// Every rank of `comm` holds the same samples, bit for bit.
bool group_agrees(const std::vector<rollout::Sample>& v, MPI_Comm comm) {
  return test::same_on_all_ranks(fingerprint(v), comm);
}

// The toy environment, counting the turn ends it answered.
struct CountingToy : rl::Environment {
  rl::ToyEnvironment toy;
  int64_t asked = 0;
  std::string name() const override { return "counting toy"; }
  std::vector<rl::EnvAnswer> step(const std::vector<rl::EnvQuery>& q) override {
    asked += int64_t(q.size());
    return toy.step(q);
  }
};

// The toy, failing at its second batch.
struct FailingToy : rl::Environment {
  rl::ToyEnvironment toy;
  int calls = 0;
  std::string name() const override { return "failing toy"; }
  std::vector<rl::EnvAnswer> step(const std::vector<rl::EnvQuery>& q) override {
    RLHF_CHECK(++calls < 2, "failing toy: crashed at batch {}", calls);
    return toy.step(q);
  }
};

// Samples whose episode took more than one turn, and observation tokens in all.
std::pair<int64_t, int64_t> multi_turn_counts(const std::vector<rollout::Sample>& v) {
  int64_t multi = 0, obs = 0;
  for (const rollout::Sample& s : v) {
    multi += s.turns > 1;
    for (uint8_t m : s.action_mask) obs += m == 0;
  }
  return {multi, obs};
}

// Splits the world into groups of T consecutive ranks; null when the world does not divide.
struct Group {
  MPI_Comm mpi = MPI_COMM_NULL;
  std::unique_ptr<parallel::Comm> comm;
  explicit Group(int T) {
    const int rank = parallel::comm_rank(MPI_COMM_WORLD);
    MPI_Comm_split(MPI_COMM_WORLD, rank / T, rank, &mpi);
    comm = parallel::make_comm(mpi, "engine_comm");
  }
  ~Group() {
    comm.reset();
    MPI_Comm_free(&mpi);
  }
};

}  // namespace

TEST_CASE("turn answers: encode/decode round trip, and cut bytes are an error") {
  rl::SharedTurnAnswers a;
  a.keys = {0, 1, 17, 3, 0, 5};
  a.answers.resize(2);
  a.answers[0].observation = {60, 55, 62};
  a.answers[0].reward = 0.25;
  a.answers[1].done = true;
  const std::vector<uint8_t> bytes = rl::encode_turn_answers(a);
  const rl::SharedTurnAnswers b = rl::decode_turn_answers(bytes);
  CHECK(b.error.empty());
  CHECK(b.keys == a.keys);
  REQUIRE(b.answers.size() == 2);
  CHECK(b.answers[0].observation == a.answers[0].observation);
  CHECK(!b.answers[0].done);
  CHECK(b.answers[0].reward == 0.25);
  CHECK(b.answers[1].observation.empty());
  CHECK(b.answers[1].done);
  CHECK(!b.answers[1].reward.has_value());
  rl::SharedTurnAnswers e;
  e.error = "--env_command 'x': exited";
  CHECK(rl::decode_turn_answers(rl::encode_turn_answers(e)).error == e.error);
  std::vector<uint8_t> cut(bytes.begin(), bytes.end() - 3);
  CHECK_THROWS_AS(rl::decode_turn_answers(cut), Error);
  std::vector<uint8_t> extra = bytes;
  extra.push_back(0);
  CHECK_THROWS_AS(rl::decode_turn_answers(extra), Error);
  // On a TP rank other than 0 nothing starts; the stand-in refuses to answer. A bad builtin name
  // is refused on every rank.
  const auto peer = rl::make_environment("exit 3", 5, 1);
  CHECK(peer->name() == "exit 3");
  CHECK_THROWS_AS(peer->step({rl::EnvQuery{}}), Error);
  CHECK_THROWS_AS(rl::make_environment("builtin:nope", 5, 1), Error);
}

TEST_CASE("multi-turn episodes on TP 2 and 4 CPU engines: TP 1's samples, env on TP rank 0") {
  const int world = parallel::comm_size(MPI_COMM_WORLD);
  const Batch b;
  auto one = make_engine(nullptr, false);
  rl::EpisodeOptions opt;
  opt.stop_strings = stop_strings(*one, b);
  opt.max_turns = 4;
  CountingToy toy1;
  opt.env = &toy1;
  const std::vector<rollout::Sample> ref =
      rl::generate_episodes(*one, b.reqs, b.ctx, 0, b.tok, opt);
  const auto [multi, obs] = multi_turn_counts(ref);
  MESSAGE("TP 1: ", opt.stop_strings.size(), " stop strings, ", multi, " of ", ref.size(),
          " samples multi-turn, ", obs, " observation tokens");
  REQUIRE(multi >= 3);  // the comparison covers observations fed on every rank
  for (const int T : {2, 4}) {
    if (world % T != 0) continue;
    INFO("TP ", T);
    Group g(T);
    auto tp = make_engine(g.comm.get(), false);
    CountingToy toy;
    const auto stand_in = rl::make_environment("builtin:toy", 5, tp->tp_rank());
    rl::EpisodeOptions o = opt;
    o.env = tp->tp_rank() == 0 ? static_cast<rl::Environment*>(&toy) : stand_in.get();
    rl::EpisodeStats stats;
    const std::vector<rollout::Sample> got =
        rl::generate_episodes(*tp, b.reqs, b.ctx, 0, b.tok, o, {}, &stats);
    CHECK(group_agrees(got, g.mpi));
    CHECK(stats.env_calls == toy1.asked);  // every rank took the same turn ends
    if (tp->tp_rank() == 0) CHECK(toy.asked == toy1.asked);
    REQUIRE(got.size() == ref.size());
    double max_diff = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
      const rollout::Sample &x = ref[i], &y = got[i];
      INFO("sample ", i);
      CHECK(y.response == x.response);
      CHECK(y.action_mask == x.action_mask);
      CHECK(y.turns == x.turns);
      CHECK(y.finish == x.finish);
      CHECK(y.has_env_reward == x.has_env_reward);
      CHECK(y.env_reward == x.env_reward);
      if (y.response != x.response) continue;
      for (size_t t = 0; t < x.gen_logprobs.size(); ++t)
        max_diff = std::max(max_diff, double(std::fabs(x.gen_logprobs[t] - y.gen_logprobs[t])));
    }
    CHECK(max_diff < 1e-4);
  }
}

TEST_CASE("multi-turn episodes on a TP 2 CPU engine: the program runs once per engine") {
  const int world = parallel::comm_size(MPI_COMM_WORLD);
  if (world % 2 != 0) return;
  const int rank = parallel::comm_rank(MPI_COMM_WORLD);
  // A folder of rank 0's, named on every rank.
  long id = rank == 0 ? long(::getpid()) : 0;
  MPI_Bcast(&id, 1, MPI_LONG, 0, MPI_COMM_WORLD);
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("rlhf_env_tp_" + std::to_string(id));
  if (rank == 0) std::filesystem::create_directories(dir);
  MPI_Barrier(MPI_COMM_WORLD);
  const std::string started = (dir / ("engine" + std::to_string(rank / 2))).string();
  const std::string cmd = "echo started >> '" + started +
                          "'; while read -r l; do echo '{\"observation\": \"<7>\", \"reward\": "
                          "0.5}'; done";
  Group g(2);
  const Batch b;
  auto tp = make_engine(g.comm.get(), false);
  rl::EpisodeOptions o;
  o.stop_strings = stop_strings(*tp, b);
  const auto env = rl::make_environment(cmd, 20, tp->tp_rank());
  o.env = env.get();
  o.max_turns = 3;
  const std::vector<rollout::Sample> got = rl::generate_episodes(*tp, b.reqs, b.ctx, 0, b.tok, o);
  CHECK(group_agrees(got, g.mpi));
  int64_t rewarded = 0, seven = 0;
  for (const rollout::Sample& s : got) {
    rewarded += s.has_env_reward && s.env_reward == 0.5;
    const std::string text = b.tok.decode(s.response, true);
    seven += text.find("<7>") != std::string::npos;
  }
  CHECK(rewarded >= 3);
  CHECK(seven >= 3);
  MPI_Barrier(MPI_COMM_WORLD);
  std::ifstream f(started);
  std::string line;
  int lines = 0;
  while (std::getline(f, line)) lines += line == "started";
  CHECK(lines == 1);  // one program for the engine's 2 ranks
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 0) std::filesystem::remove_all(dir);
}

TEST_CASE(
    "multi-turn episodes on a TP 2 CPU engine: an env failing on TP rank 0 fails every rank") {
  const int world = parallel::comm_size(MPI_COMM_WORLD);
  if (world % 2 != 0) return;
  Group g(2);
  const Batch b;
  auto tp = make_engine(g.comm.get(), false);
  rl::EpisodeOptions o;
  o.stop_strings = stop_strings(*tp, b);
  o.max_turns = 4;
  FailingToy failing;
  const auto stand_in = rl::make_environment("builtin:toy", 5, tp->tp_rank());
  o.env = tp->tp_rank() == 0 ? static_cast<rl::Environment*>(&failing) : stand_in.get();
  CHECK_THROWS_WITH_AS(rl::generate_episodes(*tp, b.reqs, b.ctx, 0, b.tok, o),
                       doctest::Contains("failing toy: crashed at batch 2"), Error);
  // Every rank left generate() at the same step: the engine still works, in lock step.
  CountingToy toy;
  o.env = tp->tp_rank() == 0 ? static_cast<rl::Environment*>(&toy) : stand_in.get();
  const std::vector<rollout::Sample> after = rl::generate_episodes(*tp, b.reqs, b.ctx, 0, b.tok, o);
  CHECK(group_agrees(after, g.mpi));
  CHECK(multi_turn_counts(after).first >= 3);
}

TEST_CASE("multi-turn episodes on a tensor-parallel GPU engine (device, NCCL): in lock step") {
  if (!test::select_gpu_per_rank()) {
    MESSAGE("skipped: needs a CUDA device per rank (and NCCL)");
    return;
  }
  const int world = parallel::comm_size(MPI_COMM_WORLD);
  const Batch b;
  auto one = make_engine(nullptr, true);
  rl::EpisodeOptions opt;
  opt.stop_strings = stop_strings(*one, b);
  opt.max_turns = 4;
  CountingToy toy1;
  opt.env = &toy1;
  const std::vector<rollout::Sample> ref =
      rl::generate_episodes(*one, b.reqs, b.ctx, 0, b.tok, opt);
  REQUIRE(multi_turn_counts(ref).first >= 3);
  for (const int T : {2, 4}) {
    if (world % T != 0) continue;
    INFO("TP ", T);
    Group g(T);
    auto tp = make_engine(g.comm.get(), true);
    CountingToy toy;
    const auto stand_in = rl::make_environment("builtin:toy", 5, tp->tp_rank());
    rl::EpisodeOptions o = opt;
    o.env = tp->tp_rank() == 0 ? static_cast<rl::Environment*>(&toy) : stand_in.get();
    const std::vector<rollout::Sample> got = rl::generate_episodes(*tp, b.reqs, b.ctx, 0, b.tok, o);
    CHECK(group_agrees(got, g.mpi));
    CHECK(multi_turn_counts(got).first >= 3);
    // Against TP 1 on the GPU: bf16 partial sums before the all-reduce can flip a near-tie
    // (test_engine_tp_cuda.cpp's tolerance): each sample equal up to its first difference, at
    // least half of all tokens compared, and where a sample is equal throughout, its mask, turns
    // and reward too.
    REQUIRE(got.size() == ref.size());
    int64_t total = 0, compared = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
      const auto &x = ref[i].response, &y = got[i].response;
      size_t t = 0;
      while (t < x.size() && t < y.size() && x[t] == y[t]) ++t;
      total += int64_t(x.size());
      compared += int64_t(t);
      if (x != y) continue;
      CHECK(got[i].action_mask == ref[i].action_mask);
      CHECK(got[i].turns == ref[i].turns);
      CHECK(got[i].env_reward == ref[i].env_reward);
    }
    MESSAGE("GPU TP ", T, ": ", compared, " of ", total, " tokens equal to TP 1's");
    CHECK(compared * 2 >= total);
  }
}
