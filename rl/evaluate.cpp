#include "rl/evaluate.h"

#include <algorithm>
#include <chrono>

#include "core/error.h"
#include "rl/rl_step.h"

namespace rlhf::rl {

std::vector<double> score_samples(
    RewardFn* reward, const std::vector<rollout::Sample>& samples,
    const std::function<const Prompt&(const rollout::Sample&)>& prompt_of,
    const io::Tokenizer& tokenizer, std::vector<std::string>* completions) {
  const size_t B = samples.size();
  std::vector<std::string> texts(B);
  std::vector<RewardInput> in;
  std::vector<size_t> ruled;  // the samples the rule scores: those without an environment reward
  std::vector<double> scores(B, 0.0);
  for (size_t i = 0; i < B; ++i) {
    const rollout::Sample& s = samples[i];
    texts[i] = tokenizer.decode(s.response, true);
    if (s.has_env_reward) {
      scores[i] = s.env_reward;
      continue;
    }
    if (reward == nullptr) continue;
    const Prompt& p = prompt_of(s);
    RewardInput r;
    r.prompt = p.text;
    r.completion = texts[i];
    r.label = p.label.is_null() ? nullptr : &p.label;
    r.record = &p.record;
    r.completion_tokens = int64_t(s.response.size());
    r.stopped = s.stopped;
    in.push_back(r);
    ruled.push_back(i);
  }
  if (!in.empty()) {
    const std::vector<double> rule = reward->score(in);
    RLHF_CHECK(rule.size() == in.size(), "reward {}: {} scores for {} samples", reward->name(),
               rule.size(), in.size());
    for (size_t k = 0; k < ruled.size(); ++k) scores[ruled[k]] = rule[k];
  }
  if (completions != nullptr) *completions = std::move(texts);
  return scores;
}

double pass_at_k(int64_t n, int64_t c, int64_t k) {
  RLHF_CHECK(n >= 1 && c >= 0 && c <= n && k >= 1 && k <= n,
             "pass@k needs 0 <= c <= n and 1 <= k <= n, got n={} c={} k={}", n, c, k);
  if (n - c < k) return 1.0;
  double miss = 1.0;  // C(n−c, k) / C(n, k) = Π_{i=n−c+1..n} (1 − k/i)
  for (int64_t i = n - c + 1; i <= n; ++i) miss *= 1.0 - double(k) / double(i);
  return 1.0 - miss;
}

nlohmann::json EvalSummary::to_json(const std::string& prefix) const {
  nlohmann::json j = {{prefix + "prompts", prompts},
                      {prefix + "samples", samples},
                      {prefix + "reward_mean", reward_mean},
                      {prefix + "accuracy", accuracy},
                      {prefix + "response_length_mean", response_length_mean},
                      {prefix + "stop_fraction", stop_fraction},
                      {prefix + "seconds", seconds},
                      {prefix + "tokens_per_s", tokens_per_s}};
  for (const auto& [k, v] : pass_at) j[prefix + "pass@" + std::to_string(k)] = v;
  return j;
}

EvalSummary summarize_eval(const std::vector<rollout::Sample>& samples,
                           const std::vector<double>& scores, int64_t n_per_prompt,
                           double correct_threshold) {
  RLHF_CHECK(scores.size() == samples.size(), "{} scores for {} samples", scores.size(),
             samples.size());
  RLHF_CHECK(n_per_prompt >= 1 && samples.size() % size_t(n_per_prompt) == 0,
             "{} samples are not groups of {} per prompt", samples.size(), n_per_prompt);
  EvalSummary s;
  s.samples = int64_t(samples.size());
  s.prompts = s.samples / n_per_prompt;
  if (s.samples == 0) return s;
  int64_t correct = 0, tokens = 0, stops = 0;
  std::vector<int64_t> correct_per_prompt;
  for (size_t i = 0; i < samples.size(); ++i) {
    if (i % size_t(n_per_prompt) == 0) {
      RLHF_CHECK(i == 0 || samples[i].prompt_pos != samples[i - 1].prompt_pos,
                 "internal error: the evaluation samples are not grouped by prompt");
      correct_per_prompt.push_back(0);
    }
    const bool ok = scores[i] >= correct_threshold;
    correct += ok;
    correct_per_prompt.back() += ok;
    s.reward_mean += scores[i] / double(s.samples);
    tokens += int64_t(samples[i].response.size());
    stops += samples[i].stopped;
  }
  s.accuracy = double(correct) / double(s.samples);
  s.response_length_mean = double(tokens) / double(s.samples);
  s.stop_fraction = double(stops) / double(s.samples);
  for (int64_t k = 1; k <= n_per_prompt; k *= 2) {
    double sum = 0;
    for (int64_t c : correct_per_prompt) sum += pass_at_k(n_per_prompt, c, k);
    s.pass_at[k] = sum / double(correct_per_prompt.size());
  }
  if (n_per_prompt > 1 && !s.pass_at.count(n_per_prompt)) {
    double sum = 0;
    for (int64_t c : correct_per_prompt) sum += pass_at_k(n_per_prompt, c, n_per_prompt);
    s.pass_at[n_per_prompt] = sum / double(correct_per_prompt.size());
  }
  return s;
}

EvalSummary evaluate(rollout::Engine* engine, const parallel::Topology& topology,
                     parallel::Comm& world, const std::vector<Prompt>& prompts, RewardFn& reward,
                     const io::Tokenizer& tokenizer, const EvalOptions& options,
                     std::vector<EvalRecord>* records) {
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t P = int64_t(prompts.size());
  std::vector<rollout::Sample> local;
  if (engine != nullptr && P > 0) {
    const int e = topology.me().engine, E = topology.placement().num_engines();
    const int64_t lo = P * e / E, hi = P * (e + 1) / E;
    const int64_t max_pos = engine->layout().config().max_position_embeddings;
    std::vector<rollout::GenerationRequest> reqs;
    std::vector<EpisodeContext> ctx;
    for (int64_t i = lo; i < hi; ++i) {
      rollout::GenerationRequest r;
      r.id = uint64_t(i);
      r.prompt = prompts[size_t(i)].tokens;
      r.n_samples = options.n_samples_per_prompt;
      r.max_new_tokens = std::min<int64_t>(options.generate_max_len,
                                           max_pos - int64_t(prompts[size_t(i)].tokens.size()));
      r.sampling = options.sampling;
      reqs.push_back(std::move(r));
      ctx.push_back({&prompts[size_t(i)].text, &prompts[size_t(i)].label});
    }
    std::vector<rollout::Sample> mine =
        generate_episodes(*engine, reqs, ctx, lo, tokenizer, options.episodes);
    if (engine->tp_rank() == 0) local = std::move(mine);
  }
  const std::vector<rollout::Sample> samples = rollout::gather_samples(local, world);
  nlohmann::json summary;
  if (world.rank() == 0) {
    std::vector<std::string> texts;
    const auto prompt_of = [&](const rollout::Sample& s) -> const Prompt& {
      return prompts[size_t(s.prompt_pos)];
    };
    const std::vector<double> scores =
        score_samples(&reward, samples, prompt_of, tokenizer, records ? &texts : nullptr);
    EvalSummary s =
        summarize_eval(samples, scores, options.n_samples_per_prompt, options.correct_threshold);
    s.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    s.tokens_per_s = s.response_length_mean * double(s.samples) / std::max(s.seconds, 1e-9);
    summary = s.to_json("");
    if (records != nullptr) {
      records->clear();
      for (size_t i = 0; i < samples.size(); ++i)
        records->push_back({samples[i].prompt_pos, samples[i].sample_index, texts[i], scores[i],
                            int64_t(samples[i].response.size()), samples[i].stopped});
    }
  }
  summary = RlStep::broadcast_json(summary, 0, world);
  EvalSummary s;
  s.prompts = summary.at("prompts").get<int64_t>();
  s.samples = summary.at("samples").get<int64_t>();
  s.reward_mean = summary.at("reward_mean").get<double>();
  s.accuracy = summary.at("accuracy").get<double>();
  s.response_length_mean = summary.at("response_length_mean").get<double>();
  s.stop_fraction = summary.at("stop_fraction").get<double>();
  s.seconds = summary.at("seconds").get<double>();
  s.tokens_per_s = summary.at("tokens_per_s").get<double>();
  for (auto it = summary.begin(); it != summary.end(); ++it)
    if (it.key().rfind("pass@", 0) == 0) s.pass_at[std::stoll(it.key().substr(5))] = it.value();
  return s;
}

}  // namespace rlhf::rl
