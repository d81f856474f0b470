// Scoring and evaluation: the one place where completions are decoded and checked by a reward
// (training steps, evaluation during training, `rlhf eval`), and the evaluation summary —
// mean reward, accuracy, pass@k (Chen et al. 2021), response length, throughput.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "io/tokenizer.h"
#include "parallel/comm.h"
#include "parallel/topology.h"
#include "rl/episodes.h"
#include "rl/prompts.h"
#include "rl/rewards.h"
#include "rollout/engine.h"
#include "rollout/samples.h"

namespace rlhf::rl {

/// The reward of every sample: the environment's where it gave one (Sample::has_env_reward),
/// else the rule reward — each completion decoded (special tokens skipped) and scored with its
/// prompt's text, label and record — or 0 when reward is null. prompt_of(s) is the prompt of
/// sample s. completions, when not null, receives the decoded texts. Throws what reward->score
/// throws.
std::vector<double> score_samples(
    RewardFn* reward, const std::vector<rollout::Sample>& samples,
    const std::function<const Prompt&(const rollout::Sample&)>& prompt_of,
    const io::Tokenizer& tokenizer, std::vector<std::string>* completions = nullptr);

/// pass@k of one prompt with n samples of which c are correct, unbiased (Chen et al. 2021, eq. 1):
/// 1 − C(n−c, k) / C(n, k), computed as 1 − Π_{i=n−c+1..n} (1 − k/i). Throws rlhf::Error unless
/// 0 <= c <= n and 1 <= k <= n.
double pass_at_k(int64_t n, int64_t c, int64_t k);

/// The summary of an evaluation. A sample is correct when its score >= correct_threshold (1: the
/// full reward of the rule rewards; countdown's 0.1 format credit is not correct).
struct EvalSummary {
  int64_t prompts = 0, samples = 0;
  double reward_mean = 0;
  double accuracy = 0;                ///< share of correct samples (= pass@1)
  std::map<int64_t, double> pass_at;  ///< k → mean pass@k over prompts, k = 1, 2, 4, ..., n
  double response_length_mean = 0;    ///< tokens
  double stop_fraction = 0;           ///< share of samples that ended with EOS
  double seconds = 0;                 ///< generation and scoring wall time
  double tokens_per_s = 0;            ///< generated tokens / seconds
  /// {"<prefix>reward_mean", "<prefix>accuracy", "<prefix>pass@k", ...}.
  nlohmann::json to_json(const std::string& prefix) const;
};

/// Summarizes scored samples: `samples` in canonical order with n_per_prompt samples per prompt
/// (grouped by prompt_pos), scores aligned with them.
EvalSummary summarize_eval(const std::vector<rollout::Sample>& samples,
                           const std::vector<double>& scores, int64_t n_per_prompt,
                           double correct_threshold = 1.0);

/// How an evaluation samples.
struct EvalOptions {
  int64_t n_samples_per_prompt = 1;  ///< --eval_n_samples_per_prompt
  int64_t generate_max_len = 1024;   ///< --generate_max_len (capped by the context)
  rollout::SamplingParams sampling;  ///< --eval_temperature (or --temperature), top_p, top_k
  double correct_threshold = 1.0;    ///< a sample is correct when its score reaches this
  /// Multi-turn episodes with an environment (--env_command), as in training; its reward scores
  /// a sample where given, else the rule reward.
  EpisodeOptions episodes;
};

/// One evaluated sample (what `rlhf eval` writes per line).
struct EvalRecord {
  int64_t prompt_index = 0, sample_index = 0;
  std::string completion;
  double score = 0;
  int64_t completion_tokens = 0;
  bool stopped = false;
};

/// Evaluates the job's engines on `prompts`: engine e generates prompts [e·P/E, (e+1)·P/E) (all
/// ranks of a tensor-parallel engine together; request id = prompt index, so the samples do not
/// depend on the engine count), the samples are gathered to every rank over `world`, world rank 0
/// scores them and the summary reaches every rank. records (when not null) receives every sample
/// on world rank 0. Collective over the world; ranks without an engine pass nullptr.
EvalSummary evaluate(rollout::Engine* engine, const parallel::Topology& topology,
                     parallel::Comm& world, const std::vector<Prompt>& prompts, RewardFn& reward,
                     const io::Tokenizer& tokenizer, const EvalOptions& options,
                     std::vector<EvalRecord>* records = nullptr);

}  // namespace rlhf::rl
