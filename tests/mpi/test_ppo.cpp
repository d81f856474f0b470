// One GRPO step and one PPO step (experience + updates) on N ranks give the same weights as on
// 1 rank: the 1-rank reference runs in-process on every rank (local stores over MPI_COMM_SELF),
// the N-rank run shards everything with ZeRO-3 over the world. Samples are synthetic and fixed,
// so generation plays no part.
#include "rl/ppo_trainer.h"

#include <mpi.h>

#include <functional>

#include "core/cuda_check.h"
#include "parallel/zero3.h"

#ifdef RLHF_CUDA
#include <cuda_runtime_api.h>

#include "parallel/zero3_cuda.h"
#endif
#include "tests/mpi/train_util.h"
#include "tests/ops/cuda_test_util.h"

using namespace rlhf;
using namespace rlhf::test;

namespace {

// 4 prompts × 4 samples with ragged prompt and response lengths; scores 0/1 with variety.
std::vector<rollout::Sample> synthetic_samples(int64_t V) {
  std::vector<rollout::Sample> s;
  auto toks = test::random_tokens(4096, V, 77);
  size_t k = 0;
  for (int64_t p = 0; p < 4; ++p)
    for (int64_t j = 0; j < 4; ++j) {
      rollout::Sample x;
      x.prompt_pos = p;
      x.sample_index = j;
      const int64_t P = 2 + p, R = 1 + (p + j) % 5;
      for (int64_t i = 0; i < P; ++i) x.prompt.push_back(toks[k++] % int32_t(V));
      for (int64_t i = 0; i < R; ++i) x.response.push_back(toks[k++] % int32_t(V));
      x.gen_logprobs.assign(size_t(R), -1.0f);
      x.stopped = true;
      s.push_back(x);
    }
  return s;
}

struct Run {
  std::vector<std::vector<float>> actor, critic;
  rl::PpoStats stats;
  std::vector<float> lp_old, lp_ref, values, advantages;  // the experience
  bool lp_old_skipped = false;
};

// The three models on the CPU (ZeRO-3 over comm) or, with `nccl`, on the GPU (ZeRO-3 over the
// NCCL communicator, which spans the same ranks as comm; nullptr with a 1-rank comm).
Run run(parallel::Comm& comm, bool ppo, const model::ModelConfig& cfg, bool gpu = false,
        parallel::Comm* nccl = nullptr, double adam_eps = 1e-8,
        rl::LossAggMode agg = rl::LossAggMode::kTokenMean,
        rl::PolicyLossType loss = rl::PolicyLossType::kPpo,
        const std::function<void(rl::PpoOptions&)>& tweak = {}, uint64_t ref_seed = 11,
        const std::function<void(std::vector<rollout::Sample>&)>& edit_samples = {}) {
  const int N = comm.size();
  model::ParamLayout layout(cfg, model::HeadKind::kLM);
  model::ParamLayout vlayout(cfg, model::HeadKind::kValue);
  auto make = [&](const model::ParamLayout& l, bool frozen) {
#ifdef RLHF_CUDA
    if (gpu) {
      parallel::Zero3OptionsCuda o;
      o.frozen = frozen;
      return parallel::make_cuda_train_model(std::make_unique<parallel::Zero3StoreCuda>(l, nccl, o),
                                             false);
    }
#endif
    (void)nccl;
    parallel::Zero3Options o;
    o.frozen = frozen;
    return parallel::make_cpu_train_model(std::make_unique<parallel::Zero3Store>(l, comm, o),
                                          false);
  };
  REQUIRE((!gpu || N == 1 || nccl != nullptr));
  auto actor = make(layout, false), ref = make(layout, true), critic = make(vlayout, false);
  init_store(actor->store(), 11);
  init_store(ref->store(), ref_seed);
  init_store(critic->store(), 12);
  rl::PpoModels m;
  m.actor = actor.get();
  m.ref = ref.get();
  if (ppo) m.critic = critic.get();
  rl::PpoOptions o;
  o.estimator = ppo ? rl::AdvantageEstimator::kGae : rl::AdvantageEstimator::kGroupNorm;
  o.use_kl_loss = !ppo;
  o.kl_estimator = ppo ? rl::KlEstimator::kK1 : rl::KlEstimator::kK3;
  o.init_kl_coef = 0.05;
  o.entropy_loss_coef = 0.01;
  o.n_samples_per_prompt = 4;
  o.micro_rollout_batch_size = 3;
  o.train_batch_size = 8;
  o.micro_train_batch_size = 8 / N;
  o.max_epochs = 2;
  o.temperature = 0.8;
  o.loss_agg_mode = agg;
  o.policy_loss = loss;
  o.generate_max_len = 6;  // the longest synthetic response is 5 tokens
  if (tweak) tweak(o);
  rl::PpoOptimizers opts;
  opts.actor_adam.lr = 1e-2;
  opts.actor_adam.eps = adam_eps;
  opts.critic_adam = opts.actor_adam;
  opts.actor_schedule = opts.critic_schedule = optim::LrSchedule("constant", 1e-2, 0, 100);
  rl::PpoTrainer tr(m, o, opts, comm);
  auto samples = synthetic_samples(cfg.vocab_size);
  if (edit_samples) edit_samples(samples);
  std::vector<double> scores;
  for (size_t i = 0; i < samples.size(); ++i) scores.push_back(double((i * 7) % 3 == 0));
  auto exp = tr.make_experience(samples, scores);
  Run r;
  r.lp_old = exp.lp_old;
  r.lp_ref = exp.lp_ref;
  r.values = exp.values;
  r.advantages = exp.advantages;
  r.lp_old_skipped = exp.lp_old_is_current;
  r.stats = tr.train(exp, 0);
  r.actor = full_weights(actor->store());
  if (ppo) r.critic = full_weights(critic->store());
  return r;
}

void compare(const Run& a, const Run& b, const std::string& name) {
  CHECK_MESSAGE(a.stats.policy_loss == doctest::Approx(b.stats.policy_loss).epsilon(1e-4), name);
  CHECK_MESSAGE(a.stats.optimizer_steps == b.stats.optimizer_steps, name);
  // The gradient norms are scale-sensitive (AdamW's update is not), so a mis-aggregated gradient
  // shows here even where the weights would hide it.
  CHECK_MESSAGE(a.stats.actor_grad_norm == doctest::Approx(b.stats.actor_grad_norm).epsilon(1e-4),
                name);
  CHECK_MESSAGE(a.stats.critic_grad_norm == doctest::Approx(b.stats.critic_grad_norm).epsilon(1e-4),
                name);
  // Weights: fp32 sums in another order (per-rank micro-batches, reduce-scatter). AdamW divides by
  // sqrt(v), so an element whose gradient is ~0 can move by up to lr per step either way; a few
  // such elements differ by ~2e-4 (measured) while the weights move by ~4e-2 over the 4 steps.
  // So: every element within 1e-3, and the whole unit within nmse 1e-7 (a wrong sample split or
  // reduction gives O(lr) differences everywhere, nmse ~1e-2).
  auto check = [&](const std::vector<std::vector<float>>& x,
                   const std::vector<std::vector<float>>& y, const std::string& what) {
    for (size_t u = 0; u < x.size(); ++u) {
      auto c = test::compare_arrays(x[u].data(), y[u].data(), int64_t(x[u].size()));
      INFO(c.summary(name + " " + what + " unit " + std::to_string(u)));
      CHECK(c.max_abs_err <= 1e-3);
      CHECK(c.nmse <= 1e-7);
    }
  };
  check(a.actor, b.actor, "actor");
  check(a.critic, b.critic, "critic");
}

}  // namespace

TEST_CASE("ppo/grpo: one RL step on N ranks == on 1 rank") {
  auto world = parallel::make_comm(MPI_COMM_WORLD, "train_comm");
  auto self = parallel::make_comm(MPI_COMM_SELF, "self");
  const auto cfg = small_config(false);
  for (bool ppo : {false, true}) {
    const std::string name = ppo ? "ppo (gae, critic, KL in reward)" : "grpo (group_norm, KL loss)";
    const Run one = run(*self, ppo, cfg);
    const Run many = run(*world, ppo, cfg);
    CHECK_MESSAGE(one.stats.optimizer_steps == 4, name);  // 16 samples / 8 × 2 epochs
    // The step did something: the weights moved away from the initial ones.
    model::ParamLayout l1(cfg, model::HeadKind::kLM);
    parallel::LocalParamStore init(l1);
    init_store(init, 11);
    const auto w0 = full_weights(init);
    double moved = 0;
    for (size_t u = 0; u < w0.size(); ++u)
      moved = std::max(
          moved, test::compare_arrays(one.actor[u].data(), w0[u].data(), int64_t(w0[u].size()))
                     .max_abs_err);
    CHECK_MESSAGE(moved > 1e-2, name);
    compare(one, many, name + " N=" + std::to_string(world->size()));
  }
}

TEST_CASE("grpo: every --loss_agg_mode, and GSPO, on N ranks == on 1 rank") {
  auto world = parallel::make_comm(MPI_COMM_WORLD, "train_comm");
  auto self = parallel::make_comm(MPI_COMM_SELF, "self");
  const auto cfg = small_config(false);
  using rl::LossAggMode;
  for (auto loss : {rl::PolicyLossType::kPpo, rl::PolicyLossType::kGspo})
    for (auto agg : {LossAggMode::kTokenMean, LossAggMode::kSeqMeanTokenMean,
                     LossAggMode::kSeqMeanTokenSum, LossAggMode::kSeqMeanTokenSumNorm}) {
      const std::string name = std::string(rl::to_string(loss)) + " " + rl::to_string(agg) +
                               " N=" + std::to_string(world->size());
      const Run one = run(*self, false, cfg, false, nullptr, 1e-8, agg, loss);
      const Run many = run(*world, false, cfg, false, nullptr, 1e-8, agg, loss);
      compare(one, many, name);
      // The modes differ: a mode that ignored its weights would give token-mean's gradient.
      if (agg != LossAggMode::kTokenMean) {
        const Run tm = run(*self, false, cfg, false, nullptr, 1e-8, LossAggMode::kTokenMean, loss);
        CHECK_MESSAGE(std::fabs(tm.stats.actor_grad_norm - one.stats.actor_grad_norm) >
                          1e-3 * tm.stats.actor_grad_norm,
                      name);
      }
    }
}

TEST_CASE("ppo/grpo: skipping the old-log-prob pass gives the update of computing it") {
  auto world = parallel::make_comm(MPI_COMM_WORLD, "train_comm");
  auto self = parallel::make_comm(MPI_COMM_SELF, "self");
  const auto cfg = small_config(false);
  // One optimizer step per rollout batch (16 samples), one epoch: lp_old equals the update's lp.
  auto one_step = [](bool skip, double kl) {
    return [skip, kl](rl::PpoOptions& o) {
      o.max_epochs = 1;
      o.train_batch_size = 16;
      o.micro_train_batch_size = 2;
      o.micro_rollout_batch_size = 2;
      o.init_kl_coef = kl;
      o.skip_current_old_logprobs = skip;
    };
  };
  for (bool ppo : {false, true}) {
    // GRPO keeps its KL loss; PPO needs its KL out of the reward for lp_old to be skippable.
    const double kl = ppo ? 0.0 : 0.05;
    const std::string name = ppo ? "ppo (gae, no KL)" : "grpo (KL loss)";
    // A reference other than the initial policy, so that the KL metric is not 0.
    const Run computed = run(*self, ppo, cfg, false, nullptr, 1e-8, rl::LossAggMode::kTokenMean,
                             rl::PolicyLossType::kPpo, one_step(false, kl), 13);
    const Run skipped = run(*self, ppo, cfg, false, nullptr, 1e-8, rl::LossAggMode::kTokenMean,
                            rl::PolicyLossType::kPpo, one_step(true, kl), 13);
    CHECK_MESSAGE(!computed.lp_old_skipped, name);
    CHECK_MESSAGE(skipped.lp_old_skipped, name);
    CHECK_MESSAGE(skipped.stats.optimizer_steps == 1, name);
    // The computed lp_old equals the update's lp bit for bit (the forward is batch-invariant), so
    // nothing clipped and no drift: the skipped run must give the same weights exactly.
    CHECK_MESSAGE(computed.stats.approx_kl == 0.0, name);
    CHECK_MESSAGE(computed.stats.clip_frac == 0.0, name);
    for (size_t u = 0; u < computed.actor.size(); ++u) {
      auto c = test::compare_arrays(computed.actor[u].data(), skipped.actor[u].data(),
                                    int64_t(computed.actor[u].size()));
      INFO(c.summary(name + " actor unit " + std::to_string(u)));
      CHECK(c.max_abs_err == 0.0);
    }
    CHECK_MESSAGE(computed.stats.policy_loss == skipped.stats.policy_loss, name);
    // The KL metric, summed by the update's forward instead of from the experience.
    CHECK_MESSAGE(skipped.stats.kl == doctest::Approx(computed.stats.kl).epsilon(1e-12), name);
    if (!ppo) CHECK_MESSAGE(skipped.stats.kl > 0, name);
    // And on N ranks, skipping still trains like 1 rank.
    const Run many = run(*world, ppo, cfg, false, nullptr, 1e-8, rl::LossAggMode::kTokenMean,
                         rl::PolicyLossType::kPpo, one_step(true, kl), 13);
    CHECK_MESSAGE(many.lp_old_skipped, name);
    compare(skipped, many, name + " skipped, N=" + std::to_string(world->size()));
  }
  // Where the KL sits in the reward (PPO, β > 0) or there are two epochs, the pass stays.
  const Run kl_reward = run(*self, true, cfg, false, nullptr, 1e-8, rl::LossAggMode::kTokenMean,
                            rl::PolicyLossType::kPpo, one_step(true, 0.05));
  CHECK(!kl_reward.lp_old_skipped);
  const Run epochs = run(*self, false, cfg, false, nullptr, 1e-8, rl::LossAggMode::kTokenMean,
                         rl::PolicyLossType::kPpo, [&](rl::PpoOptions& o) {
                           one_step(true, 0.05)(o);
                           o.max_epochs = 2;
                         });
  CHECK(!epochs.lp_old_skipped);
}

TEST_CASE("experience: each forward-only pass gathers each unit once, whatever the micro-batch") {
  auto world = parallel::make_comm(MPI_COMM_WORLD, "train_comm");
  const auto cfg = small_config(false);
  // PPO: old (two epochs), reference and value passes, all ZeRO-3 over the world. Two micro-batch
  // sizes: one sample per forward-only micro-batch (8/N micro-batches a rank) and all of them.
  // The passes sweep unit-major, so the bytes moved do not depend on the micro-batch count; the
  // training (micro_train_batch_size fixed) moves the same bytes in both runs.
  auto micro = [](int64_t m) { return [m](rl::PpoOptions& o) { o.micro_rollout_batch_size = m; }; };
  int64_t bytes[2];
  Run r[2];
  for (int i = 0; i < 2; ++i) {
    const int64_t b0 = world->stats().bytes;
    r[i] = run(*world, true, cfg, false, nullptr, 1e-8, rl::LossAggMode::kTokenMean,
               rl::PolicyLossType::kPpo, micro(i == 0 ? 1 : 16 / world->size()));
    bytes[i] = world->stats().bytes - b0;
  }
  CHECK(!r[0].lp_old_skipped);
  if (world->size() > 1) CHECK(bytes[1] > 0);
  CHECK(bytes[0] == bytes[1]);
  // The same experience: one sample per micro-batch is unpadded, the other padded to the longest.
  for (auto [a, b, what] : {std::tuple{&r[0].lp_old, &r[1].lp_old, "lp_old"},
                            std::tuple{&r[0].lp_ref, &r[1].lp_ref, "lp_ref"},
                            std::tuple{&r[0].values, &r[1].values, "values"}}) {
    auto c = test::compare_arrays(a->data(), b->data(), int64_t(a->size()));
    INFO(c.summary(what));
    CHECK(c.max_abs_err <= 1e-6);
  }
}

TEST_CASE("ppo/grpo on the device: one RL step over NCCL follows the CPU step") {
  if (!select_gpu_per_rank()) {
    MESSAGE("skipped: needs a CUDA device per rank (and NCCL)");
    return;
  }
#if defined(RLHF_CUDA) && defined(RLHF_NCCL)
  auto world = parallel::make_comm(MPI_COMM_WORLD, "train_comm");
  auto nccl = parallel::make_comm(MPI_COMM_WORLD, "train_comm_nccl", parallel::CommKind::kNccl);
  auto self = parallel::make_comm(MPI_COMM_SELF, "self");
  const auto cfg = small_config(false);
  for (bool ppo : {false, true}) {
    const std::string name =
        std::string(ppo ? "ppo" : "grpo") + " gpu N=" + std::to_string(world->size());
    // AdamW eps = 1 (above every |gradient| here) makes each update proportional to its
    // gradient, so the weight updates inherit the gradients' bf16 agreement; with eps = 1e-8
    // every element steps by ±lr and a near-zero gradient whose sign differs flips its step.
    const Run cpu = run(*self, ppo, cfg, false, nullptr, 1.0);
    const Run gpu = run(*world, ppo, cfg, true, nccl.get(), 1.0);
    CHECK_MESSAGE(gpu.stats.optimizer_steps == cpu.stats.optimizer_steps, name);
    // The experience: log-probs and values of the bf16 models (test_transformer_cuda: nmse <=
    // 5e-7 on log-probs, 1.5e-5 on values); GRPO's advantages depend on the scores only.
    test::check_nmse(name + " lp_old", gpu.lp_old, cpu.lp_old, 1e-5);
    test::check_nmse(name + " lp_ref", gpu.lp_ref, cpu.lp_ref, 1e-5);
    if (ppo) test::check_nmse(name + " values", gpu.values, cpu.values, 1e-4);
    test::check_nmse(name + " advantages", gpu.advantages, cpu.advantages, ppo ? 1e-3 : 1e-12);
    // Losses and gradient norms: bf16 gradients are within nmse ~1e-4 of fp32 ones.
    CHECK_MESSAGE(gpu.stats.policy_loss == doctest::Approx(cpu.stats.policy_loss).epsilon(2e-2),
                  name);
    CHECK_MESSAGE(
        gpu.stats.actor_grad_norm == doctest::Approx(cpu.stats.actor_grad_norm).epsilon(2e-2),
        name);
    if (ppo)
      CHECK_MESSAGE(
          gpu.stats.critic_grad_norm == doctest::Approx(cpu.stats.critic_grad_norm).epsilon(2e-2),
          name);
    // Weight updates (after − initial): as the gradients, nmse <= 1e-3; a wrong reduction, a lost
    // rank or a wrong sample split gives nmse ~1.
    model::ParamLayout l1(cfg, model::HeadKind::kLM), v1(cfg, model::HeadKind::kValue);
    parallel::LocalParamStore a0(l1), c0(v1);
    init_store(a0, 11);
    init_store(c0, 12);
    auto check = [&](const std::vector<std::vector<float>>& x,
                     const std::vector<std::vector<float>>& y,
                     const std::vector<std::vector<float>>& w0, const std::string& what) {
      for (size_t u = 0; u < x.size(); ++u) {
        std::vector<float> dx(x[u].size()), dy(x[u].size());
        for (size_t i = 0; i < dx.size(); ++i) {
          dx[i] = x[u][i] - w0[u][i];
          dy[i] = y[u][i] - w0[u][i];
        }
        test::check_nmse(name + " " + what + " updates of unit " + std::to_string(u), dx, dy, 1e-3);
      }
    };
    check(gpu.actor, cpu.actor, full_weights(a0), "actor");
    if (ppo) check(gpu.critic, cpu.critic, full_weights(c0), "critic");
  }
#endif
}

TEST_CASE("multi-turn: observation tokens carry no loss, KL or entropy") {
  auto world = parallel::make_comm(MPI_COMM_WORLD, "train_comm");
  auto self = parallel::make_comm(MPI_COMM_SELF, "self");
  const auto cfg = small_config(false);
  const int32_t V = int32_t(cfg.vocab_size);
  // (a) Observations appended after the last action token (an episode cut by the length limit)
  // influence nothing before them (causal model) and must add nothing: the step equals the one on
  // the responses without them — GRPO (KL loss, entropy bonus) and PPO (GAE, KL in the reward).
  const auto append_obs = [V](std::vector<rollout::Sample>& ss) {
    for (rollout::Sample& x : ss) {
      x.action_mask.assign(x.response.size(), 1);
      for (int k = 0; k < 2; ++k) {
        x.response.push_back(int32_t((x.prompt_pos * 5 + k) % V));
        x.gen_logprobs.push_back(0.0f);
        x.action_mask.push_back(0);
      }
    }
  };
  for (bool ppo : {false, true}) {
    const std::string name = ppo ? "ppo" : "grpo";
    const Run plain = run(*self, ppo, cfg);
    const Run masked = run(*self, ppo, cfg, false, nullptr, 1e-8, rl::LossAggMode::kTokenMean,
                           rl::PolicyLossType::kPpo, {}, 11, append_obs);
    CHECK_MESSAGE(masked.stats.entropy == doctest::Approx(plain.stats.entropy).epsilon(1e-5), name);
    CHECK_MESSAGE(masked.stats.kl == doctest::Approx(plain.stats.kl).epsilon(1e-5), name);
    compare(plain, masked, name + ": trailing observations vs none");
    // Without the mask the same tokens would be trained on: a different step.
    const Run unmasked = run(*self, ppo, cfg, false, nullptr, 1e-8, rl::LossAggMode::kTokenMean,
                             rl::PolicyLossType::kPpo, {}, 11, [&](auto& ss) {
                               append_obs(ss);
                               for (auto& x : ss) x.action_mask.clear();
                             });
    CHECK_MESSAGE(std::fabs(unmasked.stats.actor_grad_norm - plain.stats.actor_grad_norm) >
                      1e-3 * plain.stats.actor_grad_norm,
                  name);
  }
  // (b) Observations in the middle of responses: N ranks == 1 rank.
  const auto insert_obs = [V](std::vector<rollout::Sample>& ss) {
    for (rollout::Sample& x : ss) {
      if (x.response.size() < 2) continue;
      x.action_mask.assign(x.response.size(), 1);
      x.response.insert(x.response.begin() + 1, {int32_t(3 % V), int32_t(4 % V)});
      x.gen_logprobs.insert(x.gen_logprobs.begin() + 1, {0.0f, 0.0f});
      x.action_mask.insert(x.action_mask.begin() + 1, {0, 0});
    }
  };
  for (bool ppo : {false, true}) {
    const Run one = run(*self, ppo, cfg, false, nullptr, 1e-8, rl::LossAggMode::kTokenMean,
                        rl::PolicyLossType::kPpo, {}, 11, insert_obs);
    const Run many = run(*world, ppo, cfg, false, nullptr, 1e-8, rl::LossAggMode::kTokenMean,
                         rl::PolicyLossType::kPpo, {}, 11, insert_obs);
    compare(one, many, std::string(ppo ? "ppo" : "grpo") + " with observations, N ranks vs 1");
  }
}

namespace {

// One optimizer step over the 16 samples, no KL or entropy term (the gradient is the policy
// term's alone), with a correction (lo, hi); skip: the old-log-prob pass may be skipped.
std::function<void(rl::PpoOptions&)> corrected(rl::IsCorrection c, double lo, double hi,
                                               bool skip) {
  return [=](rl::PpoOptions& o) {
    o.max_epochs = 1;
    o.train_batch_size = 16;
    o.micro_train_batch_size = 2;
    o.micro_rollout_batch_size = 2;
    o.init_kl_coef = 0;
    o.entropy_loss_coef = 0;
    o.skip_current_old_logprobs = skip;
    o.is_correction = c;
    o.is_lo = lo;
    o.is_hi = hi;
  };
}

}  // namespace

TEST_CASE("off-policy correction: closed forms of the corrected step") {
  auto self = parallel::make_comm(MPI_COMM_SELF, "self");
  const auto cfg = small_config(false);
  using rl::IsCorrection;
  auto grpo = [&](IsCorrection c, double lo, double hi, bool skip) {
    return run(*self, false, cfg, false, nullptr, 1e-8, rl::LossAggMode::kTokenMean,
               rl::PolicyLossType::kPpo, corrected(c, lo, hi, skip));
  };
  // The mismatch metrics in closed form from the experience's lp_old and the engine's log-probs
  // (−1 for every synthetic response token).
  const Run computed = grpo(IsCorrection::kNone, 0.5, 5, false);
  REQUIRE(!computed.lp_old_skipped);
  const auto samples = synthetic_samples(cfg.vocab_size);
  const int64_t Tr = int64_t(computed.lp_old.size() / samples.size());
  double n = 0, k3 = 0, abs = 0, abs_max = 0, vllm_kl = 0;
  for (size_t i = 0; i < samples.size(); ++i)
    for (size_t t = 0; t < samples[i].response.size(); ++t) {
      const double d = double(computed.lp_old[i * size_t(Tr) + t]) + 1.0;  // lp_old − lp_rol
      n += 1;
      k3 += std::exp(d) - 1 - d;
      abs += std::fabs(d);
      abs_max = std::max(abs_max, std::fabs(d));
      vllm_kl -= d;
    }
  const rl::MismatchStats& m = computed.stats.mismatch;
  CHECK(m.mismatch_kl == doctest::Approx(k3 / n).epsilon(1e-9));
  CHECK(m.mismatch_kl > 0);
  CHECK(m.mismatch_abs_logp_mean == doctest::Approx(abs / n).epsilon(1e-9));
  CHECK(m.mismatch_abs_logp_max == doctest::Approx(abs_max).epsilon(1e-9));
  CHECK(m.vllm_kl == doctest::Approx(vllm_kl / n).epsilon(1e-9));
  CHECK(m.is_weight_mean == 1.0);  // no correction: weight 1 everywhere
  CHECK(m.is_masked_fraction == 0.0);
  for (bool skip : {false, true}) {
    const std::string name = skip ? "old-log-prob pass skipped" : "old-log-prob pass computed";
    const Run off = grpo(IsCorrection::kNone, 0.5, 5, skip);
    CHECK_MESSAGE(off.lp_old_skipped == skip, name);
    // Skipped, the metrics come from the update's forward passes: the same numbers.
    CHECK_MESSAGE(off.stats.mismatch.mismatch_kl == doctest::Approx(m.mismatch_kl).epsilon(1e-9),
                  name);
    CHECK_MESSAGE(off.stats.mismatch.mismatch_abs_logp_max == m.mismatch_abs_logp_max, name);
    // TIS clamped to [2, 2]: every weight is 2, so the loss and the gradient double.
    const Run twice = grpo(IsCorrection::kTis, 2, 2, skip);
    CHECK_MESSAGE(
        twice.stats.policy_loss == doctest::Approx(2 * off.stats.policy_loss).epsilon(1e-5), name);
    CHECK_MESSAGE(
        twice.stats.actor_grad_norm == doctest::Approx(2 * off.stats.actor_grad_norm).epsilon(1e-5),
        name);
    CHECK_MESSAGE(twice.stats.mismatch.is_weight_min == 2.0, name);
    CHECK_MESSAGE(twice.stats.mismatch.is_weight_max == 2.0, name);
    // IcePop with bounds no ratio reaches: every token drops out, no gradient.
    const Run none = grpo(IsCorrection::kIcepop, 1e6, 2e6, skip);
    CHECK_MESSAGE(none.stats.mismatch.is_masked_fraction == 1.0, name);
    CHECK_MESSAGE(none.stats.actor_grad_norm == 0.0, name);
    CHECK_MESSAGE(none.stats.policy_loss == 0.0, name);
    // With bounds every ratio is inside, IcePop, seq-mask-tis and uncapped decoupled PPO all weigh
    // each token by its ratio r: the same step, and not the uncorrected one.
    const Run ice = grpo(IsCorrection::kIcepop, 0, 1e30, skip);
    const Run seq = grpo(IsCorrection::kSeqMaskTis, 0, 1e30, skip);
    const Run dec = grpo(IsCorrection::kDecoupled, 0, 0, skip);
    for (const Run* r : {&seq, &dec}) {
      CHECK_MESSAGE(r->stats.policy_loss == ice.stats.policy_loss, name);
      CHECK_MESSAGE(r->stats.actor_grad_norm == ice.stats.actor_grad_norm, name);
    }
    CHECK_MESSAGE(std::fabs(ice.stats.actor_grad_norm - off.stats.actor_grad_norm) >
                      1e-3 * off.stats.actor_grad_norm,
                  name);
  }
}

TEST_CASE("off-policy correction: every type on N ranks == on 1 rank") {
  auto world = parallel::make_comm(MPI_COMM_WORLD, "train_comm");
  auto self = parallel::make_comm(MPI_COMM_SELF, "self");
  const auto cfg = small_config(false);
  using rl::IsCorrection;
  struct Case {
    IsCorrection c;
    double lo, hi;
    rl::PolicyLossType loss;
  };
  for (const Case& k : {Case{IsCorrection::kTis, 0.5, 2, rl::PolicyLossType::kPpo},
                        Case{IsCorrection::kIcepop, 0.5, 2, rl::PolicyLossType::kPpo},
                        Case{IsCorrection::kSeqMaskTis, 0.8, 1.25, rl::PolicyLossType::kPpo},
                        Case{IsCorrection::kDecoupled, 0, 2, rl::PolicyLossType::kPpo},
                        Case{IsCorrection::kTis, 0.5, 2, rl::PolicyLossType::kGspo}}) {
    const std::string name = std::string(rl::to_string(k.c)) + " " + rl::to_string(k.loss) +
                             " N=" + std::to_string(world->size());
    auto tweak = [&](rl::PpoOptions& o) {
      o.is_correction = k.c;
      o.is_lo = k.lo;
      o.is_hi = k.hi;
    };
    const Run one =
        run(*self, false, cfg, false, nullptr, 1e-8, rl::LossAggMode::kTokenMean, k.loss, tweak);
    const Run many =
        run(*world, false, cfg, false, nullptr, 1e-8, rl::LossAggMode::kTokenMean, k.loss, tweak);
    compare(one, many, name);
    CHECK_MESSAGE(one.stats.mismatch.is_weight_mean ==
                      doctest::Approx(many.stats.mismatch.is_weight_mean).epsilon(1e-9),
                  name);
    CHECK_MESSAGE(one.stats.mismatch.is_masked_fraction == many.stats.mismatch.is_masked_fraction,
                  name);
  }
}

TEST_CASE("--use_dynamic_batch: token budgets train like sample counts, N ranks like 1 rank") {
  auto world = parallel::make_comm(MPI_COMM_WORLD, "train_comm");
  auto self = parallel::make_comm(MPI_COMM_SELF, "self");
  const auto cfg = small_config(false);
  // Synthetic sequences are 3..10 tokens: a budget of 12 padded tokens holds one or two samples.
  for (int64_t budget : {12, 30})
    for (bool ppo : {false, true}) {
      const std::string name = std::string(ppo ? "ppo" : "grpo") + " budget " +
                               std::to_string(budget) + " N=" + std::to_string(world->size());
      auto tokens = [budget](rl::PpoOptions& o) {
        o.dynamic_batch = true;
        o.train_max_tokens = budget;
        o.rollout_max_tokens = budget;
      };
      const Run count = run(*self, ppo, cfg);
      const Run one = run(*self, ppo, cfg, false, nullptr, 1e-8, rl::LossAggMode::kTokenMean,
                          rl::PolicyLossType::kPpo, tokens);
      CHECK_MESSAGE(one.stats.train_micro_batches > count.stats.train_micro_batches, name);
      // The same experience (the forward is batch-invariant) and the same step.
      for (auto [a, b, what] : {std::tuple{&one.lp_old, &count.lp_old, "lp_old"},
                                std::tuple{&one.values, &count.values, "values"}}) {
        auto c = test::compare_arrays(a->data(), b->data(), int64_t(a->size()));
        INFO(c.summary(name + " " + what));
        CHECK(c.max_abs_err <= 1e-6);
      }
      compare(count, one, name + ": token budget vs sample count");
      const Run many = run(*world, ppo, cfg, false, nullptr, 1e-8, rl::LossAggMode::kTokenMean,
                           rl::PolicyLossType::kPpo, tokens);
      compare(one, many, name + ": N ranks vs 1");
    }
}

TEST_CASE("--packing_samples: packed micro-batches train like padded ones, N ranks like 1 rank") {
  auto world = parallel::make_comm(MPI_COMM_WORLD, "train_comm");
  auto self = parallel::make_comm(MPI_COMM_SELF, "self");
  const auto cfg = small_config(false);
  // Synthetic sequences are 3..10 tokens: a budget of 20 packed tokens holds two to six samples.
  for (bool dynamic : {false, true})
    for (bool ppo : {false, true}) {
      const std::string name = std::string(ppo ? "ppo" : "grpo") +
                               (dynamic ? " packed, budget 20" : " packed") +
                               " N=" + std::to_string(world->size());
      auto packed = [dynamic](rl::PpoOptions& o) {
        o.packing = true;
        o.dynamic_batch = dynamic;
        o.train_max_tokens = 20;
        o.rollout_max_tokens = 20;
      };
      const Run padded = run(*self, ppo, cfg);
      const Run one = run(*self, ppo, cfg, false, nullptr, 1e-8, rl::LossAggMode::kTokenMean,
                          rl::PolicyLossType::kPpo, packed);
      // The same experience (each sample attends to itself only, positions from 0: the padded
      // forward's values up to summation order) and the same step.
      for (auto [a, b, what] : {std::tuple{&one.lp_old, &padded.lp_old, "lp_old"},
                                std::tuple{&one.lp_ref, &padded.lp_ref, "lp_ref"},
                                std::tuple{&one.values, &padded.values, "values"}}) {
        auto c = test::compare_arrays(a->data(), b->data(), int64_t(a->size()));
        INFO(c.summary(name + " " + what));
        CHECK(c.max_abs_err <= 1e-5);
      }
      compare(padded, one, name + ": packed vs padded");
      const Run many = run(*world, ppo, cfg, false, nullptr, 1e-8, rl::LossAggMode::kTokenMean,
                           rl::PolicyLossType::kPpo, packed);
      compare(one, many, name + ": N ranks vs 1");
    }
}

TEST_CASE("pad_multiple: micro-batches rounded up to a multiple of T train like unrounded ones") {
  // What the GPU trainer does while cuDNN attention serves it (parallel::training_pad_multiple):
  // the extra right-pad columns are seen by no real position and carry no loss.
  auto self = parallel::make_comm(MPI_COMM_SELF, "self");
  const auto cfg = small_config(false);
  for (bool ppo : {false, true}) {
    const std::string name = std::string(ppo ? "ppo" : "grpo") + " pad_multiple 16";
    const Run plain = run(*self, ppo, cfg);
    const Run rounded =
        run(*self, ppo, cfg, false, nullptr, 1e-8, rl::LossAggMode::kTokenMean,
            rl::PolicyLossType::kPpo, [](rl::PpoOptions& o) { o.pad_multiple = 16; });
    for (auto [a, b, what] : {std::tuple{&rounded.lp_old, &plain.lp_old, "lp_old"},
                              std::tuple{&rounded.lp_ref, &plain.lp_ref, "lp_ref"},
                              std::tuple{&rounded.values, &plain.values, "values"}}) {
      auto c = test::compare_arrays(a->data(), b->data(), int64_t(a->size()));
      INFO(c.summary(name + " " + what));
      CHECK(c.max_abs_err <= 1e-6);
    }
    compare(plain, rounded, name + ": rounded vs unrounded");
  }
}
