#include "rl/losses.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "core/error.h"

namespace rlhf::rl {

namespace {

constexpr double kLogRatioClamp = 20.0;
constexpr double kKlClamp = 10.0;

// Which branch of the clipped surrogate is active for one token.
enum class Branch { kUnclipped, kClipped, kDual, kClamped };

template <typename T>
Branch ppo_branch(T lp, T lp_old, T a, double eps_low, double eps_high, double dual, T* loss,
                  T* ratio) {
  const double d = double(lp) - double(lp_old);
  const double dc = std::clamp(d, -kLogRatioClamp, kLogRatioClamp);
  const double rho = std::exp(dc);
  const double s1 = rho * double(a);
  const double s2 = std::clamp(rho, 1.0 - eps_low, 1.0 + eps_high) * double(a);
  double l = -std::min(s1, s2);
  Branch b = s2 < s1 ? Branch::kClipped : Branch::kUnclipped;
  if (dual > 1.0 && double(a) < 0.0) {
    const double s3 = dual * double(a);
    if (s3 > std::min(s1, s2)) {
      l = -s3;
      b = Branch::kDual;
    }
  }
  if (b == Branch::kUnclipped && dc != d) b = Branch::kClamped;  // ρ saturated: no gradient
  if (loss) *loss = T(l);
  if (ratio) *ratio = T(rho);
  return b;
}

template <typename T>
double kl_value(T lp, T lp_ref, KlEstimator est, bool* clamped) {
  const double d = double(lp) - double(lp_ref);
  double k = 0;
  switch (est) {
    case KlEstimator::kK1:
      k = d;
      break;
    case KlEstimator::kK2:
      k = 0.5 * d * d;
      break;
    case KlEstimator::kK3:
      k = std::exp(-d) - 1.0 + d;
      break;
  }
  const double kc = std::clamp(k, -kKlClamp, kKlClamp);
  if (clamped) *clamped = kc != k;
  return kc;
}

}  // namespace

KlEstimator kl_estimator_from_string(const std::string& s) {
  if (s == "k1") return KlEstimator::kK1;
  if (s == "k2") return KlEstimator::kK2;
  if (s == "k3") return KlEstimator::kK3;
  RLHF_FAIL("unknown --kl_estimator '{}'\nhint: k1, k2 or k3", s);
}

const char* to_string(KlEstimator k) {
  return k == KlEstimator::kK1 ? "k1" : k == KlEstimator::kK2 ? "k2" : "k3";
}

template <typename T>
void ppo_clip_loss_forward_cpu(T* loss, uint8_t* clipped, T* ratio, const T* lp, const T* lp_old,
                               const T* adv, int64_t N, double eps_low, double eps_high,
                               double dual_clip) {
  for (int64_t t = 0; t < N; ++t) {
    const Branch b = ppo_branch(lp[t], lp_old[t], adv[t], eps_low, eps_high, dual_clip, &loss[t],
                                ratio ? &ratio[t] : nullptr);
    if (clipped) clipped[t] = (b == Branch::kClipped || b == Branch::kDual) ? 1 : 0;
  }
}

template <typename T>
void ppo_clip_loss_backward_cpu(T* dlp, const T* weight, const T* lp, const T* lp_old, const T* adv,
                                int64_t N, double eps_low, double eps_high, double dual_clip) {
  for (int64_t t = 0; t < N; ++t) {
    T rho;
    const Branch b =
        ppo_branch(lp[t], lp_old[t], adv[t], eps_low, eps_high, dual_clip, (T*)nullptr, &rho);
    dlp[t] = b == Branch::kUnclipped ? T(-double(weight[t]) * double(rho) * double(adv[t])) : T(0);
  }
}

template <typename T>
void kl_forward_cpu(T* kl, const T* lp, const T* lp_ref, int64_t N, KlEstimator est) {
  for (int64_t t = 0; t < N; ++t) kl[t] = T(kl_value(lp[t], lp_ref[t], est, nullptr));
}

template <typename T>
void kl_backward_cpu(T* dlp, const T* weight, const T* lp, const T* lp_ref, int64_t N,
                     KlEstimator est) {
  for (int64_t t = 0; t < N; ++t) {
    bool clamped = false;
    kl_value(lp[t], lp_ref[t], est, &clamped);
    const double d = double(lp[t]) - double(lp_ref[t]);
    double g = 0;
    switch (est) {
      case KlEstimator::kK1:
        g = 1.0;
        break;
      case KlEstimator::kK2:
        g = d;
        break;
      case KlEstimator::kK3:
        g = 1.0 - std::exp(-d);
        break;
    }
    dlp[t] = clamped ? T(0) : T(double(weight[t]) * g);
  }
}

template <typename T>
void value_loss_forward_cpu(T* loss, uint8_t* clipped, const T* v, const T* v_old, const T* ret,
                            int64_t N, double value_clip) {
  for (int64_t t = 0; t < N; ++t) {
    const double e1 = double(v[t]) - double(ret[t]);
    if (value_clip <= 0) {
      loss[t] = T(0.5 * e1 * e1);
      if (clipped) clipped[t] = 0;
      continue;
    }
    const double vc =
        double(v_old[t]) + std::clamp(double(v[t]) - double(v_old[t]), -value_clip, value_clip);
    const double e2 = vc - double(ret[t]);
    loss[t] = T(0.5 * std::max(e1 * e1, e2 * e2));
    if (clipped) clipped[t] = e2 * e2 > e1 * e1 ? 1 : 0;
  }
}

template <typename T>
void value_loss_backward_cpu(T* dv, const T* weight, const T* v, const T* v_old, const T* ret,
                             int64_t N, double value_clip) {
  for (int64_t t = 0; t < N; ++t) {
    const double e1 = double(v[t]) - double(ret[t]);
    double g = e1;
    if (value_clip > 0) {
      const double diff = double(v[t]) - double(v_old[t]);
      const double vc = double(v_old[t]) + std::clamp(diff, -value_clip, value_clip);
      const double e2 = vc - double(ret[t]);
      if (e2 * e2 > e1 * e1) g = std::fabs(diff) < value_clip ? e2 : 0.0;
    }
    dv[t] = T(double(weight[t]) * g);
  }
}

double bradley_terry_loss(double delta, double* dloss_ddelta) {
  if (dloss_ddelta) *dloss_ddelta = -1.0 / (1.0 + std::exp(delta));
  return delta > 0 ? std::log1p(std::exp(-delta)) : -delta + std::log1p(std::exp(delta));
}

#define RLHF_INSTANTIATE(T)                                                                        \
  template void ppo_clip_loss_forward_cpu<T>(T*, uint8_t*, T*, const T*, const T*, const T*,       \
                                             int64_t, double, double, double);                     \
  template void ppo_clip_loss_backward_cpu<T>(T*, const T*, const T*, const T*, const T*, int64_t, \
                                              double, double, double);                             \
  template void kl_forward_cpu<T>(T*, const T*, const T*, int64_t, KlEstimator);                   \
  template void kl_backward_cpu<T>(T*, const T*, const T*, const T*, int64_t, KlEstimator);        \
  template void value_loss_forward_cpu<T>(T*, uint8_t*, const T*, const T*, const T*, int64_t,     \
                                          double);                                                 \
  template void value_loss_backward_cpu<T>(T*, const T*, const T*, const T*, const T*, int64_t,    \
                                           double);
RLHF_INSTANTIATE(float)
RLHF_INSTANTIATE(double)
#undef RLHF_INSTANTIATE

PolicyLossType policy_loss_type_from_string(const std::string& s) {
  if (s == "ppo") return PolicyLossType::kPpo;
  if (s == "gspo") return PolicyLossType::kGspo;
  RLHF_FAIL("--policy_loss_type must be ppo or gspo, got '{}'", s);
}

const char* to_string(PolicyLossType t) {
  return t == PolicyLossType::kGspo ? "gspo" : "ppo";
}

namespace {

// The clamped mean log-ratio of every sequence: (n_seq) out.
template <typename T>
std::vector<double> seq_log_ratios(const T* lp, const T* lp_old, const int32_t* seq, int64_t N,
                                   int64_t n_seq, bool* clamped) {
  std::vector<double> sum(size_t(n_seq), 0.0), cnt(size_t(n_seq), 0.0);
  for (int64_t t = 0; t < N; ++t) {
    if (seq[t] < 0) continue;
    RLHF_CHECK(seq[t] < n_seq, "GSPO: sequence index {} of token {} outside [0, {})", seq[t], t,
               n_seq);
    sum[size_t(seq[t])] += double(lp[t]) - double(lp_old[t]);
    cnt[size_t(seq[t])] += 1.0;
  }
  for (int64_t i = 0; i < n_seq; ++i) {
    const double m = cnt[size_t(i)] > 0 ? sum[size_t(i)] / cnt[size_t(i)] : 0.0;
    sum[size_t(i)] = std::clamp(m, -kLogRatioClamp, kLogRatioClamp);
    clamped[i] = sum[size_t(i)] != m;
  }
  return sum;
}

}  // namespace

template <typename T>
void gspo_loss_forward_cpu(T* loss, uint8_t* clipped, T* seq_ratio, const T* lp, const T* lp_old,
                           const T* adv, const int32_t* seq, int64_t N, int64_t n_seq,
                           double eps_low, double eps_high) {
  std::unique_ptr<bool[]> sat(new bool[size_t(std::max<int64_t>(n_seq, 1))]);
  const std::vector<double> m = seq_log_ratios(lp, lp_old, seq, N, n_seq, sat.get());
  for (int64_t i = 0; i < n_seq; ++i)
    if (seq_ratio) seq_ratio[i] = T(std::exp(m[size_t(i)]));
  for (int64_t t = 0; t < N; ++t) {
    if (seq[t] < 0) {
      loss[t] = T(0);
      if (clipped) clipped[t] = 0;
      continue;
    }
    const double s = std::exp(m[size_t(seq[t])]), a = double(adv[t]);
    const double s1 = s * a, s2 = std::clamp(s, 1.0 - eps_low, 1.0 + eps_high) * a;
    loss[t] = T(-std::min(s1, s2));
    if (clipped) clipped[t] = s2 < s1 ? 1 : 0;
  }
}

template <typename T>
void gspo_loss_backward_cpu(T* dlp, const T* weight, const T* lp, const T* lp_old, const T* adv,
                            const int32_t* seq, int64_t N, int64_t n_seq, double eps_low,
                            double eps_high) {
  std::unique_ptr<bool[]> sat(new bool[size_t(std::max<int64_t>(n_seq, 1))]);
  const std::vector<double> m = seq_log_ratios(lp, lp_old, seq, N, n_seq, sat.get());
  for (int64_t t = 0; t < N; ++t) {
    dlp[t] = T(0);
    if (seq[t] < 0 || sat[size_t(seq[t])]) continue;
    const double s = std::exp(m[size_t(seq[t])]), a = double(adv[t]);
    const double s1 = s * a, s2 = std::clamp(s, 1.0 - eps_low, 1.0 + eps_high) * a;
    if (s2 < s1) continue;  // the clipped branch: constant in lp
    dlp[t] = T(double(weight[t]) * -s * a);
  }
}

#define RLHF_GSPO(T)                                                                        \
  template void gspo_loss_forward_cpu<T>(T*, uint8_t*, T*, const T*, const T*, const T*,    \
                                         const int32_t*, int64_t, int64_t, double, double); \
  template void gspo_loss_backward_cpu<T>(T*, const T*, const T*, const T*, const T*,       \
                                          const int32_t*, int64_t, int64_t, double, double);
RLHF_GSPO(float)
RLHF_GSPO(double)
#undef RLHF_GSPO

LossAggMode loss_agg_mode_from_string(const std::string& s) {
  if (s == "token-mean") return LossAggMode::kTokenMean;
  if (s == "seq-mean-token-mean") return LossAggMode::kSeqMeanTokenMean;
  if (s == "seq-mean-token-sum") return LossAggMode::kSeqMeanTokenSum;
  if (s == "seq-mean-token-sum-norm") return LossAggMode::kSeqMeanTokenSumNorm;
  RLHF_FAIL(
      "--loss_agg_mode must be token-mean, seq-mean-token-mean, seq-mean-token-sum or "
      "seq-mean-token-sum-norm, got '{}'",
      s);
}

const char* to_string(LossAggMode m) {
  switch (m) {
    case LossAggMode::kTokenMean:
      return "token-mean";
    case LossAggMode::kSeqMeanTokenMean:
      return "seq-mean-token-mean";
    case LossAggMode::kSeqMeanTokenSum:
      return "seq-mean-token-sum";
    case LossAggMode::kSeqMeanTokenSumNorm:
      return "seq-mean-token-sum-norm";
  }
  return "?";
}

double loss_agg_weight(LossAggMode mode, int64_t seq_len, int64_t step_tokens, int64_t step_seqs,
                       int64_t max_len) {
  switch (mode) {
    case LossAggMode::kTokenMean:
      return 1.0 / double(std::max<int64_t>(step_tokens, 1));
    case LossAggMode::kSeqMeanTokenMean:
      RLHF_CHECK(step_seqs > 0, "loss aggregation over {} sequences", step_seqs);
      return seq_len > 0 ? 1.0 / (double(step_seqs) * double(seq_len)) : 0.0;
    case LossAggMode::kSeqMeanTokenSum:
      RLHF_CHECK(step_seqs > 0, "loss aggregation over {} sequences", step_seqs);
      return 1.0 / double(step_seqs);
    case LossAggMode::kSeqMeanTokenSumNorm:
      RLHF_CHECK(step_seqs > 0 && max_len > 0,
                 "seq-mean-token-sum-norm needs sequences ({}) and --generate_max_len ({}) > 0",
                 step_seqs, max_len);
      return 1.0 / (double(step_seqs) * double(max_len));
  }
  return 0.0;
}

}  // namespace rlhf::rl
