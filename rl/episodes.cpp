#include "rl/episodes.h"

#include <algorithm>
#include <chrono>
#include <exception>
#include <map>
#include <span>
#include <utility>

#include "core/error.h"
#include "parallel/comm.h"
#include "parallel/watchdog.h"
#include "rl/env_share.h"

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
  parallel::Comm* tp = nullptr;  // the engine's TP group (size > 1), else null
  size_t window = 0;             // tokens decoded to look for a stop string (each gives >= 1 byte)
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

  // The environment's answers to `ends`, tokenized. Throws what the environment throws, and
  // rlhf::Error for an answer count other than the queries'.
  std::vector<TurnAnswer> ask(const std::vector<rollout::TurnEnd>& ends) const {
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
    std::vector<TurnAnswer> out(ends.size());
    for (size_t i = 0; i < ends.size(); ++i) {
      const EnvAnswer& a = answers[i];
      out[i].done = a.done;
      if (!a.done && !ends[i].eos && !a.observation.empty())
        out[i].observation = tok.encode(a.observation, false, false);
      out[i].reward = a.reward;
    }
    return out;
  }

  // Tensor parallel: rank 0 asks the environment and sends the answers (or its error) to the
  // other ranks of the engine, which take them instead of asking; every rank ends with the same
  // answers, or throws the same error.
  std::vector<TurnAnswer> ask_shared(const std::vector<rollout::TurnEnd>& ends) const {
    SharedTurnAnswers shared;
    for (const rollout::TurnEnd& e : ends)
      shared.keys.insert(shared.keys.end(),
                         {e.request_index, e.sample_index, int64_t(e.tokens->size())});
    const MPI_Comm comm = tp->mpi_comm();
    if (tp->rank() == 0) {
      std::exception_ptr error;
      try {
        shared.answers = ask(ends);
      } catch (const std::exception& e) {
        shared.error = e.what();
        error = std::current_exception();
      } catch (...) {
        shared.error = "the environment threw an unknown exception";
        error = std::current_exception();
      }
      share_turn_answers(comm, tp->name(), shared);  // the error too: no peer waits for nothing
      if (error) std::rethrow_exception(error);
      return std::move(shared.answers);
    }
    SharedTurnAnswers got;
    share_turn_answers(comm, tp->name(), got);
    if (!got.error.empty())
      throw Error(
          fmt::format("{}\n(the environment runs on TP rank 0 of this engine, world rank {})",
                      got.error, parallel::world_ranks_of(comm)[0]),
          "rl/episodes.cpp");
    RLHF_CHECK(got.keys == shared.keys && got.answers.size() == ends.size(),
               "internal error: the ranks of a tensor-parallel engine disagree on the turns that "
               "ended in one step ({} on TP rank 0, {} on TP rank {})",
               got.keys.size() / 3, ends.size(), tp->rank());
    return std::move(got.answers);
  }

  void on_turn_end(std::vector<rollout::TurnEnd>& ends) {
    const auto t0 = std::chrono::steady_clock::now();
    const std::vector<TurnAnswer> answers = tp != nullptr ? ask_shared(ends) : ask(ends);
    for (size_t i = 0; i < ends.size(); ++i) {
      rollout::TurnEnd& e = ends[i];
      e.done = answers[i].done;
      e.observation = answers[i].observation;
      if (answers[i].reward) rewards[{e.request_index, e.sample_index}] = *answers[i].reward;
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
  parallel::Comm* tp = engine.tp_size() > 1 ? engine.options().tp_comm : nullptr;
  Hooks h{requests, contexts, tokenizer, options, stats ? *stats : local_stats, tp, 0, {}};
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
