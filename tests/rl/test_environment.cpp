// Environments of multi-turn rollouts: the protocol's lines, the built-in toy, --stop_strings,
// the long-lived program (--env_command) and its faults (crash, hang, garbage, flood, a huge
// line, output between batches), and generate_episodes end to end on a tiny engine with the byte
// tokenizer: the stop string ends the turn, the observation is masked, the reward is kept.
#include <chrono>
#include <string>
#include <vector>

#include "core/error.h"
#include "io/tokenizer.h"
#include "model/init.h"
#include "rl/env_command.h"
#include "rl/environment.h"
#include "rl/episodes.h"
#include "rollout/engine.h"
#include "tests/test_util.h"

using namespace rlhf;
using rl::EnvQuery;

namespace {

std::vector<EnvQuery> queries(int n, int64_t turn = 0) {
  std::vector<EnvQuery> q(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    q[size_t(i)].id = std::to_string(i) + "-0";
    q[size_t(i)].turn = turn;
    q[size_t(i)].text = "so far <calc>1+2</calc>";
    q[size_t(i)].action = "<calc>1+2</calc>";
  }
  return q;
}

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace

TEST_CASE("env protocol: request lines and answers") {
  EnvQuery q;
  q.id = "4-1";
  q.turn = 2;
  q.prompt = "p";
  q.text = "t\n";
  q.action = "a";
  q.label = 7;
  q.eos = true;
  CHECK(rl::env_query_line(q) ==
        R"({"id":"4-1","turn":2,"prompt":"p","text":"t\n","action":"a","label":7,"eos":true})");
  auto a = rl::parse_env_answer(R"({"observation": "<r>3</r>", "done": false, "reward": 0.5})",
                                "prog", 1);
  CHECK(a.observation == "<r>3</r>");
  CHECK(!a.done);
  CHECK(a.reward.value() == 0.5);
  a = rl::parse_env_answer(R"({"done": true, "extra": 1})", "prog", 1);
  CHECK(a.observation.empty());
  CHECK(a.done);
  CHECK(!a.reward);
  CHECK(!rl::parse_env_answer(R"({"reward": null})", "prog", 1).reward);
  for (const char* bad : {"hello", "[1]", R"({"observation": 3})", R"({"done": "yes"})",
                          R"({"reward": "1"})", R"({"reward": 1e999})"})
    CHECK_THROWS_WITH_AS(rl::parse_env_answer(bad, "prog", 3),
                         doctest::Contains("--env_command 'prog': answer 3"), Error);
}

TEST_CASE("builtin:toy answers by (prompt, sample, turn) only") {
  auto env = rl::make_environment("builtin:toy", 1);
  std::vector<EnvQuery> q = queries(1, 1);
  q[0].id = "12-5";
  auto a = env->step(q);
  CHECK(a[0].observation == "<8>");  // (12 + 5 + 1) mod 10
  CHECK(a[0].reward.value() == 0.5);
  CHECK(!a[0].done);
  q[0].turn = 3;
  CHECK(env->step(q)[0].done);
  q[0].id = "x";
  CHECK_THROWS_AS(env->step(q), Error);
  CHECK_THROWS_WITH_AS(rl::make_environment("builtin:nope", 1),
                       doctest::Contains("unknown built-in environment"), Error);
}

TEST_CASE("--stop_strings parsing") {
  CHECK(rl::parse_stop_strings("") == std::vector<std::string>{});
  CHECK(rl::parse_stop_strings("</calc>,\\n\\n,a\\,b,,x\\\\") ==
        std::vector<std::string>{"</calc>", "\n\n", "a,b", "x\\"});
  CHECK_THROWS_WITH_AS(rl::parse_stop_strings("a\\q"), doctest::Contains("--stop_strings"), Error);
  CHECK_THROWS_AS(rl::parse_stop_strings("a\\"), Error);
}

TEST_CASE("--env_command: a long-lived program answers batch after batch") {
  // One process for the whole test: it numbers its answers, so a restart would show.
  rl::CommandEnvironment env(
      "n=0; while IFS= read -r line; do n=$((n+1)); echo '' ; "
      "printf '{\"observation\": \"<%d>\", \"done\": %s, \"reward\": %d}\\n' $n "
      "$([ $n -ge 4 ] && echo true || echo false) $n; echo log >&2; done",
      10);
  auto a = env.step(queries(3));
  REQUIRE(a.size() == 3);
  CHECK(a[0].observation == "<1>");
  CHECK(a[2].observation == "<3>");
  CHECK(!a[2].done);
  a = env.step(queries(2));
  CHECK(a[0].observation == "<4>");
  CHECK(a[0].done);
  CHECK(a[1].reward.value() == 5);
  CHECK(env.step({}).empty());
}

TEST_CASE("--env_command faults are one clear error, and the program is gone") {
  struct Case {
    const char* name;
    std::string command;
    const char* message;
  };
  const std::vector<Case> cases = {
      {"crash", "read -r l; echo dying >&2; exit 3", "exited (exit status 3)"},
      {"hang", "read -r l; sleep 30", "timed out after 0.5s (--env_timeout) at turn 0"},
      {"garbage", "while read -r l; do echo hello; done", "answer 1 is not JSON: 'hello'"},
      {"flood", "while read -r l; do printf '{}\\n{}\\n{}\\n'; done",
       "more answer lines than asked"},
      {"out of order", "while read -r l; do echo '{\"id\": \"9-9\"}'; done",
       "answer 1 is for episode \"9-9\", but request 1 was for episode '0-0'"},
      {"huge line", "read -r l; head -c 1100000 /dev/zero | tr '\\0' a; echo",
       "answer 1 is longer than 1 MiB"},
      {"no answer at all", "exec 1>&-; sleep 30", "closed its stdout"},
  };
  for (const Case& c : cases) {
    INFO(c.name);
    const auto t0 = std::chrono::steady_clock::now();
    rl::CommandEnvironment env(c.command, 0.5);
    std::string what;
    try {
      for (int k = 0; k < 3; ++k) env.step(queries(2));  // flooding may show at the next batch
    } catch (const Error& e) {
      what = e.what();
    }
    CHECK(what.find(c.message) != std::string::npos);
    CHECK(what.find("--env_command '") != std::string::npos);
    // Later calls fail at once with the same error (the program was killed and reaped).
    std::string again;
    try {
      env.step(queries(1));
    } catch (const Error& e) {
      again = e.what();
    }
    CHECK(again == what);
    CHECK(seconds_since(t0) < 5);
  }
  // Stderr is quoted in the crash message.
  rl::CommandEnvironment crash("read -r l; echo 'bad thing happened' >&2; exit 1", 5);
  CHECK_THROWS_WITH_AS(crash.step(queries(1)), doctest::Contains("bad thing happened"), Error);
  // A program that ignores the end of its input is killed by the destructor within ~1 s.
  const auto t0 = std::chrono::steady_clock::now();
  { rl::CommandEnvironment stubborn("trap '' TERM; while true; do sleep 1; done", 5); }
  CHECK(seconds_since(t0) < 3);
}

TEST_CASE("generate_episodes: stop strings end turns, observations are masked, rewards kept") {
  // The byte-level tiny model with random weights; greedy.
  model::ModelConfig c;
  c.model_type = "llama";
  c.hidden_size = 32;
  c.intermediate_size = 64;
  c.num_hidden_layers = 1;
  c.num_attention_heads = 2;
  c.num_key_value_heads = 1;
  c.vocab_size = io::ByteTokenizer::kVocabSize;
  c.max_position_embeddings = 128;
  c.bos_token_id = io::ByteTokenizer::kBos;
  c.eos_token_id = io::ByteTokenizer::kEos;
  c.pad_token_id = io::ByteTokenizer::kPad;
  model::ParamLayout layout(c, model::HeadKind::kLM);
  rollout::Engine engine(layout, {});
  for (int u = 0; u < layout.num_units(); ++u)
    model::init_unit_params(engine.unit_buffer(u), layout.unit(u), 3, 0.5);
  io::ByteTokenizer tok;
  std::vector<rollout::GenerationRequest> reqs(2);
  std::vector<std::string> texts = {"ab", "cd"};
  std::vector<rl::EpisodeContext> ctx;
  for (size_t i = 0; i < 2; ++i) {
    reqs[i].id = 40 + i;
    reqs[i].prompt = tok.encode(texts[i], true, false);
    reqs[i].n_samples = 3;
    reqs[i].max_new_tokens = 60;
    ctx.push_back({&texts[i], nullptr});
  }
  // Single-turn, no stop strings: find the bytes the model writes, and pick a stop string from
  // one sample's text, so that turns end there.
  rl::EpisodeOptions plain;
  const auto base = rl::generate_episodes(engine, reqs, ctx, 0, tok, plain);
  const std::string t0 = tok.decode(base[0].response, true);
  REQUIRE(t0.size() >= 8);
  size_t at = 3;  // a 2-byte stop string whose first occurrence in t0 ends at byte 5 or later
  while (at + 2 < t0.size() && t0.find(t0.substr(at, 2)) != at) ++at;
  REQUIRE(at + 2 < t0.size());
  const size_t stop_end = at + 2;
  rl::EpisodeOptions opt;
  rl::ToyEnvironment toy;
  opt.env = &toy;
  opt.stop_strings = {t0.substr(at, 2)};
  opt.max_turns = 3;
  rl::EpisodeStats stats;
  const auto eps = rl::generate_episodes(engine, reqs, ctx, 10, tok, opt, {}, &stats);
  REQUIRE(eps.size() == 6);
  CHECK(eps[0].prompt_pos == 10);
  CHECK(stats.env_calls >= 1);
  // Sample 0 of request 0 writes the same text up to the stop string, which ends its turn 0.
  const rollout::Sample& s = eps[0];
  REQUIRE(s.turns >= 2);
  const auto span = [&](size_t a, size_t b) {
    return tok.decode(
        std::vector<int32_t>(s.response.begin() + long(a), s.response.begin() + long(b)), true);
  };
  CHECK(span(0, stop_end) == t0.substr(0, stop_end));
  // Then the toy's observation "<d>" (3 bytes, mask 0), d = (40 + 0 + 0) mod 10.
  REQUIRE(s.action_mask.size() == s.response.size());
  CHECK(span(stop_end, stop_end + 3) == "<0>");
  std::vector<uint8_t> head(stop_end, 1);
  head.insert(head.end(), {0, 0, 0, 1});
  CHECK(std::vector<uint8_t>(s.action_mask.begin(), s.action_mask.begin() + long(head.size())) ==
        head);
  // Every observation is the toy's 3 bytes (one may be cut by the length limit), and the reward
  // is the toy's at the last turn end.
  for (const rollout::Sample& e : eps) {
    INFO("prompt ", e.prompt_pos, " sample ", e.sample_index, " finish ",
         rollout::to_string(e.finish));
    int64_t obs = 0;
    for (uint8_t m : e.action_mask) obs += m == 0;
    if (e.finish == rollout::FinishReason::kLength) {
      CHECK(obs <= 3 * e.turns);
    } else {
      CHECK(obs == 3 * (e.turns - 1));
      CHECK(e.has_env_reward);
      CHECK(e.env_reward == double(e.turns) / 4.0);
    }
  }
}
