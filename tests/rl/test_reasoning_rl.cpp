// The reasoning-RL additions against closed forms: GSPO's sequence ratio, loss and gradient (and a
// finite difference of the sequence-level objective), the loss aggregation weights, DAPO's
// overlong penalty at its breakpoints, group_norm without the std, and pass@k.
#include <cmath>
#include <vector>

#include "core/error.h"
#include "rl/advantages.h"
#include "rl/evaluate.h"
#include "rl/losses.h"
#include "rl/rewards.h"
#include "tests/test_util.h"

using namespace rlhf;

TEST_CASE("gspo: the sequence ratio, its clip, and the per-token gradient s_i·A") {
  // Two sequences: tokens 0..2 (seq 0), a padding position, tokens 4..5 (seq 1).
  const std::vector<double> lp = {-1.0, -2.0, -0.5, 0.0, -1.5, -0.8};
  const std::vector<double> lp_old = {-1.1, -1.9, -0.8, 0.0, -1.0, -0.5};
  const std::vector<double> adv = {1.0, 1.0, 1.0, 0.0, -2.0, -2.0};
  const std::vector<int32_t> seq = {0, 0, 0, -1, 1, 1};
  const double s0 = std::exp((0.1 - 0.1 + 0.3) / 3.0), s1 = std::exp((-0.5 - 0.3) / 2.0);
  std::vector<double> loss(6), ratio(2), dlp(6), w(6, 0.5);
  std::vector<uint8_t> clipped(6);
  rl::gspo_loss_forward_cpu(loss.data(), clipped.data(), ratio.data(), lp.data(), lp_old.data(),
                            adv.data(), seq.data(), 6, 2, 0.2, 0.2);
  CHECK(ratio[0] == doctest::Approx(s0).epsilon(1e-12));  // 1.105: inside [0.8, 1.2]
  CHECK(ratio[1] == doctest::Approx(s1).epsilon(1e-12));  // 0.670: below 0.8, A < 0 → clipped
  for (int t : {0, 1, 2}) {
    CHECK(loss[size_t(t)] == doctest::Approx(-s0).epsilon(1e-12));
    CHECK(clipped[size_t(t)] == 0);
  }
  CHECK(loss[3] == 0.0);
  // seq 1: −min(s·A, clip(s)·A) = −min(−1.34, −1.6) = 1.6, the clipped branch (no gradient).
  CHECK(loss[4] == doctest::Approx(-0.8 * -2.0).epsilon(1e-12));
  CHECK(clipped[4] == 1);
  rl::gspo_loss_backward_cpu(dlp.data(), w.data(), lp.data(), lp_old.data(), adv.data(), seq.data(),
                             6, 2, 0.2, 0.2);
  for (int t : {0, 1, 2}) CHECK(dlp[size_t(t)] == doctest::Approx(0.5 * -s0 * 1.0).epsilon(1e-12));
  for (int t : {3, 4, 5}) CHECK(dlp[size_t(t)] == 0.0);
}

TEST_CASE("gspo: gradient = finite difference of the seq-mean-token-mean objective") {
  // Unclipped region (eps large): L = −Σ_i (1/|y_i|)·Σ_{t∈i} s_{i,t}·A_i / N_seq, whose value is
  // −Σ_i s_i·A_i / N_seq and whose gradient the token trick gives as −s_i·A_i/(N_seq·|y_i|): the
  // same as d/dlp_t of −s_i·A_i/N_seq with s_i = exp(mean_t (lp − lp_old)).
  std::vector<double> lp = {-1.0, -2.0, -0.5, -1.2, -0.7};
  const std::vector<double> lp_old = {-1.1, -1.9, -0.8, -1.0, -0.5};
  const std::vector<double> adv = {0.7, 0.7, 0.7, -0.4, -0.4};
  const std::vector<int32_t> seq = {0, 0, 0, 1, 1};
  const int64_t len[2] = {3, 2};
  auto objective = [&](const std::vector<double>& x) {
    double L = 0;
    for (int i = 0; i < 2; ++i) {
      double m = 0;
      for (int t = 0; t < 5; ++t)
        if (seq[size_t(t)] == i) m += (x[size_t(t)] - lp_old[size_t(t)]) / double(len[i]);
      L += -std::exp(m) * (i == 0 ? 0.7 : -0.4) / 2.0;
    }
    return L;
  };
  std::vector<double> w(5), dlp(5);
  for (int t = 0; t < 5; ++t)
    w[size_t(t)] =
        rl::loss_agg_weight(rl::LossAggMode::kSeqMeanTokenMean, len[seq[size_t(t)]], 5, 2, 0);
  rl::gspo_loss_backward_cpu(dlp.data(), w.data(), lp.data(), lp_old.data(), adv.data(), seq.data(),
                             5, 2, 10.0, 10.0);
  for (int t = 0; t < 5; ++t) {
    const double h = 1e-6;
    std::vector<double> a = lp, b = lp;
    a[size_t(t)] += h;
    b[size_t(t)] -= h;
    const double fd = (objective(a) - objective(b)) / (2 * h);
    CHECK(dlp[size_t(t)] == doctest::Approx(fd).epsilon(1e-7));
  }
}

TEST_CASE("loss aggregation weights (veRL's modes)") {
  using rl::LossAggMode;
  // A step of 3 sequences of 2, 3, 5 tokens (10 tokens), L_max 8.
  CHECK(rl::loss_agg_weight(LossAggMode::kTokenMean, 3, 10, 3, 8) == doctest::Approx(0.1));
  CHECK(rl::loss_agg_weight(LossAggMode::kSeqMeanTokenMean, 5, 10, 3, 8) ==
        doctest::Approx(1.0 / 15.0));
  CHECK(rl::loss_agg_weight(LossAggMode::kSeqMeanTokenSum, 5, 10, 3, 8) ==
        doctest::Approx(1.0 / 3.0));
  CHECK(rl::loss_agg_weight(LossAggMode::kSeqMeanTokenSumNorm, 5, 10, 3, 8) ==
        doctest::Approx(1.0 / 24.0));
  // seq-mean-token-mean sums to 1 over the step: every sequence weighs the same.
  double total = 0;
  for (int64_t L : {2, 3, 5})
    total += double(L) * rl::loss_agg_weight(LossAggMode::kSeqMeanTokenMean, L, 10, 3, 8);
  CHECK(total == doctest::Approx(1.0));
  CHECK(rl::loss_agg_mode_from_string("seq-mean-token-sum-norm") ==
        LossAggMode::kSeqMeanTokenSumNorm);
  CHECK_THROWS_WITH(rl::loss_agg_mode_from_string("mean"), doctest::Contains("--loss_agg_mode"));
  CHECK_THROWS_WITH(rl::policy_loss_type_from_string("grpo"),
                    doctest::Contains("--policy_loss_type"));
}

TEST_CASE("DAPO overlong penalty (eq. 13) at its breakpoints") {
  // L_max = 100, L_c = 20, f = 1: no penalty up to 80, linear to −1 at 100, −1 beyond.
  CHECK(rl::overlong_penalty(50, 100, 20, 1.0) == 0.0);
  CHECK(rl::overlong_penalty(80, 100, 20, 1.0) == 0.0);
  CHECK(rl::overlong_penalty(90, 100, 20, 1.0) == doctest::Approx(-0.5));
  CHECK(rl::overlong_penalty(100, 100, 20, 1.0) == doctest::Approx(-1.0));
  CHECK(rl::overlong_penalty(101, 100, 20, 1.0) == -1.0);
  CHECK(rl::overlong_penalty(95, 100, 20, 0.5) == doctest::Approx(-0.375));
  CHECK(rl::overlong_penalty(100, 100, 0, 1.0) == 0.0);  // off
  CHECK_THROWS_WITH(rl::overlong_penalty(1, 100, 100, 1.0),
                    doctest::Contains("--overlong_buffer_len"));
}

TEST_CASE("group_norm without the std (--no_advantage_std_norm) equals dr_grpo") {
  const std::vector<double> score = {1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0, 1.0};
  const std::vector<int32_t> len(8, 2);
  auto run = [&](rl::AdvantageEstimator e, bool std_norm) {
    rl::AdvantageInput in;
    in.B = 8;
    in.Tr = 2;
    in.group_size = 4;
    in.resp_len = len.data();
    in.score = score.data();
    in.std_norm = std_norm;
    return rl::compute_advantages(in, e).advantages;
  };
  const auto a = run(rl::AdvantageEstimator::kGroupNorm, false);
  const auto b = run(rl::AdvantageEstimator::kDrGrpo, true);
  CHECK(a == b);
  CHECK(a[0] == doctest::Approx(0.5));     // 1 − mean(1, 0, 0, 1)
  CHECK(a[12] == doctest::Approx(-0.75));  // 0 − mean(1, 1, 0, 1)
  CHECK(run(rl::AdvantageEstimator::kGroupNorm, true)[0] != a[0]);
}

TEST_CASE("pass@k, unbiased (Chen et al. 2021) and the evaluation summary") {
  CHECK(rl::pass_at_k(4, 1, 1) == doctest::Approx(0.25));
  CHECK(rl::pass_at_k(4, 1, 2) == doctest::Approx(0.5));        // 1 − C(3,2)/C(4,2) = 1 − 3/6
  CHECK(rl::pass_at_k(4, 2, 2) == doctest::Approx(5.0 / 6.0));  // 1 − C(2,2)/C(4,2)
  CHECK(rl::pass_at_k(4, 1, 4) == 1.0);
  CHECK(rl::pass_at_k(4, 0, 4) == 0.0);
  CHECK_THROWS_AS(rl::pass_at_k(4, 5, 1), Error);
  // 2 prompts × 4 samples: prompt 0 has 1 correct (and a 0.1 format credit), prompt 1 has 4.
  std::vector<rollout::Sample> s(8);
  for (int i = 0; i < 8; ++i) {
    s[size_t(i)].prompt_pos = i / 4;
    s[size_t(i)].sample_index = i % 4;
    s[size_t(i)].response.assign(size_t(i + 1), 7);
    s[size_t(i)].stopped = i % 2 == 0;
  }
  const std::vector<double> sc = {1.0, 0.1, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0};
  const rl::EvalSummary e = rl::summarize_eval(s, sc, 4);
  CHECK(e.prompts == 2);
  CHECK(e.accuracy == doctest::Approx(5.0 / 8.0));
  CHECK(e.pass_at.at(1) == doctest::Approx(e.accuracy));
  CHECK(e.pass_at.at(2) == doctest::Approx((0.5 + 1.0) / 2.0));
  CHECK(e.pass_at.at(4) == doctest::Approx(1.0));
  CHECK(e.reward_mean == doctest::Approx(5.1 / 8.0));
  CHECK(e.response_length_mean == doctest::Approx(4.5));
  CHECK(e.stop_fraction == doctest::Approx(0.5));
  const auto j = e.to_json("eval_");
  CHECK(j.at("eval_pass@4") == 1.0);
}
