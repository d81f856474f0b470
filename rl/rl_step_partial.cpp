// RlStep's rounds with --partial_rollout (rl/partial_rollout.h): the pool of groups in flight,
// the engines' quotas, and the step's finished groups with their rewards.
#include <algorithm>
#include <chrono>

#include "core/error.h"
#include "rl/rl_step.h"

namespace rlhf::rl {

namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

void add(nlohmann::json& rec, const char* key, double x) {
  rec[key] = rec.value(key, 0.0) + x;
}

}  // namespace

void RlStep::generate_partial(int64_t quota, nlohmann::json& totals, PartialStats& st) {
  const auto t = Clock::now();
  // Every rank deals the pending groups alike (the pool is the same everywhere, and a checkpoint
  // from any rank keeps each group's engine).
  pool_.deal(p_.topology->placement().num_engines());
  const std::vector<int64_t> pending = pool_.pending_groups();
  std::vector<rollout::Sample> local;
  // This engine's continuations: resumed on kept KV blocks, their cached positions, all of them.
  double continued[3] = {0, 0, 0};
  bool generated = false;  // this rank's engine ran a generate() this round
  if (p_.engine) {
    // Each pending group goes to its engine (where its kept KV blocks are), each engine with its
    // share of the quota; an engine with no share generates nothing this round.
    const int e = p_.topology->me().engine, E = p_.topology->placement().num_engines();
    const int64_t max_pos = p_.engine->layout().config().max_position_embeddings;
    const auto max_new = [&](const std::vector<int32_t>& prompt) {
      int64_t m = std::min<int64_t>(opt_.generate_max_len, max_pos - int64_t(prompt.size()));
      if (opt_.max_len > 0) m = std::min<int64_t>(m, opt_.max_len - int64_t(prompt.size()));
      return m;
    };
    const std::vector<int64_t> q = pool_.engine_quotas(quota, E);
    if (q[size_t(e)] > 0) {
      std::vector<rollout::GenerationRequest> reqs =
          pool_.requests(pending, e, opt_.sampling, max_new);
      std::vector<rollout::GenerationResult> res =
          p_.engine->generate(reqs, {}, nullptr, q[size_t(e)]);
      if (p_.engine->tp_rank() == 0) {
        local = pool_.to_samples(reqs, std::move(res), pending, step_);
        const rollout::EngineStats& es = p_.engine->stats();
        continued[0] = double(es.resumed);
        continued[1] = double(es.resumed_positions);
        for (const rollout::GenerationRequest& r : reqs)
          if (!r.prefix.empty()) ++continued[2];
      }
      generated = true;
    }
  }
  p_.world->all_reduce(continued, continued, 3, parallel::ReduceOp::kSum);
  st.kv_resumed += int64_t(continued[0]);
  st.kv_resumed_positions += int64_t(continued[1]);
  st.reprefilled += int64_t(continued[2] - continued[0]);
  add_decode_stats(totals, generated);
  const parallel::CommStats c0 = p_.world->stats();
  const double local_s = since(t);
  double compute_s = 0;
  p_.world->all_reduce(&local_s, &compute_s, 1, parallel::ReduceOp::kMax);
  std::vector<rollout::Sample> samples = rollout::gather_samples(local, *p_.world);
  // New tokens only: a continuation's prefix was counted in the round that sampled it.
  int64_t tokens = 0;
  for (const rollout::Sample& s : samples)
    tokens +=
        int64_t(s.response.size()) - int64_t(pool_.groups()[size_t(pending[size_t(s.prompt_pos)])]
                                                 .samples[size_t(s.sample_index)]
                                                 .response.size());
  st.interrupted += pool_.merge(std::move(samples), pending);
  add(totals, "gen_s", since(t));
  add(totals, "gen_compute_s", compute_s);
  add(totals, "gen_comm_s", p_.world->stats().seconds - c0.seconds);
  add(totals, "gen_comm_bytes", double(p_.world->stats().bytes - c0.bytes));
  add(totals, "gen_tokens", double(tokens));
}

void RlStep::collect_partial(std::vector<rollout::Sample>& kept, std::vector<double>& kept_scores,
                             nlohmann::json& rec) {
  const int64_t RB = opt_.rollout_batch_size, n = opt_.n_samples_per_prompt;
  const int64_t version = step_;  // the engines hold the weights after step_ updates
  PartialStats st;
  st.dropped = pool_.drop_stale(version);
  int64_t rounds = 0;
  for (const char* k : {"gen_s", "gen_compute_s", "gen_comm_s", "gen_comm_bytes", "gen_tokens",
                        "gen_decode_s", "gen_decode_steps", "gen_decode_read_bytes"})
    rec[k] = 0.0;
  // Groups that finished beyond an earlier step's quota are taken first; a round runs when they
  // are too few: fresh prompts top the groups to generate up to the quota plus a margin
  // (PartialPool::fresh_needed), and every engine stops at its share of the quota. A round
  // always yields enough (each engine meets its quota or runs dry).
  while (pool_.complete_groups() < RB) {
    ++round_;
    ++rounds;
    // Fresh prompts in the synchronous loop's order: prompt i of rollout batch r is draw r·RB+i.
    std::vector<int64_t> positions;
    std::vector<std::vector<int32_t>> prompts;
    for (int64_t k = pool_.fresh_needed(RB); k > 0; --k, ++pool_.drawn) {
      positions.push_back(prompt_position(pool_.drawn / RB, pool_.drawn % RB));
      prompts.push_back(p_.prompts->at(positions.back()).tokens);
    }
    pool_.add_fresh(positions, prompts);
    generate_partial(RB - pool_.complete_groups(), rec, st);
  }
  std::vector<rollout::Sample> taken = pool_.take(RB, version, st);
  finish_gen_metrics(rec);
  rec.update(st.to_json());
  rec["partial_rounds"] = rounds;
  if (!p_.topology->trains()) return;
  const std::vector<double> scores = score_at(
      taken, [](const rollout::Sample& s) { return s.prompt_pos; }, rec);
  if (rec.contains("reward_comm_bytes"))
    rec["reward_comm_bytes"] = int64_t(rec["reward_comm_bytes"].get<double>());
  int64_t len_max = 0, stops = 0, resp_tokens = 0;
  for (size_t i = 0; i < taken.size(); ++i) {
    rollout::Sample& s = taken[i];
    len_max = std::max<int64_t>(len_max, int64_t(s.response.size()));
    stops += s.stopped;
    resp_tokens += int64_t(s.response.size());
    s.prompt_pos = int64_t(i) / n;  // renumbered by group, as collect() does
    kept.push_back(std::move(s));
    kept_scores.push_back(scores[i]);
  }
  const double B = double(kept_scores.size());
  const auto [mean, sd] = score_mean_std(kept_scores);
  rec["reward_mean"] = mean;
  rec["reward_std"] = sd;
  rec["response_length_mean"] = double(resp_tokens) / std::max(B, 1.0);
  rec["response_length_max"] = len_max;
  rec["stop_fraction"] = double(stops) / std::max(B, 1.0);
}

}  // namespace rlhf::rl
