// Advantage estimators, per-token rewards, whitening and the adaptive KL controller on small
// hand-computed cases (the expected numbers are written here), with masks and ragged lengths.
#include "rl/advantages.h"

#include <cmath>

#include "core/error.h"
#include "tests/test_util.h"

using namespace rlhf;
using rl::AdvantageEstimator;

TEST_CASE("gae: hand-computed, gamma = lambda = 1 and gamma 0.9, lambda 0.8") {
  // One sample, 3 response tokens, score 1 at the last token, no KL, V = [0.5, 0.4, 0.3], Tr = 4.
  const int32_t len[1] = {3};
  const double score[1] = {1.0};
  const double V[4] = {0.5, 0.4, 0.3, 9.0};  // the padding value must be ignored
  rl::AdvantageInput in;
  in.B = 1;
  in.Tr = 4;
  in.resp_len = len;
  in.score = score;
  in.values = V;
  // Whitening would hide the raw numbers; a 1-sample batch is whitened, so read raw returns:
  // δ2 = 1 − 0.3 = 0.7, δ1 = 0.3 − 0.4 = −0.1, δ0 = 0.4 − 0.5 = −0.1;
  // A = [0.5, 0.6, 0.7], R = A + V = [1, 1, 1].
  auto out = rl::compute_advantages(in, AdvantageEstimator::kGae);
  CHECK(out.returns[0] == doctest::Approx(1.0));
  CHECK(out.returns[1] == doctest::Approx(1.0));
  CHECK(out.returns[2] == doctest::Approx(1.0));
  CHECK(out.returns[3] == 0.0);
  // Whitened A: mean 0.6, biased var 0.02/3 → (A − 0.6)/sqrt(0.0066667) = [−1.2247, 0, 1.2247].
  CHECK(out.advantages[0] == doctest::Approx(-1.224744871).epsilon(1e-7));
  CHECK(out.advantages[1] == doctest::Approx(0.0).epsilon(1e-9));
  CHECK(out.advantages[2] == doctest::Approx(1.224744871).epsilon(1e-7));
  CHECK(out.advantages[3] == 0.0);

  // γ = 0.9, λ = 0.8: δ2 = 0.7, δ1 = 0.9·0.3 − 0.4 = −0.13, δ0 = 0.9·0.4 − 0.5 = −0.14;
  // A2 = 0.7, A1 = −0.13 + 0.72·0.7 = 0.374, A0 = −0.14 + 0.72·0.374 = 0.12928;
  // R = A + V = [0.62928, 0.774, 1.0].
  in.gamma = 0.9;
  in.lambd = 0.8;
  out = rl::compute_advantages(in, AdvantageEstimator::kGae);
  CHECK(out.returns[0] == doctest::Approx(0.62928).epsilon(1e-12));
  CHECK(out.returns[1] == doctest::Approx(0.774).epsilon(1e-12));
  CHECK(out.returns[2] == doctest::Approx(1.0).epsilon(1e-12));
}

TEST_CASE("reinforce with a KL reward: rewards and reward-to-go") {
  // β = 0.1, KL = [0.2, 0.1, 0.3]: r = [−0.02, −0.01, −0.03 + 1] → returns [0.94, 0.96, 0.97].
  const int32_t len[2] = {3, 1};
  const double score[2] = {1.0, 25.0};  // the second is clipped to 10
  const double kl[6] = {0.2, 0.1, 0.3, 0.5, 7.0, 7.0};
  rl::AdvantageInput in;
  in.B = 2;
  in.Tr = 3;
  in.resp_len = len;
  in.score = score;
  in.kl = kl;
  in.kl_coef = 0.1;
  auto out = rl::compute_advantages(in, AdvantageEstimator::kReinforce);
  CHECK(out.reward[0] == doctest::Approx(-0.02));
  CHECK(out.reward[2] == doctest::Approx(0.97));
  CHECK(out.returns[0] == doctest::Approx(0.94));
  CHECK(out.returns[1] == doctest::Approx(0.96));
  CHECK(out.returns[2] == doctest::Approx(0.97));
  CHECK(out.shaped_score[1] == 10.0);
  CHECK(out.returns[3] == doctest::Approx(10.0 - 0.05));  // 1-token response
  CHECK(out.returns[4] == 0.0);                           // masked
  // Whitened over the 4 response tokens [0.94, 0.96, 0.97, 9.95]: mean 3.205.
  double mean = (0.94 + 0.96 + 0.97 + 9.95) / 4, var = 0;
  for (double a : {0.94, 0.96, 0.97, 9.95}) var += (a - mean) * (a - mean) / 4;
  CHECK(out.advantages[0] == doctest::Approx((0.94 - mean) / std::sqrt(var)).epsilon(1e-10));
  CHECK(out.advantages[3] == doctest::Approx((9.95 - mean) / std::sqrt(var)).epsilon(1e-10));
}

TEST_CASE("group estimators: group_norm, rloo, dr_grpo, reinforce_baseline") {
  // Two prompts × 4 samples; scores [1, 0, 0, 1] and [1, 1, 1, 1]; ragged lengths.
  const int32_t len[8] = {2, 1, 3, 2, 1, 2, 3, 3};
  const double score[8] = {1, 0, 0, 1, 1, 1, 1, 1};
  rl::AdvantageInput in;
  in.B = 8;
  in.Tr = 3;
  in.group_size = 4;
  in.resp_len = len;
  in.score = score;
  // group_norm: mean 0.5, unbiased std sqrt(1/3) → ±0.5·sqrt(3) = ±0.8660254; equal scores → 0.
  auto gn = rl::compute_advantages(in, AdvantageEstimator::kGroupNorm);
  CHECK(gn.shaped_score[0] == doctest::Approx(0.8660254038).epsilon(1e-9));
  CHECK(gn.shaped_score[1] == doctest::Approx(-0.8660254038).epsilon(1e-9));
  CHECK(gn.shaped_score[4] == 0.0);
  // Not whitened; with γ = 1 and no KL every response token carries s'.
  CHECK(gn.advantages[0 * 3 + 0] == doctest::Approx(0.8660254038).epsilon(1e-9));
  CHECK(gn.advantages[0 * 3 + 1] == doctest::Approx(0.8660254038).epsilon(1e-9));
  CHECK(gn.advantages[0 * 3 + 2] == 0.0);  // beyond the 2-token response
  CHECK(gn.advantages[2 * 3 + 2] == doctest::Approx(-0.8660254038).epsilon(1e-9));
  // rloo: 1 − (2 − 1)/3 = 2/3; 0 − 2/3.
  auto rl = rl::compute_advantages(in, AdvantageEstimator::kRloo);
  CHECK(rl.shaped_score[0] == doctest::Approx(2.0 / 3));
  CHECK(rl.shaped_score[1] == doctest::Approx(-2.0 / 3));
  // dr_grpo: ±0.5, no std division.
  auto dr = rl::compute_advantages(in, AdvantageEstimator::kDrGrpo);
  CHECK(dr.shaped_score[0] == doctest::Approx(0.5));
  CHECK(dr.shaped_score[2] == doctest::Approx(-0.5));
  // reinforce_baseline: the same baseline, then whitened over the batch.
  auto rb = rl::compute_advantages(in, AdvantageEstimator::kReinforceBaseline);
  CHECK(rb.returns[0] == doctest::Approx(0.5));
  double s = 0, c = 0;
  for (int i = 0; i < 8; ++i)
    for (int t = 0; t < len[i]; ++t) {
      s += rb.advantages[size_t(i * 3 + t)];
      c += 1;
    }
  CHECK(s / c == doctest::Approx(0.0).epsilon(1e-12));  // whitened: zero mean
}

TEST_CASE("advantages: bad configurations are clear errors") {
  const int32_t len[2] = {1, 1};
  const double score[2] = {1, 0};
  rl::AdvantageInput in;
  in.B = 2;
  in.Tr = 1;
  in.resp_len = len;
  in.score = score;
  in.group_size = 1;
  auto err = [&](AdvantageEstimator e) {
    try {
      rl::compute_advantages(in, e);
    } catch (const rlhf::Error& x) {
      return std::string(x.what());
    }
    return std::string();
  };
  CHECK(err(AdvantageEstimator::kGroupNorm).find("--n_samples_per_prompt > 1") !=
        std::string::npos);
  CHECK(err(AdvantageEstimator::kGae).find("critic") != std::string::npos);
  in.group_size = 3;
  CHECK(err(AdvantageEstimator::kRloo).find("whole groups") != std::string::npos);
  CHECK_THROWS_AS(rl::advantage_estimator_from_string("ppo"), rlhf::Error);
}

TEST_CASE("adaptive KL controller (Ziegler et al. 2019)") {
  rl::KlController fixed(0.05, 0.0, 10000);
  fixed.update(1.0, 128);
  CHECK(fixed.value() == 0.05);
  rl::KlController kl(0.1, 6.0, 10000);
  kl.update(12.0, 100);  // error clipped to +0.2 → β·(1 + 0.2·100/10000) = 0.1002
  CHECK(kl.value() == doctest::Approx(0.1002).epsilon(1e-12));
  kl.update(3.0, 100);  // error −0.5 → clipped −0.2 → β·(1 − 0.002)
  CHECK(kl.value() == doctest::Approx(0.1002 * 0.998).epsilon(1e-12));
}

TEST_CASE("multi-turn mask: observation tokens are skipped, hand-computed GAE") {
  // One sample of 5 response tokens: action, action, observation, observation, action; score 1;
  // V = [0.5, 0.4, 9, 9, 0.3] (the observation values must be ignored). Over the action tokens
  // this is the 3-token case above: δ = [−0.1, −0.1, 0.7], A = [0.5, 0.6, 0.7], R = [1, 1, 1];
  // the observation tokens get 0.
  const int32_t len[1] = {5};
  const double score[1] = {1.0};
  const double V[5] = {0.5, 0.4, 9.0, 9.0, 0.3};
  const uint8_t mask[5] = {1, 1, 0, 0, 1};
  rl::AdvantageInput in;
  in.B = 1;
  in.Tr = 5;
  in.resp_len = len;
  in.score = score;
  in.values = V;
  in.mask = mask;
  const auto out = rl::compute_advantages(in, AdvantageEstimator::kGae);
  const double R[5] = {1, 1, 0, 0, 1};
  const double A[5] = {-1.224744871, 0, 0, 0, 1.224744871};  // whitened over the 3 actions
  for (int t = 0; t < 5; ++t) {
    CHECK(out.returns[size_t(t)] == doctest::Approx(R[t]));
    CHECK(out.advantages[size_t(t)] == doctest::Approx(A[t]).epsilon(1e-7));
  }
  CHECK(out.reward[4] == 1.0);  // the score lands on the last action token
  CHECK(out.reward[2] == 0.0);

  // group_norm over 2 samples: every action token carries its sample's advantage, ±0.7071.
  const int32_t len2[2] = {4, 3};
  const double score2[2] = {1.0, 0.0};
  const uint8_t mask2[8] = {1, 0, 0, 1, 1, 1, 1, 0};
  rl::AdvantageInput g;
  g.B = 2;
  g.Tr = 4;
  g.group_size = 2;
  g.resp_len = len2;
  g.score = score2;
  g.mask = mask2;
  const auto go = rl::compute_advantages(g, AdvantageEstimator::kGroupNorm);
  const double want[8] = {0.7071067, 0, 0, 0.7071067, -0.7071067, -0.7071067, -0.7071067, 0};
  for (int k = 0; k < 8; ++k)
    CHECK(go.advantages[size_t(k)] == doctest::Approx(want[k]).epsilon(1e-6));
}
