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
