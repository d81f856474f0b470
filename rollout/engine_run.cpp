#include "rollout/engine_run.h"

#include <algorithm>
#include <chrono>

#include "core/error.h"

namespace rlhf::rollout {

Engine::Run::Run(const std::vector<GenerationRequest>& requests, Plan plan_, KvCache& cache,
                 EngineStats& stats, const TurnHooks* hooks, int32_t eos, bool ignore_eos,
                 int64_t vocab_size)
    : plan(std::move(plan_)),
      cache_(cache),
      stats_(stats),
      hooks_(hooks),
      eos_(eos),
      ignore_eos_(ignore_eos),
      vocab_size_(vocab_size),
      results_(requests.size()),
      first_(requests.size()),
      finished_(requests.size(), 0) {
  for (size_t i = 0; i < requests.size(); ++i) {
    first_[i] = requests[i].first_sample_index;
    results_[i].resize(static_cast<size_t>(requests[i].n_samples));
    pending.push_back({int64_t(i), 0, requests[i].n_samples});
  }
}

void Engine::Seq::open(const GenerationRequest& r, int64_t index, int64_t sample,
                       int64_t max_new_tokens) {
  request_index = index;
  request_id = r.id;
  sample_index = sample;
  sampling = &r.sampling;
  max_new = max_new_tokens;
  result = GenerationResult{};
  result.request_index = index;
  result.request_id = r.id;
  result.sample_index = sample;
  result.tokens = r.prefix;
  result.logprobs = r.prefix_logprobs;
  result.logprobs.resize(r.prefix.size(), 0.0f);
}

Engine::Run::~Run() {
  for (auto* seqs : {&turning, &active})
    for (auto& s : *seqs)
      if (s && !s->blocks.empty()) cache_.release(s->blocks);
}

void Engine::Run::finish(Seq& s, FinishReason r) {
  s.result.finish = r;
  s.result.turns = s.turn + 1;
  cache_.release(s.blocks);
  s.blocks.clear();
  record(s, std::move(s.result));
}

void Engine::Run::record(const Seq& s, GenerationResult&& result) {
  const size_t ri = size_t(s.request_index);
  results_[ri][size_t(s.sample_index - first_[ri])] = std::move(result);
  ++finished_[ri];
  ++samples_done;
}

Engine::Run::Outcome Engine::Run::append(Seq& s, const SampledToken& t) {
  s.result.tokens.push_back(t.token);
  s.result.logprobs.push_back(t.logprob);
  ++stats_.generated_tokens;
  const bool stop = !ignore_eos_ && t.token == eos_;
  if (hooks_ != nullptr) {
    s.result.action_mask.push_back(1);
    // A turn ends on EOS or when the hook sees a stop string at the end of the turn.
    if (stop || (hooks_->ends_turn && hooks_->ends_turn(s.result.tokens, s.turn_begin))) {
      s.eos = stop;
      s.next_token = t.token;
      if (hooks_->on_turn_end) return Outcome::kTurnEnd;
      finish(s, stop ? FinishReason::kStop : FinishReason::kStopString);
      return Outcome::kFinished;
    }
  }
  const bool length = static_cast<int64_t>(s.result.tokens.size()) >= s.max_new;
  if (!stop && !length) {
    s.next_token = t.token;
    return Outcome::kGoing;
  }
  finish(s, stop ? FinishReason::kStop : FinishReason::kLength);
  return Outcome::kFinished;
}

void Engine::Run::resolve_turns(std::vector<std::unique_ptr<Seq>>& turning,
                                std::vector<std::unique_ptr<Seq>>& active) {
  // The hook sees the samples in a fixed order, whatever the batch and admission did.
  std::sort(turning.begin(), turning.end(), [](const auto& a, const auto& b) {
    return a->request_index != b->request_index ? a->request_index < b->request_index
                                                : a->sample_index < b->sample_index;
  });
  std::vector<TurnEnd> ends(turning.size());
  for (size_t i = 0; i < turning.size(); ++i) {
    const Seq& s = *turning[i];
    ends[i].request_index = s.request_index;
    ends[i].request_id = s.request_id;
    ends[i].sample_index = s.sample_index;
    ends[i].turn = s.turn;
    ends[i].turn_begin = s.turn_begin;
    ends[i].eos = s.eos;
    ends[i].tokens = &s.result.tokens;
  }
  const auto t0 = std::chrono::steady_clock::now();
  hooks_->on_turn_end(ends);
  stats_.turn_hook_s +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  stats_.turn_ends += int64_t(ends.size());
  // Checked before any sample leaves `turning` (whose guard returns their KV blocks on a throw).
  for (size_t i = 0; i < turning.size(); ++i)
    for (int32_t tok : ends[i].observation)
      RLHF_CHECK(tok >= 0 && tok < vocab_size_,
                 "request {} (id {}), sample {}: observation token {} after turn {} is outside the "
                 "vocabulary [0, {})",
                 ends[i].request_index, ends[i].request_id, ends[i].sample_index, tok, ends[i].turn,
                 vocab_size_);
  for (size_t i = 0; i < turning.size(); ++i) {
    std::unique_ptr<Seq> sp = std::move(turning[i]);
    Seq& s = *sp;
    const TurnEnd& e = ends[i];
    if (s.eos) {
      finish(s, FinishReason::kStop);
      continue;
    }
    if (e.done) {
      finish(s, FinishReason::kEnvDone);
      continue;
    }
    if (s.turn + 1 >= hooks_->max_turns) {
      finish(s, FinishReason::kMaxTurns);
      continue;
    }
    // The observation and at least one more sampled token must fit under max_new.
    const int64_t n = static_cast<int64_t>(s.result.tokens.size());
    const int64_t obs = static_cast<int64_t>(e.observation.size());
    const int64_t fits = std::clamp<int64_t>(s.max_new - n, 0, obs);
    s.result.tokens.insert(s.result.tokens.end(), e.observation.begin(),
                           e.observation.begin() + fits);
    s.result.logprobs.insert(s.result.logprobs.end(), size_t(fits), 0.0f);
    s.result.action_mask.insert(s.result.action_mask.end(), size_t(fits), uint8_t(0));
    stats_.observation_tokens += fits;
    if (n + obs >= s.max_new) {  // no room left to sample after it
      finish(s, FinishReason::kLength);
      continue;
    }
    s.extra = e.observation;
    ++s.turn;
    s.turn_begin = static_cast<int64_t>(s.result.tokens.size());
    active.push_back(std::move(sp));
  }
  turning.clear();
}

bool Engine::Run::quota_reached(const std::vector<GenerationRequest>& requests,
                                int64_t quota_groups) const {
  // Per group key: whether any of its requests still has a sample going (keys are sparse).
  std::vector<std::pair<int64_t, bool>> groups;  // (key, complete)
  for (size_t i = 0; i < requests.size(); ++i) {
    if (requests[i].group < 0) continue;
    groups.push_back({requests[i].group, finished_[i] == requests[i].n_samples});
  }
  std::sort(groups.begin(), groups.end());
  int64_t complete = 0;
  for (size_t i = 0; i < groups.size();) {
    size_t j = i;
    bool all = true;
    for (; j < groups.size() && groups[j].first == groups[i].first; ++j)
      all = all && groups[j].second;
    complete += all;
    i = j;
  }
  return complete >= quota_groups;
}

void Engine::Run::interrupt_all(const std::vector<GenerationRequest>& requests,
                                std::vector<std::unique_ptr<Seq>>* keep) {
  for (auto& s : active) {
    s->result.interrupted = true;
    if (keep == nullptr) {
      finish(*s, FinishReason::kLength);
      continue;
    }
    // Its result is a copy: the sequence keeps its tokens (and blocks) to be recognised later.
    GenerationResult out = s->result;
    out.finish = FinishReason::kLength;
    record(*s, std::move(out));
    s->prompt = requests[size_t(s->request_index)].prompt;
    s->sampling = nullptr;  // it pointed into this call's requests
    keep->push_back(std::move(s));
  }
  active.clear();
  for (const Pending& pr : pending) {
    const GenerationRequest& r = requests[size_t(pr.index)];
    for (int64_t j = pr.next_sample; j < pr.next_sample + pr.remaining; ++j) {
      GenerationResult& g = results_[size_t(pr.index)][size_t(j)];
      g.request_index = pr.index;
      g.request_id = r.id;
      g.sample_index = r.first_sample_index + j;
      g.tokens = r.prefix;
      g.logprobs = r.prefix_logprobs;
      g.logprobs.resize(r.prefix.size(), 0.0f);
      g.interrupted = true;
      ++samples_done;
    }
  }
  pending.clear();
}

std::vector<GenerationResult> Engine::Run::take_results() {
  std::vector<GenerationResult> out;
  out.reserve(static_cast<size_t>(samples_done));
  for (auto& per_request : results_)
    for (auto& r : per_request) out.push_back(std::move(r));
  return out;
}

}  // namespace rlhf::rollout
