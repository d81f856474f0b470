#include "rollout/sampling.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "core/error.h"
#include "model/ops/cpu/vec_math.h"

namespace rlhf::rollout {

namespace {

// Tokens per partial sum of exp(z − max z): the CDF walk skips whole blocks.
constexpr int64_t kBlock = 256;

}  // namespace

void SamplingParams::validate() const {
  RLHF_CHECK(std::isfinite(temperature) && temperature >= 0,
             "temperature must be finite and >= 0, got {}", temperature);
  RLHF_CHECK(top_p > 0 && top_p <= 1, "top_p must be in (0, 1], got {}", top_p);
  RLHF_CHECK(top_k >= -1, "top_k must be -1 (off), 0 (off) or >= 1, got {}", top_k);
}

uint64_t mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

double counter_uniform(uint64_t seed, uint64_t request_id, uint64_t sample_index, uint64_t step) {
  uint64_t h = mix64(seed);
  h = mix64(h ^ request_id);
  h = mix64(h ^ sample_index);
  h = mix64(h ^ step);
  return static_cast<double>(h >> 11) * 0x1.0p-53;
}

Sampler::Sampler(int64_t vocab_size)
    : V_(vocab_size),
      e_(static_cast<size_t>(vocab_size)),
      block_(static_cast<size_t>((vocab_size + kBlock - 1) / kBlock)),
      order_(static_cast<size_t>(vocab_size)) {
  RLHF_CHECK(vocab_size > 0, "Sampler: vocab_size must be > 0, got {}", vocab_size);
  kept_.reserve(static_cast<size_t>(vocab_size));
}

double Sampler::prepare(const float* logits, double inv_t) {
  // Mirrors logprob_forward_cpu (the trainer's log-prob): z = scale·x in float, max, exp_fast.
  const float scale = static_cast<float>(inv_t);
  float m = -std::numeric_limits<float>::infinity();
#pragma omp simd reduction(max : m)
  for (int64_t i = 0; i < V_; ++i) {
    const float z = scale * logits[i];
    m = z > m ? z : m;
  }
  double total = 0;
  for (int64_t b0 = 0, blk = 0; b0 < V_; b0 += kBlock, ++blk) {
    const int64_t b1 = std::min(V_, b0 + kBlock);
    float s = 0;
#pragma omp simd reduction(+ : s)
    for (int64_t i = b0; i < b1; ++i) {
      const float e = model::exp_fast(scale * logits[i] - m);
      e_[size_t(i)] = e;
      s += e;
    }
    block_[size_t(blk)] = s;
    total += s;
  }
  if (!(std::isfinite(total) && total > 0 && std::isfinite(m))) {
    int64_t bad = 0;
    while (bad < V_ && !std::isnan(logits[bad]) && logits[bad] != INFINITY) ++bad;
    RLHF_FAIL(
        "sampling: logits are not finite (token {} is {}; all -inf counts too)\nhint: the "
        "weights or the activations overflowed",
        bad < V_ ? bad : 0, bad < V_ ? logits[bad] : logits[0]);
  }
  sum_e_ = total;
  return static_cast<double>(m) + std::log(total);
}

double Sampler::truncate(const float* logits, const SamplingParams& p) {
  // Descending logit, then ascending id: a strict total order, so the kept set is deterministic.
  auto before = [logits](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  const int64_t k = (p.top_k > 0 && p.top_k < V_) ? p.top_k : V_;
  const bool nucleus = p.top_p < 1.0;
  kept_.clear();
  // Candidates: exactly the top-k, or (top-p alone) a growing top slice until its mass suffices.
  int64_t cand = nucleus && k == V_ ? std::min<int64_t>(V_, 64) : k;
  for (;;) {
    std::iota(order_.begin(), order_.end(), 0);
    if (cand < V_) std::nth_element(order_.begin(), order_.begin() + cand, order_.end(), before);
    std::sort(order_.begin(), order_.begin() + cand, before);
    if (!nucleus) {
      kept_.assign(order_.begin(), order_.begin() + cand);
      break;
    }
    // Mass the nucleus is measured against: the top-k set's, or the whole vocabulary's.
    double denom = 0;
    if (k < V_) {
      for (int64_t j = 0; j < k; ++j) denom += e_[size_t(order_[size_t(j)])];
    } else {
      denom = sum_e_;
    }
    const double threshold = p.top_p * denom;
    double cum = 0;
    bool reached = false;
    for (int64_t j = 0; j < cand; ++j) {
      kept_.push_back(order_[size_t(j)]);
      cum += e_[size_t(order_[size_t(j)])];
      if (cum >= threshold) {
        reached = true;
        break;
      }
    }
    if (reached || cand == k) break;  // k: the whole candidate set (rounding at top_p ≈ 1)
    kept_.clear();
    cand = std::min(k, cand * 8);
  }
  double mass = 0;
  for (int32_t t : kept_) mass += e_[size_t(t)];
  return mass;
}

SampledToken Sampler::sample(const float* logits, const SamplingParams& p, double u) {
  SampledToken out;
  if (p.is_greedy()) {
    int32_t best = 0;
    for (int64_t i = 1; i < V_; ++i)
      if (logits[i] > logits[best]) best = int32_t(i);
    const double lse = prepare(logits, 1.0);
    out.token = best;
    out.logprob = static_cast<float>(double(logits[best]) - lse);
    return out;
  }
  const double inv_t = 1.0 / p.temperature;
  const double lse = prepare(logits, inv_t);
  int32_t tok = -1;
  if (!p.truncates(V_)) {
    // Inverse CDF in id order: find the block, then the token inside it.
    const double target = u * sum_e_;
    double cum = 0;
    const int64_t nblocks = static_cast<int64_t>(block_.size());
    int64_t blk = 0;
    while (blk < nblocks - 1 && cum + block_[size_t(blk)] <= target) cum += block_[size_t(blk++)];
    const int64_t b0 = blk * kBlock, b1 = std::min(V_, b0 + kBlock);
    for (int64_t i = b0; i < b1; ++i) {
      if (e_[size_t(i)] <= 0.0f) continue;
      tok = int32_t(i);  // the last token with mass so far: the fallback under rounding
      cum += e_[size_t(i)];
      if (cum > target) break;
    }
    if (tok < 0) {  // an all-zero last block (rounding put the target past the mass): go back
      for (int64_t i = b0 - 1; i >= 0 && tok < 0; --i)
        if (e_[size_t(i)] > 0.0f) tok = int32_t(i);
    }
  } else {
    const double target = u * truncate(logits, p);
    double cum = 0;
    for (int32_t t : kept_) {
      if (e_[size_t(t)] <= 0.0f && tok >= 0) continue;
      tok = t;
      cum += e_[size_t(t)];
      if (cum > target) break;
    }
  }
  RLHF_ASSERT(tok >= 0 && tok < V_);
  out.token = tok;
  out.logprob = static_cast<float>(double(static_cast<float>(inv_t) * logits[tok]) - lse);
  return out;
}

std::vector<int32_t> Sampler::support(const float* logits, const SamplingParams& p) {
  if (p.is_greedy()) {
    int32_t best = 0;
    for (int64_t i = 1; i < V_; ++i)
      if (logits[i] > logits[best]) best = int32_t(i);
    return {best};
  }
  prepare(logits, 1.0 / p.temperature);
  if (p.truncates(V_)) {
    truncate(logits, p);
    return kept_;
  }
  std::vector<int32_t> all(static_cast<size_t>(V_));
  std::iota(all.begin(), all.end(), 0);
  return all;
}

}  // namespace rlhf::rollout
