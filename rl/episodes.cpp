#include "rl/episodes.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <span>
#include <utility>

#include "core/error.h"

namespace rlhf::rl {

std::vector<std::string> parse_stop_strings(const std::string& spec) {
  std::vector<std::string> out;
  std::string cur;
  for (size_t i = 0; i < spec.size(); ++i) {
    const char c = spec[i];
    if (c == ',') {
      if (!cur.empty()) out.push_back(std::move(cur));
      cur.clear();
      continue;
    }
    if (c != '\\') {
      cur += c;
      continue;
    }
    RLHF_CHECK(i + 1 < spec.size(), "--stop_strings '{}': a trailing backslash escapes nothing",
               spec);
    const char e = spec[++i];
    switch (e) {
      case ',':
        cur += ',';
        break;
      case 'n':
        cur += '\n';
        break;
      case 't':
        cur += '\t';
        break;
      case '\\':
        cur += '\\';
        break;
      default:
        RLHF_FAIL(
            "--stop_strings '{}': unknown escape '\\{}'\nhint: the escapes are \\, (a comma), "
            "\\n, \\t and \\\\",
            spec, e);
    }
  }
  if (!cur.empty()) out.push_back(std::move(cur));
  return out;
}

namespace {

// The hooks' view of a run: stop strings through the tokenizer, the environment's answers, and
// the rewards it gave.
struct Hooks {
  const std::vector<rollout::GenerationRequest>& requests;
  const std::vector<EpisodeContext>& contexts;
  const io::Tokenizer& tok;
  const EpisodeOptions& opt;
  EpisodeStats& stats;
  size_t window = 0;  // tokens decoded to look for a stop string (each gives >= 1 byte)
  std::map<std::pair<int64_t, int64_t>, double> rewards;  // (request, sample) → last reward

  // A stop string in the text of the turn's last `window` tokens: the turn ends here (a stop
  // string found is new — the turn would have ended at an earlier one).
  bool ends_turn(const std::vector<int32_t>& resp, int64_t begin) const {
    const int64_t n = int64_t(resp.size());
    const int64_t from = std::max(begin, n - int64_t(window));
    if (from >= n) return false;
    const std::string text =
        tok.decode(std::span<const int32_t>(resp.data() + from, size_t(n - from)), false);
    for (const std::string& s : opt.stop_strings)
      if (text.find(s) != std::string::npos) return true;
    return false;
  }

  void on_turn_end(std::vector<rollout::TurnEnd>& ends) {
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<EnvQuery> queries(ends.size());
    for (size_t i = 0; i < ends.size(); ++i) {
      const rollout::TurnEnd& e = ends[i];
      const EpisodeContext& c = contexts[size_t(e.request_index)];
      const std::vector<int32_t>& t = *e.tokens;
      EnvQuery& q = queries[i];
      q.id = std::to_string(e.request_id) + "-" + std::to_string(e.sample_index);
      q.turn = e.turn;
      q.prompt = c.prompt_text ? *c.prompt_text : std::string();
      q.text = tok.decode(t, true);
      q.action = tok.decode(
          std::span<const int32_t>(t.data() + e.turn_begin, t.size() - size_t(e.turn_begin)), true);
      q.label = c.label ? *c.label : nlohmann::json();
      q.eos = e.eos;
    }
    const std::vector<EnvAnswer> answers = opt.env->step(queries);
    RLHF_CHECK(answers.size() == ends.size(), "environment {}: {} answers for {} turn ends",
               opt.env->name(), answers.size(), ends.size());
    for (size_t i = 0; i < ends.size(); ++i) {
      rollout::TurnEnd& e = ends[i];
      const EnvAnswer& a = answers[i];
      e.done = a.done;
      if (!a.done && !e.eos && !a.observation.empty())
        e.observation = tok.encode(a.observation, false, false);
      if (a.reward) rewards[{e.request_index, e.sample_index}] = *a.reward;
    }
    stats.env_calls += int64_t(ends.size());
    stats.env_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
};

}  // namespace

std::vector<rollout::Sample> generate_episodes(
    rollout::Engine& engine, const std::vector<rollout::GenerationRequest>& requests,
    const std::vector<EpisodeContext>& contexts, int64_t pos_offset, const io::Tokenizer& tokenizer,
    const EpisodeOptions& options, const rollout::ProgressFn& progress, EpisodeStats* stats) {
  RLHF_CHECK(contexts.size() == requests.size(), "internal error: {} contexts for {} requests",
             contexts.size(), requests.size());
  EpisodeStats local_stats;
  Hooks h{requests, contexts, tokenizer, options, stats ? *stats : local_stats, 0, {}};
  for (const std::string& s : options.stop_strings) h.window = std::max(h.window, s.size() + 1);
  rollout::TurnHooks hooks;
  if (!options.stop_strings.empty())
    hooks.ends_turn = [&h](const std::vector<int32_t>& r, int64_t b) { return h.ends_turn(r, b); };
  if (options.env != nullptr)
    hooks.on_turn_end = [&h](std::vector<rollout::TurnEnd>& e) { h.on_turn_end(e); };
  hooks.max_turns = options.env != nullptr ? options.max_turns : 1;
  std::vector<rollout::GenerationResult> results =
      engine.generate(requests, progress, options.multi_turn() ? &hooks : nullptr);
  std::vector<rollout::Sample> out;
  out.reserve(results.size());
  for (rollout::GenerationResult& res : results) {
    rollout::Sample s;
    s.prompt_pos = pos_offset + res.request_index;
    s.sample_index = res.sample_index;
    s.prompt = requests[size_t(res.request_index)].prompt;
    s.response = std::move(res.tokens);
    s.gen_logprobs = std::move(res.logprobs);
    s.finish = res.finish;
    s.stopped = rollout::ended_naturally(res.finish);
    // The mask only where an observation was appended: all-ones stays implicit.
    if (std::find(res.action_mask.begin(), res.action_mask.end(), 0) != res.action_mask.end())
      s.action_mask = std::move(res.action_mask);
    s.turns = int32_t(res.turns);
    if (auto it = h.rewards.find({res.request_index, res.sample_index}); it != h.rewards.end()) {
      s.has_env_reward = true;
      s.env_reward = it->second;
    }
    out.push_back(std::move(s));
  }
  return out;
}

}  // namespace rlhf::rl
