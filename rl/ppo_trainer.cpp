#include "rl/ppo_trainer.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "core/error.h"
#include "rl/token_budget.h"

namespace rlhf::rl {

void RunningMoments::update(const std::vector<double>& xs) {
  if (xs.empty()) return;
  double n = double(xs.size()), mean_b = 0, m2_b = 0;
  for (double x : xs) mean_b += x;
  mean_b /= n;
  for (double x : xs) m2_b += (x - mean_b) * (x - mean_b);
  const double delta = mean_b - mean, total = count + n;
  mean += delta * n / total;
  m2 += m2_b + delta * delta * count * n / total;
  count = total;
}

double RunningMoments::std() const {
  return count > 1 ? std::sqrt(m2 / (count - 1)) : 1.0;
}

PpoTrainer::PpoTrainer(const PpoModels& models, const PpoOptions& options,
                       const PpoOptimizers& optimizers, parallel::Comm& train_comm)
    : m_(models),
      opt_(options),
      comm_(train_comm),
      kl_(options.init_kl_coef, options.kl_target, options.kl_horizon) {
  RLHF_CHECK(m_.actor != nullptr, "PPO needs an actor");
  RLHF_CHECK(!uses_critic(opt_.estimator) || m_.critic != nullptr,
             "--advantage_estimator gae needs a critic");
  RLHF_CHECK(opt_.init_kl_coef <= 0 || m_.ref != nullptr,
             "a KL term (--init_kl_coef > 0) needs the reference model");
  if (opt_.policy_loss == PolicyLossType::kGspo) {
    // GSPO's ratio is per sequence, so its advantage must be one number per sequence.
    RLHF_CHECK(opt_.estimator == AdvantageEstimator::kGroupNorm ||
                   opt_.estimator == AdvantageEstimator::kDrGrpo ||
                   opt_.estimator == AdvantageEstimator::kRloo,
               "--policy_loss_type gspo needs a sequence-level advantage: --advantage_estimator "
               "group_norm, dr_grpo or rloo, not {}",
               to_string(opt_.estimator));
    RLHF_CHECK(opt_.use_kl_loss || opt_.init_kl_coef <= 0,
               "--policy_loss_type gspo: a KL penalty in the reward makes the advantage vary "
               "along the sequence\nhint: add --use_kl_loss, or set --init_kl_coef 0");
  }
  RLHF_CHECK(
      opt_.is_correction != IsCorrection::kDecoupled || opt_.policy_loss == PolicyLossType::kPpo,
      "--use_decoupled_loss needs --policy_loss_type ppo (token ratios)");
  RLHF_CHECK(!opt_.dynamic_batch || (opt_.train_max_tokens >= 1 && opt_.rollout_max_tokens >= 1),
             "--use_dynamic_batch needs --train_max_tokens_per_gpu and "
             "--rollout_max_tokens_per_gpu >= 1");
  actor_opt_ = std::make_unique<Optimizer>(m_.actor->store(), optimizers.actor_adam,
                                           optimizers.actor_schedule, opt_.max_norm);
  if (m_.critic && uses_critic(opt_.estimator))
    critic_opt_ = std::make_unique<Optimizer>(m_.critic->store(), optimizers.critic_adam,
                                              optimizers.critic_schedule, opt_.max_norm);
}

PpoTrainer::Batch PpoTrainer::make_batch(const std::vector<const Sample*>& s) const {
  Batch b;
  b.n = int64_t(s.size());
  int64_t longest = 0, total = 0;
  for (const Sample* x : s) {
    const int64_t len = int64_t(x->prompt.size() + x->response.size());
    longest = std::max(longest, len);
    total += len;
  }
  // Padded: sample r in row r; packed: every sample end to end in one row.
  b.B = opt_.packing ? 1 : b.n;
  const int64_t m = std::max<int64_t>(1, opt_.pad_multiple);
  b.T = opt_.packing ? total : (longest + m - 1) / m * m;
  b.tokens.assign(size_t(b.B * b.T), opt_.pad_id);
  b.targets.assign(size_t(b.B * b.T), -1);
  if (opt_.packing) b.cu.push_back(0);
  int64_t at = 0;
  for (int64_t r = 0; r < b.n; ++r) {
    const Sample& x = *s[size_t(r)];
    const int64_t P = int64_t(x.prompt.size()), R = int64_t(x.response.size());
    RLHF_ASSERT(P >= 1);
    const int64_t o = opt_.packing ? at : r * b.T;
    std::copy(x.prompt.begin(), x.prompt.end(), b.tokens.begin() + o);
    std::copy(x.response.begin(), x.response.end(), b.tokens.begin() + o + P);
    // Response token k is predicted at position P − 1 + k.
    for (int64_t k = 0; k < R; ++k) b.targets[size_t(o + P - 1 + k)] = x.response[size_t(k)];
    b.resp_pos.push_back(o + P - 1);
    b.start.push_back(o);
    at += P + R;
    if (opt_.packing) b.cu.push_back(int32_t(at));
  }
  return b;
}

std::vector<float> PpoTrainer::allgather_rows(const std::vector<float>& local) {
  std::vector<float> all(size_t(comm_.size()) * local.size());
  comm_.all_gather(local.data(), all.data(), int64_t(local.size()));
  return all;
}

std::vector<std::pair<int64_t, int64_t>> PpoTrainer::rank_micro_batches(
    const std::vector<const Sample*>& all, int64_t count, int64_t budget) const {
  const int64_t N = comm_.size(), per = int64_t(all.size()) / N;
  if (!opt_.dynamic_batch) return count_runs(per, count);
  // Every rank holds every rank's samples: each computes the others' cut, and all take as many
  // micro-batches as the rank that needs the most.
  auto lengths = [&](int64_t rank) {
    std::vector<int64_t> len;
    for (int64_t i = rank * per; i < (rank + 1) * per; ++i)
      len.push_back(int64_t(all[size_t(i)]->prompt.size() + all[size_t(i)]->response.size()));
    return len;
  };
  int64_t most = 1;
  for (int64_t r = 0; r < N; ++r)
    most = std::max<int64_t>(
        most, int64_t(token_budget_runs(lengths(r), budget, 1, opt_.packing).size()));
  return token_budget_runs(lengths(comm_.rank()), budget, most, opt_.packing);
}

std::vector<PpoTrainer::Batch> PpoTrainer::rollout_micro_batches(
    const std::vector<Sample>& samples) const {
  const int64_t per = int64_t(samples.size()) / comm_.size(), first = comm_.rank() * per;
  std::vector<const Sample*> all;
  for (const Sample& x : samples) all.push_back(&x);
  std::vector<Batch> batches;
  for (const auto& [a, b] :
       rank_micro_batches(all, opt_.micro_rollout_batch_size, opt_.rollout_max_tokens)) {
    std::vector<const Sample*> mb;
    for (int64_t i = a; i < b; ++i) mb.push_back(&samples[size_t(first + i)]);
    batches.push_back(make_batch(mb));
    batches.back().first = a;
  }
  return batches;
}

std::vector<parallel::ForwardBatch> PpoTrainer::forward_batches(const std::vector<Batch>& batches,
                                                                std::vector<float>& out) {
  int64_t total = 0;
  for (const Batch& b : batches) total += b.B * b.T;
  out.assign(size_t(total), 0.0f);
  std::vector<parallel::ForwardBatch> fb;
  int64_t at = 0;
  for (const Batch& b : batches) {
    fb.push_back({b.tokens.data(), b.targets.data(), b.B, b.T, out.data() + at, b.seqs()});
    at += b.B * b.T;
  }
  return fb;
}

std::vector<double> PpoTrainer::reward_model_scores(const std::vector<Sample>& samples) {
  RLHF_CHECK(m_.reward != nullptr, "reward model scores need --reward_pretrain");
  const int64_t B = int64_t(samples.size()), N = comm_.size();
  RLHF_CHECK(B % N == 0, "{} samples do not split over {} training ranks", B, N);
  const int64_t per = B / N, first = comm_.rank() * per;
  std::vector<Batch> batches = rollout_micro_batches(samples);
  std::vector<float> values;
  m_.reward->forward_scalar_sweep(forward_batches(batches, values));
  std::vector<float> local(static_cast<size_t>(per));
  int64_t at = 0;
  for (const Batch& b : batches) {
    for (int64_t r = 0; r < b.n; ++r) {
      const Sample& x = samples[size_t(first + b.first + r)];
      const int64_t last = b.start[size_t(r)] + int64_t(x.prompt.size() + x.response.size()) - 1;
      local[size_t(b.first + r)] = values[size_t(at + last)];
    }
    at += b.B * b.T;
  }
  const auto all = allgather_rows(local);
  return std::vector<double>(all.begin(), all.end());
}

bool PpoTrainer::old_logprobs_are_current(int64_t B) const {
  const bool kl_in_reward = !opt_.use_kl_loss && kl_.value() > 0;
  return opt_.max_epochs == 1 && opt_.train_batch_size == B && opt_.freezing_actor_steps <= 0 &&
         !kl_in_reward;
}

Experience PpoTrainer::make_experience(const std::vector<Sample>& samples,
                                       std::vector<double> scores) {
  Experience e;
  e.B = int64_t(samples.size());
  RLHF_CHECK(int64_t(scores.size()) == e.B, "{} scores for {} samples", scores.size(), e.B);
  const int64_t N = comm_.size();
  RLHF_CHECK(e.B % N == 0,
             "{} samples do not split over {} training ranks\nhint: make "
             "--rollout_batch_size x --n_samples_per_prompt a multiple of the training ranks",
             e.B, N);
  bool multi_turn = false;
  for (const Sample& s : samples) {
    e.samples.push_back(&s);
    e.resp_len.push_back(int32_t(s.response.size()));
    e.act_len.push_back(int32_t(rollout::action_tokens(s)));
    e.Tr = std::max<int64_t>(e.Tr, int64_t(s.response.size()));
    multi_turn = multi_turn || !s.action_mask.empty();
  }
  RLHF_CHECK(e.Tr >= 1, "every response of the step is empty");
  // The engine's log-probs, when every sample carries them (one per response token).
  bool have_rol = true;
  for (const Sample& s : samples) have_rol = have_rol && s.gen_logprobs.size() == s.response.size();
  RLHF_CHECK(have_rol || opt_.is_correction == IsCorrection::kNone,
             "the off-policy correction (--enable_vllm_is_correction, --use_decoupled_loss) needs "
             "the engine's log-prob of every response token, and a sample has none");
  if (have_rol) {
    e.lp_rol.assign(size_t(e.B * e.Tr), 0.0f);
    for (int64_t i = 0; i < e.B; ++i)
      std::copy(samples[size_t(i)].gen_logprobs.begin(), samples[size_t(i)].gen_logprobs.end(),
                e.lp_rol.begin() + i * e.Tr);
  }
  if (multi_turn) {  // observation tokens are context: mask 0
    e.mask.assign(size_t(e.B * e.Tr), 0);
    for (int64_t i = 0; i < e.B; ++i)
      for (size_t t = 0; t < samples[size_t(i)].response.size(); ++t)
        e.mask[size_t(i * e.Tr) + t] = rollout::is_action(samples[size_t(i)], t) ? 1 : 0;
  }
  e.lp_old_is_current = opt_.skip_current_old_logprobs && old_logprobs_are_current(e.B);
  // Old / reference log-probs and values of this rank's slice.
  const int64_t per = e.B / N, first = comm_.rank() * per, Tr = e.Tr;
  std::vector<float> lp_old(size_t(per * Tr), 0.0f), lp_ref(size_t(per * Tr), 0.0f),
      values(size_t(per * Tr), 0.0f);
  const float inv_temp = float(1.0 / std::max(opt_.temperature, 1e-6));
  // Each pass is one sweep over this rank's micro-batches: each unit is gathered once.
  std::vector<Batch> batches = rollout_micro_batches(samples);
  std::vector<float> pass_out;
  auto scatter = [&](std::vector<float>& dst) {
    int64_t at = 0;
    for (const Batch& b : batches) {
      for (int64_t r = 0; r < b.n; ++r) {
        const Sample& x = samples[size_t(first + b.first + r)];
        for (size_t k = 0; k < x.response.size(); ++k)
          dst[size_t((b.first + r) * Tr + int64_t(k))] =
              pass_out[size_t(at + b.resp_pos[size_t(r)] + int64_t(k))];
      }
      at += b.B * b.T;
    }
  };
  if (!e.lp_old_is_current) {
    m_.actor->forward_lm_sweep(forward_batches(batches, pass_out), inv_temp);
    scatter(lp_old);
  }
  if (m_.ref) {
    m_.ref->forward_lm_sweep(forward_batches(batches, pass_out), inv_temp);
    scatter(lp_ref);
  }
  if (m_.critic && uses_critic(opt_.estimator)) {
    m_.critic->forward_scalar_sweep(forward_batches(batches, pass_out));
    scatter(values);
  }
  e.lp_old =
      e.lp_old_is_current ? std::vector<float>(size_t(e.B * Tr), 0.0f) : allgather_rows(lp_old);
  e.lp_ref = m_.ref ? allgather_rows(lp_ref) : e.lp_old;
  e.values = uses_critic(opt_.estimator) ? allgather_rows(values)
                                         : std::vector<float>(size_t(e.B * Tr), 0.0f);
  // Per-token KL estimate of π_old against π_ref (by train() when lp_old is the update's own).
  e.kl.assign(size_t(e.B * Tr), 0.0f);
  if (!e.lp_old_is_current)
    rl::kl_forward_cpu(e.kl.data(), e.lp_old.data(), e.lp_ref.data(), e.B * Tr, opt_.kl_estimator);
  for (int64_t i = 0; i < e.B; ++i)
    for (int64_t t = 0; t < Tr; ++t)
      if (!e.is_action(i, t)) e.kl[size_t(i * Tr + t)] = 0.0f;
  // Scores: optional running normalisation.
  if (opt_.normalize_reward) {
    reward_moments_.update(scores);
    const double sd = std::max(reward_moments_.std(), 1e-8);
    for (double& s : scores) s = (s - reward_moments_.mean) / sd;
  }
  e.score = scores;
  // Advantages on the whole batch (identical on every rank).
  std::vector<double> kl_d(e.kl.begin(), e.kl.end()), v_d(e.values.begin(), e.values.end());
  AdvantageInput in;
  in.B = e.B;
  in.Tr = Tr;
  in.group_size = opt_.n_samples_per_prompt;
  in.resp_len = e.resp_len.data();
  in.score = e.score.data();
  const bool kl_in_reward = !opt_.use_kl_loss && kl_.value() > 0;
  in.kl = kl_in_reward ? kl_d.data() : nullptr;
  in.kl_coef = kl_.value();
  in.values = uses_critic(opt_.estimator) ? v_d.data() : nullptr;
  in.gamma = opt_.gamma;
  in.lambd = opt_.lambd;
  in.std_norm = opt_.advantage_std_norm;
  in.mask = e.mask.empty() ? nullptr : e.mask.data();
  const AdvantageOutput out = compute_advantages(in, opt_.estimator);
  e.advantages.assign(out.advantages.begin(), out.advantages.end());
  e.returns.assign(out.returns.begin(), out.returns.end());
  return e;
}

PpoTrainer::MicroBatch PpoTrainer::micro_batch(const Experience& e, const std::vector<int64_t>& ids,
                                               int64_t step_tokens) const {
  std::vector<const Sample*> samples;
  for (int64_t i : ids) samples.push_back(e.samples[size_t(i)]);
  MicroBatch mb;
  mb.b = make_batch(samples);
  const size_t NT = size_t(mb.b.B * mb.b.T);
  for (auto* v :
       {&mb.old_lp, &mb.ref_lp, &mb.rol_lp, &mb.adv, &mb.ret, &mb.vold, &mb.weight, &mb.weight_tok})
    v->assign(NT, 0.0f);
  mb.seq.assign(NT, -1);
  const double w_tok = 1.0 / double(std::max<int64_t>(step_tokens, 1));
  for (int64_t r = 0; r < mb.b.n; ++r) {
    const int64_t i = ids[size_t(r)], len = e.resp_len[size_t(i)];
    // Per-sequence aggregation counts the sequence's action tokens (observations are context).
    const double w = loss_agg_weight(opt_.loss_agg_mode, e.act_len[size_t(i)], step_tokens,
                                     opt_.train_batch_size, opt_.generate_max_len);
    for (int64_t k = 0; k < len; ++k) {
      if (!e.is_action(i, k)) continue;  // an observation token: no loss, no KL, no entropy
      const size_t p = size_t(mb.b.resp_pos[size_t(r)] + k), q = size_t(i * e.Tr + k);
      mb.old_lp[p] = e.lp_old[q];
      mb.ref_lp[p] = e.lp_ref[q];
      if (!e.lp_rol.empty()) mb.rol_lp[p] = e.lp_rol[q];
      mb.adv[p] = e.advantages[q];
      mb.ret[p] = e.returns[q];
      mb.vold[p] = e.values[q];
      mb.weight[p] = float(w);
      mb.weight_tok[p] = float(w_tok);
      mb.seq[p] = int32_t(r);
      mb.tok_pos.push_back(int64_t(p));
    }
  }
  return mb;
}

void PpoTrainer::actor_micro_batch(MicroBatch& mb, bool current, bool mismatch, Sums& sums) {
  const Batch& b = mb.b;
  const int64_t NT = b.B * b.T;
  const float inv_temp = float(1.0 / std::max(opt_.temperature, 1e-6));
  const bool with_ent = opt_.entropy_loss_coef != 0;
  std::vector<float> lp(size_t(NT), 0.0f), ent(size_t(NT), 0.0f), dlp(size_t(NT), 0.0f);
  m_.actor->forward_lm(b.tokens.data(), b.targets.data(), b.B, b.T, lp.data(), ent.data(), true,
                       inv_temp, b.seqs());
  if (current) {  // lp_old = sg[lp]: the policy that generated the batch, not yet updated
    std::vector<float> kl_cur(size_t(NT), 0.0f);
    if (m_.ref) kl_forward_cpu(kl_cur.data(), lp.data(), mb.ref_lp.data(), NT, opt_.kl_estimator);
    for (int64_t p : mb.tok_pos) {
      mb.old_lp[size_t(p)] = lp[size_t(p)];
      sums.kl_current += kl_cur[size_t(p)];
    }
  }
  // Behaviour weights (sg: they depend on lp_old and lp_rol only) on the policy term's weights.
  const IsCorrection corr = token_correction();
  std::vector<float> isw(size_t(NT), 1.0f), wpol(mb.weight);
  std::vector<uint8_t> is_masked(size_t(NT), 0);
  if (corr != IsCorrection::kNone) {
    is_weights_cpu(isw.data(), is_masked.data(), mb.old_lp.data(), mb.rol_lp.data(), mb.seq.data(),
                   NT, b.n, corr, opt_.is_lo, opt_.is_hi);
    for (int64_t p : mb.tok_pos) wpol[size_t(p)] *= isw[size_t(p)];
  }
  if (current && mismatch)  // lp_old exists only here: the step's mismatch metrics
    for (int64_t p : mb.tok_pos)
      sums.mismatch.add(mb.old_lp[size_t(p)], mb.rol_lp[size_t(p)], isw[size_t(p)],
                        is_masked[size_t(p)] != 0);
  // GSPO with the correction (OpenRLHF): its sequence ratio is taken against the engine's lp_rol.
  const bool gspo_rol =
      opt_.policy_loss == PolicyLossType::kGspo && opt_.is_correction != IsCorrection::kNone;
  const float* lp_base = gspo_rol ? mb.rol_lp.data() : mb.old_lp.data();
  std::vector<float> tok_loss(size_t(NT), 0.0f);
  std::vector<uint8_t> clipped(size_t(NT), 0);
  if (opt_.policy_loss == PolicyLossType::kGspo) {
    gspo_loss_forward_cpu(tok_loss.data(), clipped.data(), (float*)nullptr, lp.data(), lp_base,
                          mb.adv.data(), mb.seq.data(), NT, b.n, opt_.eps_clip_low,
                          opt_.eps_clip_high);
    gspo_loss_backward_cpu(dlp.data(), wpol.data(), lp.data(), lp_base, mb.adv.data(),
                           mb.seq.data(), NT, b.n, opt_.eps_clip_low, opt_.eps_clip_high);
  } else {
    ppo_clip_loss_forward_cpu(tok_loss.data(), clipped.data(), (float*)nullptr, lp.data(),
                              mb.old_lp.data(), mb.adv.data(), NT, opt_.eps_clip_low,
                              opt_.eps_clip_high, opt_.dual_clip);
    ppo_clip_loss_backward_cpu(dlp.data(), wpol.data(), lp.data(), mb.old_lp.data(), mb.adv.data(),
                               NT, opt_.eps_clip_low, opt_.eps_clip_high, opt_.dual_clip);
  }
  std::vector<float> kl_tok(size_t(NT), 0.0f), dkl(size_t(NT), 0.0f);
  if (opt_.use_kl_loss && m_.ref) {
    kl_forward_cpu(kl_tok.data(), lp.data(), mb.ref_lp.data(), NT, opt_.kl_estimator);
    std::vector<float> wk(mb.weight);
    for (float& x : wk) x *= float(kl_.value());
    kl_backward_cpu(dkl.data(), wk.data(), lp.data(), mb.ref_lp.data(), NT, opt_.kl_estimator);
  }
  std::vector<float> dent(size_t(NT), 0.0f);
  for (int64_t p : mb.tok_pos) {
    const double w = mb.weight_tok[size_t(p)];  // metrics: token means of the step
    dlp[size_t(p)] += dkl[size_t(p)];
    if (with_ent) dent[size_t(p)] = float(-opt_.entropy_loss_coef * mb.weight[size_t(p)]);
    sums.policy += w * isw[size_t(p)] * tok_loss[size_t(p)];  // the corrected loss
    sums.kl_loss += w * kl_tok[size_t(p)];
    sums.entropy += w * ent[size_t(p)];
    sums.clip += w * clipped[size_t(p)];
    const double d = double(lp[size_t(p)]) - double(mb.old_lp[size_t(p)]);
    sums.approx_kl += w * (std::exp(-d) - 1.0 + d);
  }
  m_.actor->backward_lm(dlp.data(), with_ent ? dent.data() : nullptr);
}

void PpoTrainer::critic_micro_batch(const MicroBatch& mb, Sums& sums) {
  const Batch& b = mb.b;
  const int64_t NT = b.B * b.T;
  std::vector<float> v(size_t(NT), 0.0f), vl(size_t(NT), 0.0f), dv(size_t(NT), 0.0f);
  m_.critic->forward_scalar(b.tokens.data(), b.B, b.T, v.data(), true, b.seqs());
  value_loss_forward_cpu(vl.data(), (uint8_t*)nullptr, v.data(), mb.vold.data(), mb.ret.data(), NT,
                         opt_.value_clip);
  value_loss_backward_cpu(dv.data(), mb.weight_tok.data(), v.data(), mb.vold.data(), mb.ret.data(),
                          NT, opt_.value_clip);
  for (int64_t p : mb.tok_pos) sums.value += mb.weight_tok[size_t(p)] * vl[size_t(p)];
  m_.critic->backward_scalar(dv.data());
}

MismatchSums PpoTrainer::experience_mismatch(const Experience& e) const {
  MismatchSums mm;
  if (e.lp_rol.empty() || e.lp_old_is_current) return mm;
  const int64_t NT = e.B * e.Tr;
  std::vector<int32_t> row(size_t(NT), -1);
  for (int64_t i = 0; i < e.B; ++i)
    for (int64_t t = 0; t < e.Tr; ++t)
      if (e.is_action(i, t)) row[size_t(i * e.Tr + t)] = int32_t(i);
  std::vector<float> w(size_t(NT), 1.0f);
  std::vector<uint8_t> masked(size_t(NT), 0);
  if (token_correction() != IsCorrection::kNone)
    is_weights_cpu(w.data(), masked.data(), e.lp_old.data(), e.lp_rol.data(), row.data(), NT, e.B,
                   token_correction(), opt_.is_lo, opt_.is_hi);
  for (int64_t q = 0; q < NT; ++q)
    if (row[size_t(q)] >= 0)
      mm.add(e.lp_old[size_t(q)], e.lp_rol[size_t(q)], w[size_t(q)], masked[size_t(q)] != 0);
  return mm;
}

PpoStats PpoTrainer::train(const Experience& e, int64_t rl_step) {
  PpoStats st;
  const int64_t TB = opt_.train_batch_size, MB = opt_.micro_train_batch_size, N = comm_.size();
  RLHF_CHECK(e.B % TB == 0,
             "--rollout_batch_size x --n_samples_per_prompt = {} samples is not a multiple of "
             "--train_batch_size {}",
             e.B, TB);
  RLHF_CHECK(TB % (opt_.dynamic_batch ? N : MB * N) == 0,
             "--train_batch_size {} must be a multiple of --micro_train_batch_size {} x {} "
             "training rank(s)",
             TB, opt_.dynamic_batch ? 1 : MB, N);
  const bool train_actor = rl_step >= opt_.freezing_actor_steps;
  RLHF_ASSERT(!e.lp_old_is_current || (train_actor && opt_.max_epochs == 1 && TB == e.B));
  const bool train_critic = critic_opt_ != nullptr;
  const parallel::CommStats c0 = comm_.stats();
  Sums sums;
  double s_an = 0, s_cn = 0;
  int64_t n_opt = 0;
  for (int64_t epoch = 0; epoch < opt_.max_epochs; ++epoch) {
    std::vector<int64_t> order(static_cast<size_t>(e.B));
    std::iota(order.begin(), order.end(), 0);
    std::mt19937_64 rng(opt_.seed * 6364136223846793005ull + uint64_t(rl_step) * 1000003ull +
                        uint64_t(epoch));
    std::shuffle(order.begin(), order.end(), rng);
    for (int64_t s0 = 0; s0 < e.B; s0 += TB) {
      int64_t n_tok = 0;  // response tokens of this optimizer step, all ranks
      for (int64_t i = s0; i < s0 + TB; ++i) n_tok += e.act_len[size_t(order[size_t(i)])];
      if (train_actor) actor_opt_->zero_grad();
      if (train_critic) critic_opt_->zero_grad();
      const int64_t mine = s0 + comm_.rank() * (TB / N);
      std::vector<const Sample*> step_samples;  // every rank's, in training order
      for (int64_t i = s0; i < s0 + TB; ++i)
        step_samples.push_back(e.samples[size_t(order[size_t(i)])]);
      for (const auto& [a, b] : rank_micro_batches(step_samples, MB, opt_.train_max_tokens)) {
        const std::vector<int64_t> ids(order.begin() + mine + a, order.begin() + mine + b);
        MicroBatch mb = micro_batch(e, ids, n_tok);
        ++sums.micro_batches;
        if (train_actor) actor_micro_batch(mb, e.lp_old_is_current, !e.lp_rol.empty(), sums);
        if (train_critic) critic_micro_batch(mb, sums);
      }
      if (train_actor) {
        const Optimizer::StepResult r = actor_opt_->step();
        st.actor_lr = r.lr;
        s_an += r.grad_norm;
      }
      if (train_critic) {
        const Optimizer::StepResult r = critic_opt_->step();
        st.critic_lr = r.lr;
        s_cn += r.grad_norm;
      }
      ++n_opt;
    }
  }
  double local[7] = {sums.policy, sums.value,     sums.kl_loss,   sums.entropy,
                     sums.clip,   sums.approx_kl, sums.kl_current},
         tot[7];
  comm_.all_reduce(local, tot, 7);
  const double steps = double(std::max<int64_t>(n_opt, 1));
  st.policy_loss = tot[0] / steps;
  st.value_loss = tot[1] / steps;
  st.kl_loss = tot[2] / steps;
  st.entropy = tot[3] / steps;
  st.clip_frac = tot[4] / steps;
  st.approx_kl = tot[5] / steps;
  st.actor_grad_norm = s_an / steps;
  st.critic_grad_norm = s_cn / steps;
  st.optimizer_steps = n_opt;
  st.train_micro_batches = sums.micro_batches;
  // Mismatch metrics: of the experience's lp_old, or summed by the update's forward passes.
  MismatchSums mm = e.lp_old_is_current ? sums.mismatch : experience_mismatch(e);
  if (e.lp_old_is_current && !e.lp_rol.empty()) {
    double s6[6], m3[3], t6[6], t3[3];
    mm.pack(s6, m3);
    comm_.all_reduce(s6, t6, 6);
    comm_.all_reduce(m3, t3, 3, parallel::ReduceOp::kMax);
    mm.unpack(t6, t3);
  }
  st.mismatch = MismatchStats::from(mm);
  // KL(π_old ‖ π_ref) of the rollout: from the experience, or summed by the update's forward.
  double kl_sum = tot[6];
  if (!e.lp_old_is_current)
    for (int64_t i = 0; i < e.B; ++i)
      for (int64_t t = 0; t < e.resp_len[size_t(i)]; ++t) kl_sum += e.kl[size_t(i * e.Tr + t)];
  // (e.kl is 0 at observation tokens; the mean is over action tokens.)
  st.kl = kl_sum / double(std::max<int64_t>(e.response_tokens(), 1));
  st.kl_coef = kl_.value();
  st.comm_seconds = comm_.stats().seconds - c0.seconds;
  st.comm_bytes = comm_.stats().bytes - c0.bytes;
  // Adaptive KL (Ziegler et al.): after the step, with the rollout's mean KL.
  kl_.update(st.kl, double(e.B));
  return st;
}

}  // namespace rlhf::rl
