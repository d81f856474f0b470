#include "rl/score.h"

#include <algorithm>

#include "core/error.h"

namespace rlhf::rl {

Scorer::Scorer(const model::ParamLayout& layout) : params_(layout), net_(params_.layout()) {}

std::vector<float*> Scorer::unit_buffers() {
  std::vector<float*> out;
  for (int u = 0; u < params_.layout().num_units(); ++u) out.push_back(params_.params(u));
  return out;
}

std::vector<double> Scorer::forward(std::span<const int32_t> tokens, int64_t from) {
  const int64_t T = static_cast<int64_t>(tokens.size());
  std::vector<int32_t> targets(static_cast<size_t>(T), -1);
  for (int64_t t = std::max<int64_t>(from, 0); t + 1 < T; ++t)
    targets[size_t(t)] = tokens[size_t(t + 1)];
  std::vector<float> lp(static_cast<size_t>(T));
  net_.forward_lm(params_, tokens.data(), targets.data(), 1, T, lp.data(), nullptr, false);
  std::vector<double> out;
  for (int64_t t = std::max<int64_t>(from, 0); t + 1 < T; ++t) out.push_back(lp[size_t(t)]);
  return out;
}

std::vector<double> Scorer::response_logprobs(std::span<const int32_t> prompt,
                                              std::span<const int32_t> response) {
  RLHF_CHECK(!prompt.empty(),
             "score: the prompt has no tokens (the first response token needs a "
             "context)");
  const int64_t max_pos = params_.layout().config().max_position_embeddings;
  const int64_t n = static_cast<int64_t>(prompt.size() + response.size());
  RLHF_CHECK(n <= max_pos,
             "score: prompt + response is {} tokens, more than the model's {} positions", n,
             max_pos);
  if (response.empty()) return {};
  std::vector<int32_t> tokens(prompt.begin(), prompt.end());
  tokens.insert(tokens.end(), response.begin(), response.end());
  return forward(tokens, static_cast<int64_t>(prompt.size()) - 1);
}

std::vector<double> Scorer::text_logprobs(std::span<const int32_t> ids, int64_t window,
                                          int64_t stride) {
  const int64_t max_pos = params_.layout().config().max_position_embeddings;
  RLHF_CHECK(window >= 2 && window <= max_pos,
             "score: window {} must be in [2, {}] (the model's positions)", window, max_pos);
  RLHF_CHECK(stride >= 1 && stride <= window, "score: stride {} must be in [1, window {}]", stride,
             window);
  const int64_t n = static_cast<int64_t>(ids.size());
  std::vector<double> out;
  int64_t prev_end = 0;
  for (int64_t begin = 0; begin < n; begin += stride) {
    const int64_t end = std::min(begin + window, n);
    // Score positions after prev_end (targets ids[t] for t >= max(prev_end, begin + 1)): in the
    // window's coordinates, predictions from index max(prev_end, begin + 1) - begin - 1 on.
    const int64_t first_target = std::max(prev_end, begin + 1);
    if (first_target < end) {
      const std::vector<double> lp =
          forward(ids.subspan(size_t(begin), size_t(end - begin)), first_target - begin - 1);
      out.insert(out.end(), lp.begin(), lp.end());
    }
    prev_end = end;
    if (end == n) break;
  }
  return out;
}

double mean_nll(std::span<const double> logprobs) {
  if (logprobs.empty()) return 0.0;
  double s = 0;
  for (double x : logprobs) s -= x;
  return s / double(logprobs.size());
}

}  // namespace rlhf::rl
