// bf16 compute on the CPU (Transformer::set_bf16) with ZeRO-3 over N ranks, whose gathers move bf16
// shards (Zero3Options::bf16_gather):
//  - against 1 rank: the N-rank run trains like the single-rank bf16 trainer computed in-process
//    on every rank (both compute on the same bf16 weights: the bf16 model rounds every weight it
//    reads, and the gathered ones are rounded already). Not bit-identical: the N-rank run sums the
//    weight gradients in another order (micro-batches of 1 sequence, then the reduce-scatter) and
//    oneDNN may block a GEMM of 1 sequence differently from one of all 8; a last-bit difference in
//    an fp32 GEMM result can move its bf16 rounding by one bf16 step (2^-8 relative).
//  - against fp32 gathers of the same N-rank run (the gathered fp32 units rounded by the model):
//    bit-identical weights, and exactly half the gathered bytes.
//  - on one rank: a bf16-gathering store and the local store train bit-identically.
//  - the gathered bf16 units feed the bf16 GEMMs directly (model/bf16_twin.h): the model converts
//    no weight, and computes exactly what it computes on rounded fp32 gathers.
//  - ZeRO-0 replicas with bf16 weight copies (LocalBf16Provider, made once per optimizer step)
//    train bit-identically to replicas that round the weights in every pass.
// Skips with a message when the build has no oneDNN.
#include <mpi.h>

#include "model/ops/matmul_bf16.h"
#include "parallel/zero3.h"
#include "tests/mpi/train_util.h"
#include "tests/test_util.h"

using namespace rlhf;
using namespace rlhf::test;

namespace {

bool have_onednn() {
  if (model::onednn_available()) return true;
  MESSAGE("skipped: this build has no oneDNN (bf16 compute on the CPU is off)");
  return false;
}

std::unique_ptr<parallel::TrainModel> zero3_bf16_model(const model::ParamLayout& layout,
                                                       parallel::Comm& comm, bool bf16_gather) {
  parallel::Zero3Options o;
  o.bf16_gather = bf16_gather;
  return parallel::make_cpu_train_model(std::make_unique<parallel::Zero3Store>(layout, comm, o),
                                        false, &comm, parallel::kSweepResidualBytes, true);
}

// What the N-rank tests share: the world's communicator, this rank's share of the kSeqs
// sequences (r · per onwards, per of them), and the small tied bf16 model.
struct RankShare {
  std::unique_ptr<parallel::Comm> comm = parallel::make_comm(MPI_COMM_WORLD, "train_comm");
  int N = comm->size(), r = comm->rank();
  int64_t per = kSeqs / N;
  model::ModelConfig cfg = small_config(true);
  model::ParamLayout layout{cfg, model::HeadKind::kLM};
  RankShare() { REQUIRE(kSeqs % N == 0); }
};

}  // namespace

TEST_CASE_FIXTURE(RankShare, "bf16: N ranks (ZeRO-3, bf16 gathers) train like 1 rank") {
  if (!have_onednn()) return;
  // The single-rank bf16 reference, on every rank: one micro-batch of all sequences.
  auto ref = parallel::make_cpu_train_model(std::make_unique<parallel::LocalParamStore>(layout),
                                            false, nullptr, parallel::kSweepResidualBytes, true);
  init_store(ref->store(), 5);
  const auto ref_norms = train(*ref, cfg, 4, 0, kSeqs, kSeqs);
  const auto ref_w = full_weights(ref->store());
  // And the fp32 single-rank run, to show the tolerance is well below the bf16 / fp32 gap.
  auto f32 =
      parallel::make_cpu_train_model(std::make_unique<parallel::LocalParamStore>(layout), false);
  init_store(f32->store(), 5);
  train(*f32, cfg, 4, 0, kSeqs, kSeqs);
  const auto f32_w = full_weights(f32->store());

  auto net = zero3_bf16_model(layout, *comm, true);
  init_store(net->store(), 5);
  const auto norms = train(*net, cfg, 4, r * per, per, 1);
  const auto w = full_weights(net->store());
  for (size_t s = 0; s < norms.size(); ++s)
    CHECK(norms[s] == doctest::Approx(ref_norms[s]).epsilon(1e-5));
  double max_n = 0, max_gap = 0;
  for (size_t u = 0; u < w.size(); ++u) {
    const int64_t n = layout.unit(int(u)).numel;
    const auto cmp = test::compare_arrays(w[u].data(), ref_w[u].data(), n);
    const auto gap = test::compare_arrays(f32_w[u].data(), ref_w[u].data(), n);
    INFO(cmp.summary(fmt::format("N={} unit {}", N, layout.unit(int(u)).name)));
    INFO(gap.summary("fp32 vs bf16, 1 rank"));
    max_n = std::max(max_n, cmp.max_abs_err);
    max_gap = std::max(max_gap, gap.max_abs_err);
    // The fp32 test's bound (tests/mpi/test_zero3.cpp): 4 AdamW steps at lr 3e-3 move weights
    // by ~1e-2; gradient round-off differences give weight differences far below 2e-5.
    CHECK(cmp.max_abs_err <= 2e-5);
  }
  CHECK(max_gap > 100 * std::max(max_n, 1e-7));  // the bf16 path ran: far from fp32
  MESSAGE(fmt::format("bf16 N={} vs 1 rank: max |dw| {:.3e}; fp32 vs bf16 on 1 rank: {:.3e}", N,
                      max_n, max_gap));
}

TEST_CASE("bf16: ZeRO-3 bf16 gathers equal rounded fp32 gathers bit for bit, at half the bytes") {
  if (!have_onednn()) return;
  const auto cfg = small_config(true);
  model::ParamLayout layout(cfg, model::HeadKind::kLM);
  std::vector<std::vector<float>> w[2];
  int64_t gathered[2] = {0, 0}, comm_bytes[2] = {0, 0};
  for (int g = 0; g < 2; ++g) {  // g = 0: fp32 gathers (rounded by the model), 1: bf16
    auto comm = parallel::make_comm(MPI_COMM_WORLD, "train_comm");
    const int N = comm->size(), r = comm->rank();
    auto net = zero3_bf16_model(layout, *comm, g == 1);
    init_store(net->store(), 7);
    comm->reset_stats();
    const int64_t per = kSeqs / N;
    train(*net, cfg, 3, r * per, per, 1);
    auto& z = dynamic_cast<parallel::Zero3Store&>(net->store());
    REQUIRE(z.bf16_gather() == (g == 1));
    gathered[g] = z.param_gather_bytes();
    comm_bytes[g] = comm->stats(parallel::CollOp::kAllGather).bytes;
    w[g] = full_weights(net->store());
  }
  for (size_t u = 0; u < w[0].size(); ++u)
    CHECK_MESSAGE(w[0][u] == w[1][u], "unit " << layout.unit(int(u)).name);
  REQUIRE(gathered[0] > 0);
  CHECK(2 * gathered[1] == gathered[0]);
  // Every all-gather of a training step is a parameter gather (the bf16 shards), so the
  // communicator's own count halves too.
  CHECK(2 * comm_bytes[1] == comm_bytes[0]);
  CHECK(comm_bytes[1] == gathered[1]);
  MESSAGE(fmt::format("parameter all-gather bytes over 3 steps: fp32 {} / bf16 {}", gathered[0],
                      gathered[1]));
}

TEST_CASE("bf16: one rank, bf16 gathers equal the local store bit for bit") {
  if (!have_onednn()) return;
  auto self = parallel::make_comm(MPI_COMM_SELF, "self");
  const auto cfg = small_config(false);
  model::ParamLayout layout(cfg, model::HeadKind::kLM);
  auto local = parallel::make_cpu_train_model(std::make_unique<parallel::LocalParamStore>(layout),
                                              false, nullptr, parallel::kSweepResidualBytes, true);
  auto sharded = zero3_bf16_model(layout, *self, true);
  init_store(local->store(), 9);
  init_store(sharded->store(), 9);
  // One micro-batch a step: both stores then sum the same gradients in the same order.
  const auto na = train(*local, cfg, 3, 0, kSeqs, kSeqs);
  const auto nb = train(*sharded, cfg, 3, 0, kSeqs, kSeqs);
  CHECK(na == nb);
  const auto wa = full_weights(local->store()), wb = full_weights(sharded->store());
  for (size_t u = 0; u < wa.size(); ++u)
    CHECK_MESSAGE(wa[u] == wb[u], "unit " << layout.unit(int(u)).name);
}

TEST_CASE("bf16: the gathered bf16 units feed the GEMMs directly (no second rounding)") {
  if (!have_onednn()) return;
  auto comm = parallel::make_comm(MPI_COMM_WORLD, "train_comm");
  const auto cfg = small_config(true);
  model::ParamLayout layout(cfg, model::HeadKind::kLM);
  parallel::Zero3Options o16;
  o16.bf16_gather = true;
  parallel::Zero3Store s16(layout, *comm, o16), s32(layout, *comm);
  init_store(s16, 11);
  init_store(s32, 11);
  const auto tokens = batch_tokens(0, cfg.vocab_size);
  std::vector<int32_t> targets(tokens.size());
  for (size_t n = 0; n < tokens.size(); ++n)
    targets[n] = (int64_t(n) % kT == kT - 1) ? -1 : tokens[n + 1];
  std::vector<float> lp[2], dlp(tokens.size(), -1e-2f);
  model::Transformer<float> a(layout), b(layout);
  a.set_bf16(true);
  b.set_bf16(true);
  lp[0].resize(tokens.size());
  lp[1].resize(tokens.size());
  s16.zero_grads();
  s32.zero_grads();
  a.forward_lm(s16, tokens.data(), targets.data(), kSeqs, kT, lp[0].data(), nullptr, true);
  a.backward_lm(s16, dlp.data(), nullptr);
  b.forward_lm(s32, tokens.data(), targets.data(), kSeqs, kT, lp[1].data(), nullptr, true);
  b.backward_lm(s32, dlp.data(), nullptr);
  CHECK(lp[0] == lp[1]);
  CHECK(s16.grad_sq_norm() == s32.grad_sq_norm());
  CHECK(a.bf16_converted_elements() == 0);  // every GEMM weight came from the gathered bf16
  CHECK(b.bf16_converted_elements() > 0);   // fp32 gathers: the model rounds them itself
}

TEST_CASE_FIXTURE(
    RankShare,
    "bf16: ZeRO-0 replicas keep bf16 weight copies, bit-identical to rounding per pass") {
  if (!have_onednn()) return;
  std::vector<std::vector<float>> w[2];
  for (int twins = 0; twins < 2; ++twins) {
    parallel::ZeroOptions z;
    z.zero_stage = 0;
    // make_param_store gives ZeRO-0 replicas the copies when the run computes in bf16.
    std::unique_ptr<parallel::ParamStore> store =
        twins == 1 ? parallel::make_param_store(layout, *comm, z, true)
                   : std::make_unique<parallel::ReplicatedStore>(layout, *comm);
    const bool has_copies = dynamic_cast<const model::Bf16Twins*>(&store->provider()) != nullptr;
    CHECK(has_copies == (twins == 1));
    auto net = parallel::make_cpu_train_model(std::move(store), false, comm.get(),
                                              parallel::kSweepResidualBytes, true);
    init_store(net->store(), 9);
    train(*net, cfg, 3, r * per, per, 1);  // micro-batches of one sequence: several passes a step
    w[twins] = full_weights(net->store());
  }
  for (size_t u = 0; u < w[0].size(); ++u) CHECK(w[0][u] == w[1][u]);
}
