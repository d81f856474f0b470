#include "rl/is_correction.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"

namespace rlhf::rl {

IsCorrection is_correction_from_string(const std::string& s) {
  if (s == "tis") return IsCorrection::kTis;
  if (s == "icepop") return IsCorrection::kIcepop;
  if (s == "seq-mask-tis") return IsCorrection::kSeqMaskTis;
  RLHF_FAIL("--vllm_is_correction_type must be tis, icepop or seq-mask-tis, got '{}'", s);
}

const char* to_string(IsCorrection c) {
  switch (c) {
    case IsCorrection::kNone:
      return "none";
    case IsCorrection::kTis:
      return "tis";
    case IsCorrection::kIcepop:
      return "icepop";
    case IsCorrection::kSeqMaskTis:
      return "seq-mask-tis";
    case IsCorrection::kDecoupled:
      return "decoupled";
  }
  return "?";
}

namespace {

double log_ratio(float lp_old, float lp_rol) {
  return std::clamp(double(lp_old) - double(lp_rol), -kIsLogRatioClamp, kIsLogRatioClamp);
}

}  // namespace

void is_weights_cpu(float* w, uint8_t* masked, const float* lp_old, const float* lp_rol,
                    const int32_t* seq, int64_t N, int64_t n_seq, IsCorrection type, double lo,
                    double hi) {
  // seq-mask-tis: which rows are kept, by the geometric mean of their token ratios.
  std::vector<uint8_t> row_kept(size_t(std::max<int64_t>(n_seq, 0)), 1);
  for (int64_t t = 0; t < N; ++t)
    RLHF_CHECK(seq[t] < n_seq, "IS correction: row {} of token {} outside [0, {})", seq[t], t,
               n_seq);
  if (type == IsCorrection::kSeqMaskTis) {
    std::vector<double> sum(row_kept.size(), 0.0), cnt(row_kept.size(), 0.0);
    for (int64_t t = 0; t < N; ++t) {
      if (seq[t] < 0) continue;
      sum[size_t(seq[t])] += double(lp_old[t]) - double(lp_rol[t]);
      cnt[size_t(seq[t])] += 1.0;
    }
    for (size_t i = 0; i < row_kept.size(); ++i) {
      const double m = cnt[i] > 0 ? sum[i] / cnt[i] : 0.0;
      const double rho = std::exp(std::clamp(m, -kIsLogRatioClamp, kIsLogRatioClamp));
      row_kept[i] = rho >= lo && rho <= hi ? 1 : 0;
    }
  }
  for (int64_t t = 0; t < N; ++t) {
    if (masked) masked[t] = 0;
    if (seq[t] < 0) {
      w[t] = 0.0f;
      continue;
    }
    const double r = std::exp(log_ratio(lp_old[t], lp_rol[t]));
    double v = 1.0;
    bool drop = false;
    switch (type) {
      case IsCorrection::kNone:
        break;
      case IsCorrection::kTis:
        v = std::clamp(r, lo, hi);
        break;
      case IsCorrection::kIcepop:
        drop = !(r >= lo && r <= hi);
        v = r;
        break;
      case IsCorrection::kSeqMaskTis:
        drop = row_kept[size_t(seq[t])] == 0;
        v = r;
        break;
      case IsCorrection::kDecoupled:
        drop = hi > 0 && r > hi;
        v = r;
        break;
    }
    w[t] = drop ? 0.0f : float(v);
    if (masked) masked[t] = drop ? 1 : 0;
  }
}

void MismatchSums::add(double lp_old, double lp_rol, double weight, bool was_masked) {
  const double d = lp_old - lp_rol;
  n += 1;
  k3 += std::expm1(d) - d;  // r − 1 − log r, exactly 0 at d = 0
  abs += std::fabs(d);
  neg_d -= d;
  w += weight;
  masked += was_masked ? 1 : 0;
  abs_max = std::max(abs_max, std::fabs(d));
  w_max = std::max(w_max, weight);
  neg_w_min = std::max(neg_w_min, -weight);
}

void MismatchSums::pack(double* sums6, double* max3) const {
  const double s[6] = {n, k3, abs, neg_d, w, masked};
  std::copy(s, s + 6, sums6);
  max3[0] = abs_max;
  max3[1] = w_max;
  max3[2] = neg_w_min;
}

void MismatchSums::unpack(const double* sums6, const double* max3) {
  n = sums6[0];
  k3 = sums6[1];
  abs = sums6[2];
  neg_d = sums6[3];
  w = sums6[4];
  masked = sums6[5];
  abs_max = max3[0];
  w_max = max3[1];
  neg_w_min = max3[2];
}

MismatchStats MismatchStats::from(const MismatchSums& s) {
  MismatchStats m;
  if (s.n <= 0) return m;
  m.mismatch_kl = s.k3 / s.n;
  m.mismatch_abs_logp_mean = s.abs / s.n;
  m.mismatch_abs_logp_max = s.abs_max;
  m.vllm_kl = s.neg_d / s.n;
  m.is_weight_mean = s.w / s.n;
  m.is_weight_min = -s.neg_w_min;
  m.is_weight_max = s.w_max;
  m.is_masked_fraction = s.masked / s.n;
  return m;
}

}  // namespace rlhf::rl
