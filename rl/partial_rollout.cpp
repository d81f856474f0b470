#include "rl/partial_rollout.h"

#include <algorithm>
#include <limits>
#include <numeric>

#include "core/error.h"

namespace rlhf::rl {

bool PartialGroup::complete() const {
  return std::none_of(samples.begin(), samples.end(),
                      [](const rollout::Sample& s) { return s.interrupted; });
}

nlohmann::json PartialStats::to_json() const {
  return {{"partial_dropped_samples", dropped},
          {"partial_interrupted_samples", interrupted},
          {"partial_carried_samples", carried},
          {"partial_trained_carried_samples", trained_carried},
          {"partial_age_mean", age_mean},
          {"partial_age_max", age_max},
          {"partial_old_token_fraction", old_token_fraction},
          {"partial_kv_resumed_samples", kv_resumed},
          {"partial_kv_resumed_tokens", kv_resumed_positions},
          {"partial_reprefilled_samples", reprefilled}};
}

int64_t oldest_version(const rollout::Sample& s, int64_t none) {
  if (s.versions.empty()) return none;
  return *std::min_element(s.versions.begin(), s.versions.end());
}

PartialPool::PartialPool(int64_t n_samples, int64_t max_staleness)
    : n_(n_samples), max_staleness_(max_staleness) {
  RLHF_CHECK(n_samples >= 1, "partial rollouts: n_samples_per_prompt must be >= 1");
  RLHF_CHECK(max_staleness >= 0, "--max_staleness must be >= 0, got {}", max_staleness);
}

namespace {

// An empty, unfinished sample of a group (nothing generated yet).
rollout::Sample fresh_sample(int64_t pos, int64_t j, const std::vector<int32_t>& prompt) {
  rollout::Sample s;
  s.prompt_pos = pos;
  s.sample_index = j;
  s.prompt = prompt;
  s.interrupted = true;
  return s;
}

}  // namespace

int64_t PartialPool::drop_stale(int64_t version) {
  int64_t dropped = 0;
  for (PartialGroup& g : groups_)
    for (rollout::Sample& s : g.samples) {
      if (version - oldest_version(s, version) <= max_staleness_) continue;
      s = fresh_sample(g.pos, s.sample_index, s.prompt);
      ++dropped;
    }
  return dropped;
}

void PartialPool::add_fresh(const std::vector<int64_t>& positions,
                            const std::vector<std::vector<int32_t>>& prompts) {
  RLHF_CHECK(positions.size() == prompts.size(), "internal error: {} positions for {} prompts",
             positions.size(), prompts.size());
  for (size_t i = 0; i < positions.size(); ++i) {
    PartialGroup g;
    g.pos = positions[i];
    for (int64_t j = 0; j < n_; ++j) g.samples.push_back(fresh_sample(g.pos, j, prompts[i]));
    groups_.push_back(std::move(g));
  }
}

int64_t PartialPool::fresh_needed(int64_t batch) const {
  const int64_t margin = std::max<int64_t>(1, (batch + 7) / 8);
  const int64_t lacking = std::max<int64_t>(0, batch - complete_groups());
  return std::max<int64_t>(0, lacking + margin - int64_t(pending_groups().size()));
}

int64_t PartialPool::complete_groups() const {
  return int64_t(std::count_if(groups_.begin(), groups_.end(),
                               [](const PartialGroup& g) { return g.complete(); }));
}

std::vector<int64_t> PartialPool::pending_groups() const {
  std::vector<int64_t> out;
  for (size_t i = 0; i < groups_.size(); ++i)
    if (!groups_[i].complete()) out.push_back(int64_t(i));
  return out;
}

std::vector<int64_t> PartialPool::pending_per_engine(int E) const {
  std::vector<int64_t> have(size_t(E), 0);
  for (int64_t k : pending_groups()) {
    const int e = groups_[size_t(k)].engine;
    if (e >= 0 && e < E) ++have[size_t(e)];
  }
  return have;
}

void PartialPool::deal(int E) {
  RLHF_CHECK(E >= 1, "internal error: dealing groups to {} engines", E);
  std::vector<int64_t> have = pending_per_engine(E);
  for (int64_t k : pending_groups()) {
    PartialGroup& g = groups_[size_t(k)];
    if (g.engine >= 0 && g.engine < E) continue;
    g.engine = int(std::min_element(have.begin(), have.end()) - have.begin());
    ++have[size_t(g.engine)];
  }
}

std::vector<int64_t> PartialPool::engine_quotas(int64_t quota, int E) const {
  const std::vector<int64_t> have = pending_per_engine(E);
  const int64_t dealt = std::accumulate(have.begin(), have.end(), int64_t(0));
  const int64_t pending = int64_t(pending_groups().size());
  RLHF_CHECK(dealt == pending, "internal error: {} of {} pending groups dealt to engines [0, {})",
             dealt, pending, E);
  return engine_quotas(have, quota);
}

std::vector<int64_t> PartialPool::engine_quotas(const std::vector<int64_t>& have, int64_t quota) {
  const size_t E = have.size();
  std::vector<int64_t> q(E, 0);
  int64_t left = std::min(quota, std::accumulate(have.begin(), have.end(), int64_t(0)));
  // Deal one group of the quota to each engine in turn that still has groups not in its quota.
  for (size_t e = 0; left > 0; e = (e + 1) % E)
    if (q[e] < have[e]) {
      ++q[e];
      --left;
    }
  return q;
}

std::vector<rollout::GenerationRequest> PartialPool::requests(
    const std::vector<int64_t>& pending, int e, const rollout::SamplingParams& sampling,
    const std::function<int64_t(const std::vector<int32_t>&)>& max_new) const {
  std::vector<rollout::GenerationRequest> out;
  for (size_t k = 0; k < pending.size(); ++k) {
    const PartialGroup& g = groups_[size_t(pending[k])];
    if (g.engine != e) continue;
    rollout::GenerationRequest r;
    r.id = uint64_t(g.pos);
    r.prompt = g.samples[0].prompt;
    r.sampling = sampling;
    r.max_new_tokens = max_new(r.prompt);
    r.group = int64_t(k);
    const bool untouched = std::all_of(g.samples.begin(), g.samples.end(), [](const auto& s) {
      return s.interrupted && s.response.empty();
    });
    if (untouched) {  // one prefill for all n samples, as a synchronous round
      r.n_samples = n_;
      out.push_back(std::move(r));
      continue;
    }
    for (const rollout::Sample& s : g.samples) {
      if (!s.interrupted) continue;
      rollout::GenerationRequest c = r;
      c.n_samples = 1;
      c.first_sample_index = s.sample_index;
      c.prefix = s.response;
      c.prefix_logprobs = s.gen_logprobs;
      out.push_back(std::move(c));
    }
  }
  return out;
}

std::vector<rollout::Sample> PartialPool::to_samples(
    const std::vector<rollout::GenerationRequest>& requests,
    std::vector<rollout::GenerationResult>&& results, const std::vector<int64_t>& pending,
    int64_t version) const {
  std::vector<rollout::Sample> out;
  out.reserve(results.size());
  for (rollout::GenerationResult& res : results) {
    const rollout::GenerationRequest& r = requests[size_t(res.request_index)];
    const PartialGroup& g = groups_[size_t(pending[size_t(r.group)])];
    const rollout::Sample& before = g.samples[size_t(res.sample_index)];
    rollout::Sample s;
    s.prompt_pos = r.group;
    s.sample_index = res.sample_index;
    s.prompt = r.prompt;
    // The prefix's versions (a prefix is the sample's response so far), then this round's.
    s.versions = r.prefix.empty() ? std::vector<int32_t>() : before.versions;
    s.versions.resize(res.tokens.size(), int32_t(version));
    s.response = std::move(res.tokens);
    s.gen_logprobs = std::move(res.logprobs);
    s.finish = res.finish;
    s.stopped = rollout::ended_naturally(res.finish) && !res.interrupted;
    s.interrupted = res.interrupted;
    out.push_back(std::move(s));
  }
  return out;
}

int64_t PartialPool::merge(std::vector<rollout::Sample>&& gathered,
                           const std::vector<int64_t>& pending) {
  int64_t interrupted = 0;
  for (rollout::Sample& s : gathered) {
    RLHF_CHECK(s.prompt_pos >= 0 && s.prompt_pos < int64_t(pending.size()) && s.sample_index >= 0 &&
                   s.sample_index < n_,
               "internal error: a partial rollout's sample names group {} sample {}", s.prompt_pos,
               s.sample_index);
    PartialGroup& g = groups_[size_t(pending[size_t(s.prompt_pos)])];
    s.prompt_pos = g.pos;
    interrupted += s.interrupted;
    g.samples[size_t(s.sample_index)] = std::move(s);
  }
  return interrupted;
}

std::vector<rollout::Sample> PartialPool::take(int64_t q, int64_t version, PartialStats& st) {
  std::vector<rollout::Sample> out;
  std::vector<PartialGroup> left;
  int64_t tokens = 0, old_tokens = 0, taken = 0;
  double age_sum = 0;
  for (PartialGroup& g : groups_) {
    if (taken == q || !g.complete()) {
      left.push_back(std::move(g));
      continue;
    }
    ++taken;
    for (rollout::Sample& s : g.samples) {
      const int64_t age = version - oldest_version(s, version);
      age_sum += double(age);
      st.age_max = std::max(st.age_max, age);
      st.trained_carried += age > 0;
      tokens += int64_t(s.response.size());
      for (int32_t v : s.versions) old_tokens += v < version;
      s.prompt_pos = g.pos;
      out.push_back(std::move(s));
    }
  }
  groups_ = std::move(left);
  st.age_mean = out.empty() ? 0.0 : age_sum / double(out.size());
  st.old_token_fraction = tokens > 0 ? double(old_tokens) / double(tokens) : 0.0;
  st.carried = samples();
  return out;
}

int64_t PartialPool::samples() const {
  int64_t k = 0;
  for (const PartialGroup& g : groups_) k += int64_t(g.samples.size());
  return k;
}

nlohmann::json PartialPool::to_json() const {
  std::vector<rollout::Sample> all;
  std::vector<int> engines;
  for (const PartialGroup& g : groups_) {
    engines.push_back(g.engine);
    for (const rollout::Sample& s : g.samples) all.push_back(s);
  }
  return {{"n_samples_per_prompt", n_},
          {"drawn", drawn},
          {"engines", engines},
          {"samples", rollout::serialize_samples(all)}};
}

void PartialPool::from_json(const nlohmann::json& j) {
  RLHF_CHECK(j.value("n_samples_per_prompt", int64_t(-1)) == n_,
             "the checkpoint's partial rollouts have {} samples per prompt, this run {}",
             j.value("n_samples_per_prompt", int64_t(-1)), n_);
  drawn = j.at("drawn").get<int64_t>();
  const auto bytes = j.at("samples").get<std::vector<uint8_t>>();
  std::vector<rollout::Sample> all = rollout::deserialize_samples(bytes.data(), bytes.size());
  RLHF_CHECK(int64_t(all.size()) % n_ == 0,
             "the checkpoint's partial rollouts hold {} samples, not groups of {}", all.size(), n_);
  const std::vector<int> engines = j.value("engines", std::vector<int>());
  RLHF_CHECK(engines.empty() || engines.size() * size_t(n_) == all.size(),
             "the checkpoint's partial rollouts name engines for {} groups, and hold {}",
             engines.size(), all.size() / size_t(n_));
  groups_.clear();
  for (size_t i = 0; i < all.size(); i += size_t(n_)) {
    PartialGroup g;
    g.pos = all[i].prompt_pos;
    if (!engines.empty()) g.engine = engines[i / size_t(n_)];
    for (int64_t j = 0; j < n_; ++j) g.samples.push_back(std::move(all[i + size_t(j)]));
    groups_.push_back(std::move(g));
  }
}

}  // namespace rlhf::rl
