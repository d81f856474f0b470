#include "rl/advantages.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace rlhf::rl {

AdvantageEstimator advantage_estimator_from_string(const std::string& s) {
  if (s == "gae") return AdvantageEstimator::kGae;
  if (s == "reinforce") return AdvantageEstimator::kReinforce;
  if (s == "reinforce_baseline") return AdvantageEstimator::kReinforceBaseline;
  if (s == "rloo") return AdvantageEstimator::kRloo;
  if (s == "group_norm") return AdvantageEstimator::kGroupNorm;
  if (s == "dr_grpo") return AdvantageEstimator::kDrGrpo;
  RLHF_FAIL(
      "unknown --advantage_estimator '{}'\nhint: gae, reinforce, reinforce_baseline, rloo, "
      "group_norm or dr_grpo",
      s);
}

const char* to_string(AdvantageEstimator e) {
  switch (e) {
    case AdvantageEstimator::kGae:
      return "gae";
    case AdvantageEstimator::kReinforce:
      return "reinforce";
    case AdvantageEstimator::kReinforceBaseline:
      return "reinforce_baseline";
    case AdvantageEstimator::kRloo:
      return "rloo";
    case AdvantageEstimator::kGroupNorm:
      return "group_norm";
    case AdvantageEstimator::kDrGrpo:
      return "dr_grpo";
  }
  return "?";
}

bool needs_group(AdvantageEstimator e) {
  return e == AdvantageEstimator::kReinforceBaseline || e == AdvantageEstimator::kRloo ||
         e == AdvantageEstimator::kGroupNorm || e == AdvantageEstimator::kDrGrpo;
}

bool uses_critic(AdvantageEstimator e) {
  return e == AdvantageEstimator::kGae;
}

bool whitens(AdvantageEstimator e) {
  return e == AdvantageEstimator::kGae || e == AdvantageEstimator::kReinforce ||
         e == AdvantageEstimator::kReinforceBaseline;
}

namespace {

// compute_advantages over each row's action tokens only (AdvantageInput::mask): the rows
// compacted to their action tokens, the estimator run on them, the results scattered back.
AdvantageOutput compute_masked(const AdvantageInput& in, AdvantageEstimator est) {
  const int64_t B = in.B, Tr = in.Tr;
  std::vector<std::vector<int64_t>> pos(static_cast<size_t>(B));  // action positions of each row
  int64_t Ta = 1;
  for (int64_t i = 0; i < B; ++i) {
    RLHF_CHECK(in.resp_len[i] >= 0 && in.resp_len[i] <= Tr,
               "advantages: sample {} has response length {} outside [0, {}]", i, in.resp_len[i],
               Tr);
    for (int64_t t = 0; t < in.resp_len[i]; ++t)
      if (in.mask[i * Tr + t] != 0) pos[size_t(i)].push_back(t);
    Ta = std::max<int64_t>(Ta, int64_t(pos[size_t(i)].size()));
  }
  std::vector<int32_t> len(static_cast<size_t>(B));
  std::vector<double> kl, values;
  if (in.kl) kl.assign(size_t(B * Ta), 0.0);
  if (in.values) values.assign(size_t(B * Ta), 0.0);
  for (int64_t i = 0; i < B; ++i) {
    const auto& p = pos[size_t(i)];
    len[size_t(i)] = int32_t(p.size());
    for (size_t k = 0; k < p.size(); ++k) {
      if (in.kl) kl[size_t(i * Ta) + k] = in.kl[i * Tr + p[k]];
      if (in.values) values[size_t(i * Ta) + k] = in.values[i * Tr + p[k]];
    }
  }
  AdvantageInput c = in;
  c.Tr = Ta;
  c.resp_len = len.data();
  c.kl = in.kl ? kl.data() : nullptr;
  c.values = in.values ? values.data() : nullptr;
  c.mask = nullptr;
  const AdvantageOutput a = compute_advantages(c, est);
  AdvantageOutput out;
  out.reward.assign(size_t(B * Tr), 0.0);
  out.advantages.assign(size_t(B * Tr), 0.0);
  out.returns.assign(size_t(B * Tr), 0.0);
  out.shaped_score = a.shaped_score;
  for (int64_t i = 0; i < B; ++i) {
    const auto& p = pos[size_t(i)];
    for (size_t k = 0; k < p.size(); ++k) {
      const size_t from = size_t(i * Ta) + k, to = size_t(i * Tr + p[k]);
      out.reward[to] = a.reward[from];
      out.advantages[to] = a.advantages[from];
      out.returns[to] = a.returns[from];
    }
  }
  return out;
}

}  // namespace

AdvantageOutput compute_advantages(const AdvantageInput& in, AdvantageEstimator est) {
  if (in.mask != nullptr) return compute_masked(in, est);
  const int64_t B = in.B, Tr = in.Tr;
  const int n = in.group_size;
  RLHF_CHECK(B >= 1 && Tr >= 1, "advantages: empty batch (B={}, Tr={})", B, Tr);
  RLHF_CHECK(!needs_group(est) || n >= 2,
             "--advantage_estimator {} needs --n_samples_per_prompt > 1, got {}", to_string(est),
             n);
  RLHF_CHECK(n >= 1 && B % n == 0, "advantages: {} samples are not whole groups of {}", B, n);
  RLHF_CHECK(!uses_critic(est) || in.values != nullptr, "advantages: gae needs critic values");
  for (int64_t i = 0; i < B; ++i)
    RLHF_CHECK(in.resp_len[i] >= 0 && in.resp_len[i] <= Tr,
               "advantages: sample {} has response length {} outside [0, {}]", i, in.resp_len[i],
               Tr);
  AdvantageOutput out;
  out.reward.assign(size_t(B * Tr), 0.0);
  out.advantages.assign(size_t(B * Tr), 0.0);
  out.returns.assign(size_t(B * Tr), 0.0);
  out.shaped_score.resize(size_t(B));

  // 1. Scores: clip, then the group transform.
  std::vector<double> s(static_cast<size_t>(B));
  for (int64_t i = 0; i < B; ++i)
    s[size_t(i)] = std::clamp(in.score[i], -in.score_clip, in.score_clip);
  for (int64_t g = 0; g < B / n; ++g) {
    double sum = 0;
    for (int j = 0; j < n; ++j) sum += s[size_t(g * n + j)];
    const double mean = sum / n;
    double ss = 0;
    for (int j = 0; j < n; ++j) ss += (s[size_t(g * n + j)] - mean) * (s[size_t(g * n + j)] - mean);
    const double std_unbiased = n > 1 ? std::sqrt(ss / (n - 1)) : 0.0;
    for (int j = 0; j < n; ++j) {
      const double x = s[size_t(g * n + j)];
      double y = x;
      switch (est) {
        case AdvantageEstimator::kGae:
        case AdvantageEstimator::kReinforce:
          y = x;
          break;
        case AdvantageEstimator::kReinforceBaseline:
        case AdvantageEstimator::kDrGrpo:
          y = x - mean;
          break;
        case AdvantageEstimator::kRloo:
          y = x - (sum - x) / (n - 1);
          break;
        case AdvantageEstimator::kGroupNorm:
          y = in.std_norm ? (x - mean) / (std_unbiased + 1e-9) : x - mean;
          break;
      }
      out.shaped_score[size_t(g * n + j)] = y;
    }
  }

  // 2. Per-token rewards and 3. advantages / returns, sample by sample.
  for (int64_t i = 0; i < B; ++i) {
    const int64_t len = in.resp_len[i];
    double* r = out.reward.data() + i * Tr;
    double* A = out.advantages.data() + i * Tr;
    double* R = out.returns.data() + i * Tr;
    for (int64_t t = 0; t < len; ++t) {
      r[t] = in.kl ? -in.kl_coef * in.kl[i * Tr + t] : 0.0;
      if (t == len - 1) r[t] += out.shaped_score[size_t(i)];
    }
    if (est == AdvantageEstimator::kGae) {
      const double* V = in.values + i * Tr;
      double next_a = 0, next_v = 0;
      for (int64_t t = len - 1; t >= 0; --t) {
        const double delta = r[t] + in.gamma * next_v - V[t];
        A[t] = delta + in.gamma * in.lambd * next_a;
        R[t] = A[t] + V[t];
        next_a = A[t];
        next_v = V[t];
      }
    } else {
      double acc = 0;
      for (int64_t t = len - 1; t >= 0; --t) {
        acc = r[t] + in.gamma * acc;
        A[t] = R[t] = acc;
      }
    }
  }

  // 4. Whitening over every response token of the batch.
  if (whitens(est)) {
    double sum = 0, count = 0;
    for (int64_t i = 0; i < B; ++i)
      for (int64_t t = 0; t < in.resp_len[i]; ++t) {
        sum += out.advantages[size_t(i * Tr + t)];
        count += 1;
      }
    if (count > 0) {
      const double mean = sum / count;
      double var = 0;
      for (int64_t i = 0; i < B; ++i)
        for (int64_t t = 0; t < in.resp_len[i]; ++t) {
          const double d = out.advantages[size_t(i * Tr + t)] - mean;
          var += d * d;
        }
      var /= count;
      const double rs = 1.0 / std::sqrt(std::max(var, 1e-8));
      for (int64_t i = 0; i < B; ++i)
        for (int64_t t = 0; t < in.resp_len[i]; ++t) {
          double& a = out.advantages[size_t(i * Tr + t)];
          a = (a - mean) * rs;
        }
    }
  }
  return out;
}

void KlController::update(double current_kl, double n_steps) {
  if (target_ <= 0) return;
  const double err = std::clamp(current_kl / target_ - 1.0, -0.2, 0.2);
  beta_ *= 1.0 + err * n_steps / horizon_;
}

}  // namespace rlhf::rl
