#include "rl/rl_step.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "core/error.h"
#include "core/log.h"
#include "core/memory.h"
#include "parallel/failure_injection.h"
#include "parallel/watchdog.h"
#include "rl/evaluate.h"
#include "rl/train_record.h"

namespace rlhf::rl {

namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

}  // namespace

RlStep::RlStep(const RlStepParts& parts, const RlStepOptions& options, int64_t steps_per_episode)
    : p_(parts),
      opt_(options),
      steps_per_episode_(steps_per_episode),
      pool_(options.n_samples_per_prompt, options.max_staleness) {
  RLHF_CHECK(p_.topology && p_.world && p_.prompts && p_.sync_weights,
             "internal error: an RL step needs a topology, a world communicator, prompts and a "
             "weight sync");
  RLHF_CHECK(steps_per_episode >= 1, "an RL episode must hold at least one step");
  RLHF_CHECK(!p_.topology->trains() || (p_.trainer && p_.train_comm && p_.tokenizer),
             "internal error: a training rank needs its trainer, train_comm and tokenizer");
}

nlohmann::json RlStep::broadcast_json(const nlohmann::json& j, int root, parallel::Comm& comm) {
  std::string s = comm.rank() == root ? j.dump() : std::string();
  int64_t n = int64_t(s.size());
  comm.broadcast(&n, 1, root);
  s.resize(size_t(n));
  comm.broadcast(reinterpret_cast<uint8_t*>(s.data()), n, root);
  return nlohmann::json::parse(s);
}

int64_t RlStep::prompt_position(int64_t round, int64_t i) const {
  const int64_t episode = round / steps_per_episode_;
  return episode * p_.prompts->size() + (round % steps_per_episode_) * opt_.rollout_batch_size + i;
}

namespace {

// Adds x to the number at rec[key] (0 when absent).
void add(nlohmann::json& rec, const char* key, double x) {
  rec[key] = rec.value(key, 0.0) + x;
}

}  // namespace

void RlStep::add_decode_stats(nlohmann::json& totals, bool generated) {
  double bytes = 0, slowest[2] = {0, 0};  // slowest: decode seconds, decode steps
  if (generated && p_.engine) {
    const rollout::EngineStats& st = p_.engine->stats();
    bytes = double(st.decode_steps) * double(p_.engine->weight_bytes_per_decode_step()) +
            st.kv_bytes_read;
    slowest[0] = st.decode_s;
    slowest[1] = double(st.decode_steps);
  }
  p_.world->all_reduce(&bytes, &bytes, 1, parallel::ReduceOp::kSum);
  p_.world->all_reduce(slowest, slowest, 2, parallel::ReduceOp::kMax);
  add(totals, "gen_decode_s", slowest[0]);
  add(totals, "gen_decode_steps", slowest[1]);
  add(totals, "gen_decode_read_bytes", bytes);
}

void RlStep::finish_gen_metrics(nlohmann::json& rec) {
  rec["gen_tokens_per_s"] =
      rec["gen_tokens"].get<double>() / std::max(rec["gen_compute_s"].get<double>(), 1e-9);
  rec["gen_decode_read_GBps"] = rec.value("gen_decode_read_bytes", 0.0) /
                                std::max(rec.value("gen_decode_s", 0.0), 1e-9) / 1e9;
  for (const char* k : {"gen_tokens", "gen_comm_bytes", "reward_comm_bytes", "gen_decode_steps",
                        "gen_decode_read_bytes"})
    if (rec.contains(k)) rec[k] = int64_t(rec[k].get<double>());
}

std::vector<rollout::Sample> RlStep::generate(int64_t round, nlohmann::json& totals) {
  const auto t = Clock::now();
  std::vector<rollout::Sample> local;
  EpisodeStats env_stats;
  if (p_.engine) {
    // Engine e samples prompts [e·RB/E, (e+1)·RB/E) of this round (all ranks of a
    // tensor-parallel engine together; its rank 0 alone contributes the samples).
    const int e = p_.topology->me().engine, E = p_.topology->placement().num_engines();
    const int64_t RB = opt_.rollout_batch_size;
    const int64_t lo = RB * e / E, hi = RB * (e + 1) / E;
    const int64_t max_pos = p_.engine->layout().config().max_position_embeddings;
    std::vector<rollout::GenerationRequest> reqs;
    for (int64_t i = lo; i < hi; ++i) {
      const int64_t pos = prompt_position(round, i);
      const Prompt& prompt = p_.prompts->at(pos);
      rollout::GenerationRequest r;
      r.id = uint64_t(pos);
      r.prompt = prompt.tokens;
      r.n_samples = opt_.n_samples_per_prompt;
      r.max_new_tokens =
          std::min<int64_t>(opt_.generate_max_len, max_pos - int64_t(prompt.tokens.size()));
      if (opt_.max_len > 0)
        r.max_new_tokens =
            std::min<int64_t>(r.max_new_tokens, opt_.max_len - int64_t(prompt.tokens.size()));
      r.sampling = opt_.sampling;
      reqs.push_back(std::move(r));
    }
    // Progress of a long rollout from engine 0 (its first rank), at most every 10 s: on the
    // console when world rank 0 hosts it, else in that rank's log (--log_dir).
    rollout::ProgressFn progress;
    if (e == 0 && p_.engine->tp_rank() == 0) {
      progress = [this, t, last = t](const rollout::EngineStats& st, int64_t done,
                                     int64_t total) mutable {
        const auto now = Clock::now();
        if (std::chrono::duration<double>(now - last).count() < 10) return;
        last = now;
        const double s = std::chrono::duration<double>(now - t).count();
        LOG_INFO(
            "step {} rollout: engine 0 of {}: {}/{} samples | {} tokens | {:.0f} tok/s | {:.0f}s",
            step_ + 1, p_.topology->placement().num_engines(), done, total, st.generated_tokens,
            double(st.generated_tokens) / std::max(s, 1e-9), s);
      };
    }
    std::vector<EpisodeContext> ctx;
    for (int64_t i = lo; i < hi; ++i) {
      const Prompt& prompt = p_.prompts->at(prompt_position(round, i));
      ctx.push_back({&prompt.text, &prompt.label});
    }
    // Every rank of the engine generates; its rank 0 alone contributes the samples.
    RLHF_CHECK(p_.tokenizer != nullptr, "internal error: a generation rank needs the tokenizer");
    std::vector<rollout::Sample> mine = generate_episodes(*p_.engine, reqs, ctx, lo, *p_.tokenizer,
                                                          p_.episodes, progress, &env_stats);
    if (p_.engine->tp_rank() == 0) local = std::move(mine);
  }
  add_decode_stats(totals, p_.engine != nullptr);
  const parallel::CommStats c0 = p_.world->stats();
  // The engines' generation time: the slowest rank's (a rank without an engine spends none).
  const double local_s = since(t);
  double compute_s = 0;
  p_.world->all_reduce(&local_s, &compute_s, 1, parallel::ReduceOp::kMax);
  std::vector<rollout::Sample> samples = rollout::gather_samples(local, *p_.world);
  int64_t tokens = 0;
  for (const auto& s : samples) tokens += int64_t(s.response.size());
  add(totals, "gen_s", since(t));
  add(totals, "gen_compute_s", compute_s);
  add(totals, "gen_comm_s", p_.world->stats().seconds - c0.seconds);
  add(totals, "gen_comm_bytes", double(p_.world->stats().bytes - c0.bytes));
  add(totals, "gen_tokens", double(tokens));
  if (opt_.environment) {
    // The environment's time: the slowest rank's (it is part of gen_s).
    double env_s = 0;
    p_.world->all_reduce(&env_stats.env_s, &env_s, 1, parallel::ReduceOp::kMax);
    add(totals, "env_s", env_s);
  }
  return samples;
}

std::vector<double> RlStep::score(int64_t round, const std::vector<rollout::Sample>& samples,
                                  nlohmann::json& totals) {
  return score_at(
      samples, [&](const rollout::Sample& x) { return prompt_position(round, x.prompt_pos); },
      totals);
}

std::vector<double> RlStep::score_at(const std::vector<rollout::Sample>& samples,
                                     const std::function<int64_t(const rollout::Sample&)>& position,
                                     nlohmann::json& totals) {
  const auto t = Clock::now();
  parallel::Comm& comm = *p_.train_comm;
  const parallel::CommStats c0 = comm.stats();
  const int64_t B = int64_t(samples.size());
  std::vector<double> scores(size_t(B), 0.0);
  if (p_.reward || opt_.environment) {  // the environment's reward where given, else the rule's
    std::vector<double> rule(size_t(B), 0.0);
    if (comm.rank() == 0)
      rule = score_samples(
          p_.reward, samples,
          [&](const rollout::Sample& x) -> const Prompt& { return p_.prompts->at(position(x)); },
          *p_.tokenizer);
    comm.broadcast(rule.data(), B, 0);
    for (int64_t i = 0; i < B; ++i) scores[size_t(i)] += rule[size_t(i)];
  }
  if (p_.trainer->has_reward_model()) {
    const auto r = p_.trainer->reward_model_scores(samples);
    for (int64_t i = 0; i < B; ++i) scores[size_t(i)] += r[size_t(i)];
  }
  if (opt_.overlong_buffer_len > 0)
    for (int64_t i = 0; i < B; ++i)
      scores[size_t(i)] +=
          overlong_penalty(int64_t(samples[size_t(i)].response.size()), opt_.generate_max_len,
                           opt_.overlong_buffer_len, opt_.overlong_penalty_factor);
  add(totals, "reward_s", since(t));
  add(totals, "reward_comm_s", comm.stats().seconds - c0.seconds);
  add(totals, "reward_comm_bytes", double(comm.stats().bytes - c0.bytes));
  return scores;
}

void RlStep::collect(std::vector<rollout::Sample>& kept, std::vector<double>& kept_scores,
                     nlohmann::json& rec) {
  if (opt_.partial_rollout) return collect_partial(kept, kept_scores, rec);
  const bool trains = p_.topology->trains();
  const int train_root = p_.topology->placement().train_ranks.front();
  const int64_t RB = opt_.rollout_batch_size, n = opt_.n_samples_per_prompt;
  std::vector<double> all_scores;
  int64_t rounds = 0, groups = 0, len_max = 0, stops = 0, resp_tokens = 0;
  int64_t turns = 0, obs_tokens = 0, env_rewarded = 0;  // multi-turn episodes
  for (;;) {
    const int64_t round = round_++;
    ++rounds;
    std::vector<rollout::Sample> samples = generate(round, rec);
    groups += int64_t(samples.size()) / n;
    int need_more = 0;
    if (trains) {
      const std::vector<double> scores = score(round, samples, rec);
      for (size_t g = 0; g * size_t(n) < samples.size(); ++g) {
        double mean = 0;
        for (int64_t j = 0; j < n; ++j) mean += scores[g * size_t(n) + size_t(j)] / double(n);
        // DAPO keeps a group iff lo < mean < hi: a group whose samples all scored the same has
        // zero advantage everywhere and would train on nothing.
        const bool keep =
            !opt_.dynamic_filtering || (mean > opt_.filter_lo && mean < opt_.filter_hi);
        if (!keep || int64_t(kept.size()) >= RB * n) continue;
        const int64_t pos = int64_t(kept.size()) / n;
        for (int64_t j = 0; j < n; ++j) {
          rollout::Sample s = samples[g * size_t(n) + size_t(j)];
          s.prompt_pos = pos;
          kept.push_back(std::move(s));
          kept_scores.push_back(scores[g * size_t(n) + size_t(j)]);
        }
      }
      all_scores.insert(all_scores.end(), scores.begin(), scores.end());
      for (const auto& s : samples) {
        len_max = std::max<int64_t>(len_max, int64_t(s.response.size()));
        stops += s.stopped;
        resp_tokens += int64_t(s.response.size());
        turns += s.turns;
        obs_tokens += int64_t(s.response.size()) - rollout::action_tokens(s);
        env_rewarded += s.has_env_reward;
      }
      need_more = opt_.dynamic_filtering && int64_t(kept.size()) < RB * n &&
                  rounds < opt_.max_num_gen_batches;
    }
    // The training ranks decide; generation-only ranks follow.
    p_.world->broadcast(&need_more, 1, train_root);
    if (!need_more) break;
  }
  finish_gen_metrics(rec);
  if (!trains) return;
  const double B = double(all_scores.size());
  const auto [mean, sd] = score_mean_std(all_scores);
  rec["reward_mean"] = mean;
  rec["reward_std"] = sd;
  rec["response_length_mean"] = double(resp_tokens) / B;
  rec["response_length_max"] = len_max;
  rec["stop_fraction"] = double(stops) / B;
  if (opt_.environment) {
    rec["env_turns_mean"] = double(turns) / B;   // model turns per episode
    rec["env_observation_tokens"] = obs_tokens;  // appended by the environment, all samples
    rec["env_reward_fraction"] = double(env_rewarded) / B;  // episodes the environment scored
  }
  if (opt_.dynamic_filtering) {
    rec["filter_rounds"] = rounds;
    rec["filter_groups_generated"] = groups;
    rec["filter_groups_kept"] = int64_t(kept.size()) / n;
  }
}

void RlStep::train(const std::vector<rollout::Sample>& samples, const std::vector<double>& scores,
                   nlohmann::json& rec) {
  parallel::Comm& comm = *p_.train_comm;
  auto t = Clock::now();
  const parallel::CommStats c0 = comm.stats();
  const Experience exp = p_.trainer->make_experience(samples, scores);
  TrainRecord tr;
  tr.logprob_s = since(t);
  tr.logprob_comm_s = comm.stats().seconds - c0.seconds;
  tr.logprob_comm_bytes = comm.stats().bytes - c0.bytes;
  // Set when the old-log-prob pass was skipped (lp_old = the update's own lp; docs/algorithms.md).
  tr.logprob_old_skipped = exp.lp_old_is_current;
  t = Clock::now();
  tr.stats = p_.trainer->train(exp, step_);
  tr.train_s = since(t);
  int64_t seq_tokens = 0;
  for (const auto& s : samples) seq_tokens += int64_t(s.prompt.size() + s.response.size());
  // Tokens through forward+backward in the training phase (every epoch passes them all).
  tr.train_tokens = seq_tokens * opt_.max_epochs;
  tr.trained_samples = int64_t(samples.size());
  rec.update(tr.to_json());
  if (p_.log_samples && opt_.log_completions > 0 && (step_ + 1) % opt_.log_completions == 0 &&
      comm.rank() == 0) {
    StepSamples log;
    log.step = step_ + 1;
    for (size_t i = 0; i < samples.size(); ++i) {
      const rollout::Sample& s = samples[i];
      log.prompts.push_back(p_.tokenizer->decode(s.prompt, false));
      log.completions.push_back(p_.tokenizer->decode(s.response, true));
      log.scores.push_back(scores[i]);
      log.advantages.push_back(s.response.empty() ? 0.0
                                                  : double(exp.advantages[i * size_t(exp.Tr)]));
      log.response_lengths.push_back(int64_t(s.response.size()));
      log.stopped.push_back(s.stopped);
    }
    p_.log_samples(log);
  }
}

RlStep::Batch RlStep::next_batch() {
  Batch b;
  b.version = step_;  // the engines hold the weights after step_ updates
  collect(b.samples, b.scores, b.rec);
  return b;
}

bool RlStep::wants_batch(int64_t in_hand) const {
  // Rollouts made for the steps done, the current one and the queued ones.
  const int64_t made = step_ + in_hand + int64_t(queue_.size());
  return opt_.total_steps < 0 || made < opt_.total_steps;
}

void RlStep::train_batch(Batch& b, nlohmann::json& rec) {
  const std::string where = fmt::format("RL step {}", step_ + 1);
  // Train on whole optimizer steps of whole groups: with dynamic filtering a capped step may
  // hold fewer groups than --rollout_batch_size.
  const int64_t n = opt_.n_samples_per_prompt, TB = p_.trainer->options().train_batch_size;
  int64_t groups = int64_t(b.samples.size()) / n;
  while (groups > 0 && (groups * n) % TB != 0) --groups;
  b.samples.resize(size_t(groups * n));
  b.scores.resize(b.samples.size());
  if (groups > 0) {
    parallel::set_watch_context(where + ", log-probs and training");
    train(b.samples, b.scores, rec);
  } else {
    LOG0_WARN("step {}: no group kept by dynamic filtering after {} round(s): nothing to train",
              step_ + 1, rec.value("filter_rounds", int64_t(1)));
    TrainRecord tr;  // every key of a trained step, zero (the same schema every step)
    tr.stats.kl_coef = p_.trainer->kl_controller().value();
    rec.update(tr.to_json());
  }
}

nlohmann::json RlStep::step() {
  const auto t_step = Clock::now();
  reset_peak_rss();  // the step's own peak, below
  const parallel::Topology& topo = *p_.topology;
  parallel::maybe_inject_failure("rl_step", topo.rank());
  parallel::maybe_inject_stop("rl_step", topo.rank());
  const std::string where = fmt::format("RL step {}", step_ + 1);
  parallel::set_watch_context(where + ", rollout");
  nlohmann::json rec = {{"step", step_ + 1}, {"episode", step_ / steps_per_episode_}};
  // The rollouts this step needs before it can train, made with nothing to overlap: the
  // synchronous loop's one, or at the start of an async run its queue of k.
  const int64_t k = opt_.async_train ? opt_.async_queue_size : 0;
  while (int64_t(queue_.size()) < std::max<int64_t>(k, 1) && (queue_.empty() || wants_batch(0)))
    queue_.push_back(next_batch());
  Batch b = std::move(queue_.front());
  queue_.pop_front();
  // --vllm_enable_sleep (colocated): the engine frees its KV cache and weight copies while the
  // trainer trains, and takes them back before the weight sync below.
  int64_t sleep_freed = 0;
  double sleep_s = 0;
  if (opt_.enable_sleep && p_.engine) {
    const auto t_sleep = Clock::now();
    sleep_freed = p_.engine->sleep();
    sleep_s += since(t_sleep);
  }
  // The generation phase's peak; the training phase's is measured from here, after the sleep
  // (train_peak_rss_bytes).
  const int64_t gen_peak_rss = peak_rss_bytes();
  reset_peak_rss();
  rec.update(b.rec);  // the metrics of its generation and rewards
  rec["rollout_weight_version"] = b.version;
  rec["rollout_staleness"] = step_ - b.version;  // optimizer updates since it was generated
  if (k >= 1 && wants_batch(1)) {
    // Async: the trainers train on this rollout while the engines (disjoint ranks) generate a
    // later one; both meet in its gather, where the trainers' wait is what did not overlap.
    const auto t_overlap = Clock::now();
    if (topo.trains()) train_batch(b, rec);
    parallel::set_watch_context(where + ", rollout ahead");
    Batch ahead = next_batch();
    // On the training ranks gen_s was the wait for the engines after training (what the overlap
    // did not hide): this step's async_wait_s. The rollout's own gen_s is the engines' time.
    rec["async_wait_s"] = ahead.rec.value("gen_s", 0.0);
    rec["async_overlap_s"] = since(t_overlap);
    ahead.rec["gen_s"] = ahead.rec.value("gen_compute_s", 0.0);
    queue_.push_back(std::move(ahead));
  } else if (topo.trains()) {
    train_batch(b, rec);
  }
  if (opt_.enable_sleep && p_.engine) {  // before the sync writes the engine's weights
    const auto t_wake = Clock::now();
    p_.engine->wake();
    sleep_s += since(t_wake);
  }
  parallel::set_watch_context(where + ", weight sync");
  const auto t_sync = Clock::now();
  const parallel::SyncStats ss = p_.sync_weights();
  const double sync_s = since(t_sync);
  // Train rank 0 knows the training metrics; every rank gets them (generation totals included:
  // they are the same on every rank).
  const int train_root = topo.placement().train_ranks.front();
  rec = broadcast_json(rec, train_root, *p_.world);
  const int64_t train_rss = peak_rss_bytes();
  const int64_t mine[4] = {std::max(gen_peak_rss, train_rss), train_rss, sleep_freed,
                           int64_t(sleep_s * 1e9)};
  int64_t mx[4] = {};
  p_.world->all_reduce(mine, mx, 4, parallel::ReduceOp::kMax);
  rec["peak_rss_bytes"] = mx[0];  // max over ranks of each rank's peak during the step
  // ... and during its training and weight sync (a sleeping engine's memory is freed then)
  rec["train_peak_rss_bytes"] = mx[1];
  if (opt_.enable_sleep) {
    rec["sleep_freed_bytes"] = mx[2];       // max over ranks of the bytes an engine's sleep freed
    rec["sleep_s"] = double(mx[3]) * 1e-9;  // max over ranks of its sleep + wake seconds
  }
  rec["sync_s"] = sync_s;
  rec["sync_comm_s"] = ss.seconds;  // the sync is communication only
  rec["sync_bytes"] = ss.bytes;
  // "device" (NCCL into the engines' device weights) or "host" (the engines' host buffers).
  rec["sync_path"] = ss.device ? "device" : "host";
  rec["sync_busbw_GBps"] = ss.busbw_GBps;
  rec["step_s"] = since(t_step);
  ++step_;
  return rec;
}

void RlStep::release_kept_kv() {
  if (p_.engine) p_.engine->release_kept();
}

nlohmann::json RlStep::state() const {
  nlohmann::json st = {{"step", step_},
                       {"rounds", round_},
                       {"prompt_position", prompt_position(round_, 0)},
                       {"rng", "counter-based: (seed, prompt position); no state"}};
  if (p_.trainer) {
    const RunningMoments& m = p_.trainer->reward_moments();
    st["kl_coef"] = p_.trainer->kl_controller().value();
    st["actor_steps"] = p_.trainer->actor_steps();
    st["critic_steps"] = p_.trainer->critic_steps();
    st["reward_count"] = m.count;
    st["reward_mean"] = m.mean;
    st["reward_m2"] = m.m2;
  }
  if (!queue_.empty()) {
    nlohmann::json q = nlohmann::json::array();
    for (const Batch& b : queue_)  // samples in gather_samples' byte form
      q.push_back({{"version", b.version},
                   {"scores", b.scores},
                   {"rec", b.rec},
                   {"samples", rollout::serialize_samples(b.samples)}});
    st["async_queue"] = std::move(q);
  }
  if (opt_.partial_rollout) st["partial_pool"] = pool_.to_json();
  return st;
}

void RlStep::load_state(const nlohmann::json& st) {
  auto need = [&](const char* key) -> const nlohmann::json& {
    RLHF_CHECK(st.contains(key), "the RL state has no '{}'", key);
    return st.at(key);
  };
  step_ = need("step").get<int64_t>();
  round_ = st.value("rounds", step_);  // checkpoints from before dynamic filtering: one per step
  queue_.clear();
  if (st.contains("async_queue")) {
    RLHF_CHECK(opt_.async_train,
               "the checkpoint holds {} rollout(s) generated ahead by --async_train, and this run "
               "is synchronous\nhint: resume with --async_train (and the same "
               "--async_queue_size)",
               st.at("async_queue").size());
    for (const nlohmann::json& q : st.at("async_queue")) {
      Batch b;
      b.version = q.at("version").get<int64_t>();
      b.scores = q.at("scores").get<std::vector<double>>();
      b.rec = q.at("rec");
      const auto bytes = q.at("samples").get<std::vector<uint8_t>>();
      b.samples = rollout::deserialize_samples(bytes.data(), bytes.size());
      queue_.push_back(std::move(b));
    }
  }
  RLHF_CHECK(!st.contains("partial_pool") || opt_.partial_rollout,
             "the checkpoint holds partial rollouts in flight, and this run has no "
             "--partial_rollout\nhint: resume with --partial_rollout (and the same "
             "--n_samples_per_prompt)");
  if (st.contains("partial_pool")) pool_.from_json(st.at("partial_pool"));
  if (!p_.trainer) return;
  p_.trainer->kl_controller().set_value(need("kl_coef").get<double>());
  p_.trainer->set_steps(need("actor_steps").get<int64_t>(), need("critic_steps").get<int64_t>());
  RunningMoments& m = p_.trainer->reward_moments();
  m.count = need("reward_count").get<double>();
  m.mean = need("reward_mean").get<double>();
  m.m2 = need("reward_m2").get<double>();
}

}  // namespace rlhf::rl
