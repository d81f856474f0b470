#include "rl/rl_step.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "core/error.h"
#include "parallel/failure_injection.h"

namespace rlhf::rl {

namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

}  // namespace

RlStep::RlStep(const RlStepParts& parts, const RlStepOptions& options, int64_t steps_per_episode)
    : p_(parts), opt_(options), steps_per_episode_(steps_per_episode) {
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

int64_t RlStep::prompt_position(int64_t step, int64_t i) const {
  const int64_t episode = step / steps_per_episode_;
  return episode * p_.prompts->size() + (step % steps_per_episode_) * opt_.rollout_batch_size + i;
}

std::vector<rollout::Sample> RlStep::generate(nlohmann::json& rec) {
  const auto t = Clock::now();
  std::vector<rollout::Sample> local;
  if (p_.engine) {
    // Engine e samples prompts [e·RB/E, (e+1)·RB/E) of this step (all ranks of a
    // tensor-parallel engine together; its rank 0 alone contributes the samples).
    const int e = p_.topology->me().engine, E = p_.topology->placement().num_engines();
    const int64_t RB = opt_.rollout_batch_size;
    const int64_t lo = RB * e / E, hi = RB * (e + 1) / E;
    const int64_t max_pos = p_.engine->layout().config().max_position_embeddings;
    std::vector<rollout::GenerationRequest> reqs;
    for (int64_t i = lo; i < hi; ++i) {
      const int64_t pos = prompt_position(step_, i);
      const Prompt& prompt = p_.prompts->at(pos);
      rollout::GenerationRequest r;
      r.id = uint64_t(pos);
      r.prompt = prompt.tokens;
      r.n_samples = opt_.n_samples_per_prompt;
      r.max_new_tokens =
          std::min<int64_t>(opt_.generate_max_len, max_pos - int64_t(prompt.tokens.size()));
      r.sampling = opt_.sampling;
      reqs.push_back(std::move(r));
    }
    const auto results = p_.engine->generate(reqs);
    if (p_.engine->tp_rank() == 0) {  // TP: the other ranks of the engine hold the same
      for (const auto& res : results) {
        rollout::Sample s;
        s.prompt_pos = lo + res.request_index;
        s.sample_index = res.sample_index;
        s.prompt = reqs[size_t(res.request_index)].prompt;
        s.response = res.tokens;
        s.gen_logprobs = res.logprobs;
        s.stopped = res.finish == rollout::FinishReason::kStop;
        local.push_back(std::move(s));
      }
    }
  }
  const double compute_s = since(t);
  const parallel::CommStats c0 = p_.world->stats();
  std::vector<rollout::Sample> samples = rollout::gather_samples(local, *p_.world);
  int64_t tokens = 0;
  for (const auto& s : samples) tokens += int64_t(s.response.size());
  const double gen_s = since(t);
  rec["gen_s"] = gen_s;
  rec["gen_compute_s"] = compute_s;
  rec["gen_comm_s"] = p_.world->stats().seconds - c0.seconds;
  rec["gen_comm_bytes"] = p_.world->stats().bytes - c0.bytes;
  rec["gen_tokens"] = tokens;
  rec["gen_tokens_per_s"] = double(tokens) / std::max(gen_s, 1e-9);
  return samples;
}

std::vector<double> RlStep::score(const std::vector<rollout::Sample>& samples,
                                  nlohmann::json& rec) {
  const auto t = Clock::now();
  parallel::Comm& comm = *p_.train_comm;
  const parallel::CommStats c0 = comm.stats();
  const int64_t B = int64_t(samples.size());
  std::vector<double> scores(size_t(B), 0.0);
  if (p_.reward) {
    std::vector<double> rule(size_t(B), 0.0);
    if (comm.rank() == 0) {
      std::vector<std::string> completions(static_cast<size_t>(B));
      std::vector<RewardInput> in(static_cast<size_t>(B));
      for (int64_t i = 0; i < B; ++i) {
        const rollout::Sample& s = samples[size_t(i)];
        const Prompt& prompt = p_.prompts->at(prompt_position(step_, s.prompt_pos));
        completions[size_t(i)] = p_.tokenizer->decode(s.response, true);
        RewardInput& r = in[size_t(i)];
        r.prompt = prompt.text;
        r.completion = completions[size_t(i)];
        r.label = prompt.label.is_null() ? nullptr : &prompt.label;
        r.record = &prompt.record;
        r.completion_tokens = int64_t(s.response.size());
        r.stopped = s.stopped;
      }
      rule = p_.reward->score(in);
    }
    comm.broadcast(rule.data(), B, 0);
    for (int64_t i = 0; i < B; ++i) scores[size_t(i)] += rule[size_t(i)];
  }
  if (p_.trainer->has_reward_model()) {
    const auto r = p_.trainer->reward_model_scores(samples);
    for (int64_t i = 0; i < B; ++i) scores[size_t(i)] += r[size_t(i)];
  }
  double mean = 0, var = 0;
  for (double s : scores) mean += s / double(B);
  for (double s : scores) var += (s - mean) * (s - mean) / double(std::max<int64_t>(B - 1, 1));
  rec["reward_mean"] = mean;
  rec["reward_std"] = std::sqrt(var);
  rec["reward_s"] = since(t);
  rec["reward_comm_s"] = comm.stats().seconds - c0.seconds;
  rec["reward_comm_bytes"] = comm.stats().bytes - c0.bytes;
  return scores;
}

void RlStep::train(const std::vector<rollout::Sample>& samples, const std::vector<double>& scores,
                   nlohmann::json& rec) {
  parallel::Comm& comm = *p_.train_comm;
  auto t = Clock::now();
  const parallel::CommStats c0 = comm.stats();
  const Experience exp = p_.trainer->make_experience(samples, scores);
  rec["logprob_s"] = since(t);
  rec["logprob_comm_s"] = comm.stats().seconds - c0.seconds;
  rec["logprob_comm_bytes"] = comm.stats().bytes - c0.bytes;
  t = Clock::now();
  const PpoStats st = p_.trainer->train(exp, step_);
  const double train_s = since(t);
  int64_t len_max = 0, stops = 0, seq_tokens = 0, resp_tokens = 0;
  for (const auto& s : samples) {
    len_max = std::max<int64_t>(len_max, int64_t(s.response.size()));
    stops += s.stopped;
    seq_tokens += int64_t(s.prompt.size() + s.response.size());
    resp_tokens += int64_t(s.response.size());
  }
  const double B = double(samples.size());
  // Tokens through forward+backward in the training phase (every epoch passes them all).
  const int64_t train_tokens = seq_tokens * opt_.max_epochs;
  rec["response_length_mean"] = double(resp_tokens) / B;
  rec["response_length_max"] = len_max;
  rec["stop_fraction"] = double(stops) / B;
  rec["kl_mean"] = st.kl;
  rec["kl_coef"] = st.kl_coef;
  rec["policy_loss"] = st.policy_loss;
  rec["value_loss"] = st.value_loss;
  rec["kl_loss"] = st.kl_loss;
  rec["clip_frac"] = st.clip_frac;
  rec["approx_kl"] = st.approx_kl;
  rec["entropy"] = st.entropy;
  rec["actor_grad_norm"] = st.actor_grad_norm;
  rec["critic_grad_norm"] = st.critic_grad_norm;
  rec["actor_lr"] = st.actor_lr;
  rec["critic_lr"] = st.critic_lr;
  rec["optimizer_steps"] = st.optimizer_steps;
  rec["train_s"] = train_s;
  rec["train_comm_s"] = st.comm_seconds;
  rec["train_comm_bytes"] = st.comm_bytes;
  rec["train_tokens"] = train_tokens;
  rec["train_tokens_per_s"] = double(train_tokens) / std::max(train_s, 1e-9);
}

nlohmann::json RlStep::step() {
  const auto t_step = Clock::now();
  const parallel::Topology& topo = *p_.topology;
  parallel::maybe_inject_failure("rl_step", topo.rank());
  nlohmann::json gen;
  const std::vector<rollout::Sample> samples = generate(gen);
  nlohmann::json rec;
  if (topo.trains()) {
    rec = {{"step", step_ + 1}, {"episode", step_ / steps_per_episode_}};
    const std::vector<double> scores = score(samples, rec);
    train(samples, scores, rec);
  }
  const auto t_sync = Clock::now();
  const parallel::SyncStats ss = p_.sync_weights();
  const double sync_s = since(t_sync);
  // Train rank 0 knows the training metrics; every rank gets them.
  const int train_root = topo.placement().train_ranks.front();
  rec = broadcast_json(rec, train_root, *p_.world);
  rec.update(gen);
  rec["sync_s"] = sync_s;
  rec["sync_comm_s"] = ss.seconds;  // the sync is communication only
  rec["sync_bytes"] = ss.bytes;
  rec["sync_busbw_GBps"] = ss.busbw_GBps;
  rec["step_s"] = since(t_step);
  ++step_;
  return rec;
}

nlohmann::json RlStep::state() const {
  nlohmann::json st = {{"step", step_},
                       {"prompt_position", prompt_position(step_, 0)},
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
  return st;
}

void RlStep::load_state(const nlohmann::json& st) {
  auto need = [&](const char* key) -> const nlohmann::json& {
    RLHF_CHECK(st.contains(key), "the RL state has no '{}'", key);
    return st.at(key);
  };
  step_ = need("step").get<int64_t>();
  if (!p_.trainer) return;
  p_.trainer->kl_controller().set_value(need("kl_coef").get<double>());
  p_.trainer->set_steps(need("actor_steps").get<int64_t>(), need("critic_steps").get<int64_t>());
  RunningMoments& m = p_.trainer->reward_moments();
  m.count = need("reward_count").get<double>();
  m.mean = need("reward_mean").get<double>();
  m.m2 = need("reward_m2").get<double>();
}

}  // namespace rlhf::rl
