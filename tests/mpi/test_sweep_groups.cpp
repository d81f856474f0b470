// Forward sweeps on ZeRO-3 ranks whose micro-batches differ in number and length: every rank must
// gather each unit as many times (the ranks agree on the sweep's group count), and each batch's
// log-probs equal the single-rank model's forward on that batch.
#include <mpi.h>

#include "parallel/zero3.h"
#include "tests/mpi/train_util.h"
#include "tests/test_util.h"

using namespace rlhf;
using namespace rlhf::test;

namespace {

// Rank r's batches (B, seq_len): rank 0 three of 5 tokens (three groups at a budget of 8
// tokens), rank 1 one of 2 x 4 (one group that cannot split: empty sweeps), rank 2 none (only
// empty sweeps), rank 3 two of 3 tokens (one group, split in two, then empty sweeps).
std::vector<std::pair<int64_t, int64_t>> rank_shapes(int r) {
  switch (r % 4) {
    case 0:
      return {{1, 5}, {1, 5}, {1, 5}};
    case 1:
      return {{2, 4}};
    case 2:
      return {};
    default:
      return {{1, 3}, {1, 3}};
  }
}

}  // namespace

TEST_CASE("sweep groups: ranks with different group counts agree and match the single rank") {
  auto comm = parallel::make_comm(MPI_COMM_WORLD, "train_comm");
  const int r = comm->rank();
  for (bool tied : {false, true}) {
    const auto cfg = small_config(tied);
    model::ParamLayout layout(cfg, model::HeadKind::kLM);
    auto local = std::make_unique<parallel::LocalParamStore>(layout);
    init_store(*local, 5);
    auto ref = parallel::make_cpu_train_model(std::move(local), false);
    auto sharded = std::make_unique<parallel::Zero3Store>(layout, *comm, parallel::Zero3Options{});
    init_store(*sharded, 5);
    // A residual budget of 8 tokens per sweep group.
    const int64_t budget = 8 * cfg.hidden_size * int64_t(sizeof(float));
    auto net = parallel::make_cpu_train_model(std::move(sharded), false, comm.get(), budget);

    const auto shapes = rank_shapes(r);
    std::vector<std::vector<int32_t>> tokens, targets;
    std::vector<std::vector<float>> out, want;
    std::vector<parallel::ForwardBatch> batches;
    for (size_t i = 0; i < shapes.size(); ++i) {
      const auto [B, T] = shapes[i];
      tokens.emplace_back(size_t(B * T));
      targets.emplace_back(size_t(B * T));
      for (int64_t n = 0; n < B * T; ++n) {
        tokens[i][size_t(n)] = int32_t((7 * n + 3 * int64_t(i) + 11 * r) % cfg.vocab_size);
        targets[i][size_t(n)] = int32_t((5 * n + int64_t(i) + 1) % cfg.vocab_size);
      }
      out.emplace_back(size_t(B * T), -1.0f);
      want.emplace_back(size_t(B * T), 0.0f);
      ref->forward_lm(tokens[i].data(), targets[i].data(), B, T, want[i].data(), nullptr, false);
    }
    for (size_t i = 0; i < shapes.size(); ++i)
      batches.push_back(
          {tokens[i].data(), targets[i].data(), shapes[i].first, shapes[i].second, out[i].data()});
    // Groups before the agreement: 3, 1, 0 and 1 on ranks 0..3.
    CHECK(parallel::sweep_groups(batches, cfg.hidden_size * 4, budget).size() - 1 ==
          std::vector<size_t>{3, 1, 0, 1}[size_t(r % 4)]);
    net->forward_lm_sweep(batches, 1.0f);  // hangs or fails if the ranks gather unequally
    // The gathered units are the single-rank weights, and the kernels and shapes the same.
    for (size_t i = 0; i < shapes.size(); ++i) CHECK(out[i] == want[i]);
    // A second sweep on the same model still agrees (no stale state from the empty sweeps).
    net->forward_lm_sweep(batches, 1.0f);
    for (size_t i = 0; i < shapes.size(); ++i) CHECK(out[i] == want[i]);
  }
}

TEST_CASE("sweep groups: min_groups splits the largest group, then appends empty groups") {
  std::vector<parallel::ForwardBatch> b(3);
  for (auto& x : b) x.B = 1, x.seq_len = 2;
  // One group of three at a large budget; split to 2 -> [0,2) [2,3); to 4 -> one each + empty.
  CHECK(parallel::sweep_groups(b, 1, 100) == std::vector<size_t>{0, 3});
  CHECK(parallel::sweep_groups(b, 1, 100, 2) == std::vector<size_t>{0, 2, 3});
  CHECK(parallel::sweep_groups(b, 1, 100, 4) == std::vector<size_t>{0, 1, 2, 3, 3});
  CHECK(parallel::sweep_groups({}, 1, 100, 2) == std::vector<size_t>{0, 0, 0});
}
