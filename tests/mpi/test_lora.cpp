// LoRA training state (parallel/lora_store.h) on N ranks against the single-rank run computed
// in-process on every rank: the frozen base sharded by ZeRO-3, the adapters' moments sharded,
// N ranks with the same global batch train like 1 rank; the base never changes; a checkpoint's
// adapter moments are the same whatever the rank count.
#include "parallel/lora_store.h"

#include <mpi.h>

#include "parallel/zero3.h"
#include "tests/mpi/train_util.h"
#include "tests/test_util.h"

using namespace rlhf;
using namespace rlhf::test;

namespace {

std::unique_ptr<parallel::TrainModel> lora_model(const model::ParamLayout& layout,
                                                 parallel::Comm& comm,
                                                 const model::LoraConfig& cfg) {
  parallel::Zero3Options f;
  f.frozen = true;
  auto base = std::make_unique<parallel::Zero3Store>(layout, comm, f);
  init_store(*base, 5);
  auto ls = std::make_unique<parallel::LoraStore>(std::move(base), cfg, comm, 9);
  return parallel::make_cpu_train_model(std::move(ls), false);
}

}  // namespace

TEST_CASE("lora store: N ranks train like 1 rank; the base stays frozen") {
  auto world = parallel::make_comm(MPI_COMM_WORLD, "train_comm");
  auto self = parallel::make_comm(MPI_COMM_SELF, "self");
  const int N = world->size(), r = world->rank();
  REQUIRE(kSeqs % N == 0);
  const auto cfg = small_config(false);
  const model::ParamLayout layout(cfg, model::HeadKind::kLM);
  model::LoraConfig lc;
  lc.rank = 4;
  lc.alpha = 8;
  lc.targets = model::parse_target_modules("q_proj,v_proj,up_proj,down_proj");

  auto one = lora_model(layout, *self, lc);
  REQUIRE(one->has_adapters());
  auto& s1 = dynamic_cast<parallel::LoraStore&>(one->store());
  const std::vector<float> a0(s1.adapters(), s1.adapters() + s1.lora_layout().numel());
  const auto ref_norms = train(*one, cfg, 4, 0, kSeqs, kSeqs);

  auto many = lora_model(layout, *world, lc);
  auto& sN = dynamic_cast<parallel::LoraStore&>(many->store());
  const int64_t per = kSeqs / N;
  const auto norms = train(*many, cfg, 4, r * per, per, 1);

  for (size_t s = 0; s < norms.size(); ++s)
    CHECK(norms[s] == doctest::Approx(ref_norms[s]).epsilon(1e-5));
  const int64_t n = s1.lora_layout().numel();
  // The adapters moved (B left zero after the first step), and agree with the 1-rank run
  // (tolerance as zero3's test: the gradient sums differ in order only).
  auto moved = compare_arrays(s1.adapters(), a0.data(), n);
  CHECK(moved.max_abs_err > 1e-3);
  auto cmp = compare_arrays(sN.adapters(), s1.adapters(), n);
  INFO(cmp.summary("adapters N ranks vs 1"));
  CHECK(cmp.max_abs_err <= 2e-5);
  std::vector<float> m1(static_cast<size_t>(n)), v1(m1), mN(m1), vN(m1);
  s1.gather_adapter_moments(m1.data(), v1.data());
  sN.gather_adapter_moments(mN.data(), vN.data());
  CHECK(compare_arrays(mN.data(), m1.data(), n).max_abs_err <= 1e-6);
  // The adapters' optimizer state is sharded: 2·⌈numel/N⌉ floats per rank.
  CHECK(sN.memory().optimizer_bytes == 2 * ((n + N - 1) / N) * int64_t(sizeof(float)));

  // The base has no gradients or moments, and its weights are the init's: the merged weights
  // minus (α/r)·B·A give them back.
  parallel::Zero3Options f;
  f.frozen = true;
  parallel::Zero3Store fresh(layout, *world, f);
  init_store(fresh, 5);
  const auto merged = full_weights(sN);
  const auto base = full_weights(fresh);
  for (int u = 0; u < layout.num_units(); ++u) {
    std::vector<float> w = merged[size_t(u)];
    const model::UnitLayout& unit = layout.unit(u);
    if (unit.kind == model::UnitKind::kLayer)
      for (const model::ProjInfo& p : model::kProjections) {
        const auto& e = sN.lora_layout().entry(unit.layer, p.id);
        if (e.a < 0) continue;
        model::lora_merge_cpu(w.data() + unit.at(p.weight_name).offset, sN.adapters() + e.a,
                              sN.adapters() + e.b, 2.0f, 4, e.in, e.out, -1.0f);
      }
    auto c = compare_arrays(w.data(), base[size_t(u)].data(), unit.numel);
    INFO(c.summary("unmerged vs base " + unit.name));
    CHECK(c.max_abs_err <= 1e-6);
  }
  // Gradients: the full local accumulator (S·N) and this rank's reduced shard (S); none for the
  // base (a frozen store).
  const int64_t S = (n + N - 1) / N;
  CHECK(sN.memory().grads_bytes == (S * N + S) * int64_t(sizeof(float)));
}

// A reward model / critic under LoRA: the score head trains fully (PEFT's modules_to_save), its
// gradient and moments sharded with the adapters; N ranks train like 1 rank.
TEST_CASE("lora store, value head: the score head trains; N ranks train like 1 rank") {
  auto world = parallel::make_comm(MPI_COMM_WORLD, "train_comm");
  auto self = parallel::make_comm(MPI_COMM_SELF, "self");
  const int N = world->size(), r = world->rank();
  REQUIRE(kSeqs % N == 0);
  const auto cfg = small_config(false);
  const model::ParamLayout layout(cfg, model::HeadKind::kValue);
  model::LoraConfig lc;
  lc.rank = 2;
  lc.alpha = 4;
  lc.targets = model::parse_target_modules("q_proj,o_proj,gate_proj");
  lc.save_score = true;
  auto make = [&](parallel::Comm& comm) {
    parallel::Zero3Options f;
    f.frozen = true;
    auto ls = std::make_unique<parallel::LoraStore>(
        std::make_unique<parallel::Zero3Store>(layout, comm, f), lc, comm, 9);
    init_store(*ls, 5);  // through LoraStore::load_unit: the score head's copy starts as the base's
    return parallel::make_cpu_train_model(std::move(ls), false);
  };
  // The "loss" Σ values · dlp (dlp as the LM loop's, the values read per token).
  auto run = [&](parallel::TrainModel& m, int64_t first, int64_t count, int64_t micro) {
    return train_loop(
        m.store(),
        [&](const int32_t* tok, const int32_t*, int64_t mb, float* v, const float* dv) {
          m.forward_scalar(tok, mb, kT, v, true);
          m.backward_scalar(dv);
        },
        cfg, 4, first, count, micro);
  };
  auto one = make(*self);
  auto& s1 = dynamic_cast<parallel::LoraStore&>(one->store());
  const model::LoraLayout& ll = s1.lora_layout();
  const int64_t n = ll.numel(), so = ll.score_offset(), C = cfg.hidden_size;
  REQUIRE(so >= 0);
  const std::vector<float> score0(s1.adapters() + so, s1.adapters() + so + C);
  CHECK(compare_arrays(score0.data(),
                       full_weights(s1).back().data() +
                           layout.unit(layout.head_unit()).at("score.weight").offset,
                       C)
            .max_abs_err == 0);
  const auto ref_norms = run(*one, 0, kSeqs, kSeqs);
  auto many = make(*world);
  auto& sN = dynamic_cast<parallel::LoraStore&>(many->store());
  const int64_t per = kSeqs / N;
  const auto norms = run(*many, r * per, per, 1);
  for (size_t s = 0; s < norms.size(); ++s)
    CHECK(norms[s] == doctest::Approx(ref_norms[s]).epsilon(1e-5));
  CHECK(compare_arrays(s1.adapters() + so, score0.data(), C).max_abs_err > 1e-3);  // it trained
  auto cmp = compare_arrays(sN.adapters(), s1.adapters(), n);
  INFO(cmp.summary("adapters + score head, N ranks vs 1"));
  CHECK(cmp.max_abs_err <= 2e-5);
  std::vector<float> m1(static_cast<size_t>(n)), v1(m1), mN(m1), vN(m1);
  s1.gather_adapter_moments(m1.data(), v1.data());
  sN.gather_adapter_moments(mN.data(), vN.data());
  CHECK(compare_arrays(mN.data(), m1.data(), n).max_abs_err <= 1e-6);
  double vs = 0;
  for (int64_t i = 0; i < C; ++i) vs += vN[size_t(so + i)];
  CHECK(vs > 0);  // the score head has moments
  // The merged model's score head is the trained copy.
  const auto merged = full_weights(sN);
  const int64_t off = layout.unit(layout.head_unit()).at("score.weight").offset;
  CHECK(std::equal(sN.adapters() + so, sN.adapters() + so + C, merged.back().data() + off));
}
