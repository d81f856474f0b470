// ZeRO-3 and ZeRO-0 on N ranks against the single-rank trainer computed in-process on every rank:
// N ranks with the same global batch train like 1 rank. Also the sharding invariants.
#include "parallel/zero3.h"

#include <mpi.h>

#include <random>

#include "model/transformer.h"
#include "tests/mpi/train_util.h"
#include "tests/test_util.h"

using namespace rlhf;
using namespace rlhf::test;

TEST_CASE("zero3: N ranks train like 1 rank (ZeRO-3, ZeRO-3 + offload, keep params, ZeRO-0)") {
  auto comm = parallel::make_comm(MPI_COMM_WORLD, "train_comm");
  const int N = comm->size(), r = comm->rank();
  REQUIRE(kSeqs % N == 0);
  for (bool tied : {false, true}) {
    const auto cfg = small_config(tied);
    // The single-rank reference, computed locally on every rank: one micro-batch of all sequences.
    model::ParamLayout layout1(cfg, model::HeadKind::kLM);
    parallel::LocalParamStore ref(layout1);
    init_store(ref, 5);
    const auto ref_norms = train(ref, cfg, 4, 0, kSeqs, kSeqs);
    const auto ref_w = full_weights(ref);

    const model::ParamLayout& layoutN = layout1;  // the same units, sharded over N ranks
    struct Variant {
      const char* name;
      int stage;
      bool offload, keep;
    };
    std::vector<std::vector<std::vector<float>>> zero3_results;
    for (Variant v :
         {Variant{"zero3", 3, false, false}, Variant{"zero3+offload", 3, true, false},
          Variant{"zero3+keep_params", 3, false, true}, Variant{"zero0", 0, false, false}}) {
      std::unique_ptr<parallel::ParamStore> store;
      if (v.stage == 3) {
        parallel::Zero3Options o;
        o.adam_offload = v.offload;
        o.keep_params_for_backward = v.keep;
        store = std::make_unique<parallel::Zero3Store>(layoutN, *comm, o);
      } else {
        store = std::make_unique<parallel::ReplicatedStore>(layoutN, *comm);
      }
      init_store(*store, 5);
      // Each rank: its contiguous slice of the global batch, in micro-batches of 1 sequence.
      const int64_t per = kSeqs / N;
      const auto norms = train(*store, cfg, 4, r * per, per, 1);
      const auto w = full_weights(*store);
      const std::string name = fmt::format("{} tied={} N={}", v.name, tied, N);
      for (size_t s = 0; s < norms.size(); ++s)
        CHECK_MESSAGE(norms[s] == doctest::Approx(ref_norms[s]).epsilon(1e-5), name);
      // Tolerance: the N-rank run splits the batch into N·(kSeqs/N) micro-batches and sums the
      // gradient across ranks in a different order than the single micro-batch of the reference
      // (fp32 round-off ~1e-7 relative); AdamW turns gradient differences of that size into
      // weight differences of at most ~lr·1e-3 per step. 4 steps at lr 3e-3 move weights by
      // ~1e-2; we require agreement to 2e-5 absolute.
      for (size_t u = 0; u < w.size(); ++u) {
        auto cmp =
            test::compare_arrays(w[u].data(), ref_w[u].data(), int64_t(layout1.unit(int(u)).numel));
        INFO(cmp.summary(name + " unit " + layout1.unit(int(u)).name));
        CHECK(cmp.max_abs_err <= 2e-5);
      }
      if (v.stage == 3) zero3_results.push_back(w);
    }
    // Adam offload changes only where the step runs: bit-identical to the plain ZeRO-3 run, and so
    // is keeping the forward's gathers for backward.
    REQUIRE(zero3_results.size() == 3);
    CHECK(zero3_results[0] == zero3_results[1]);
    CHECK(zero3_results[0] == zero3_results[2]);
  }
}

TEST_CASE("zero3: shards concatenate to the unit; padding is zero and excluded from norms") {
  auto comm = parallel::make_comm(MPI_COMM_WORLD, "train_comm");
  const int N = comm->size();
  const auto cfg = small_config(false);
  model::ParamLayout layout(cfg, model::HeadKind::kLM);
  parallel::Zero3Store store(layout, *comm);
  const parallel::ShardLayout& shards = store.shard_layout();
  init_store(store, 9);
  for (int u = 0; u < layout.num_units(); ++u) {
    const auto& unit = layout.unit(u);
    std::vector<float> full(size_t(unit.numel)), back(size_t(unit.numel));
    model::init_unit_params(full.data(), unit, 9, 0.1);
    store.gather_unit(u, back.data());
    CHECK(full == back);
    // This rank's shard is its slice of the zero-padded unit, and the slices of all ranks tile
    // the padded unit exactly.
    const int64_t S = store.shard_numel(u);
    CHECK(S * N == shards.padded_numel(u));
    CHECK(shards.padded_numel(u) >= unit.numel);
    CHECK(shards.padded_numel(u) % 128 == 0);
    for (int64_t i = 0; i < S; ++i) {
      const int64_t g = shards.shard_offset(u, comm->rank()) + i;
      REQUIRE(store.shard_params(u)[i] == (g < unit.numel ? full[size_t(g)] : 0.0f));
    }
  }
  // After a backward, the global gradient norm equals the single-rank one computed over real
  // elements only, and the padding of every gradient shard is zero.
  model::ParamLayout layout1(cfg, model::HeadKind::kLM);
  parallel::LocalParamStore ref(layout1);
  init_store(ref, 9);
  const auto a = train(ref, cfg, 1, 0, kSeqs, kSeqs);
  init_store(store, 9);
  const int64_t per = kSeqs / N;
  const auto b = train(store, cfg, 1, comm->rank() * per, per, per);
  CHECK(b[0] == doctest::Approx(a[0]).epsilon(1e-5));
  for (int u = 0; u < layout.num_units(); ++u) {
    const auto& unit = layout.unit(u);
    const int64_t S = store.shard_numel(u), base = comm->rank() * S;
    for (int64_t i = 0; i < S; ++i) {
      const int64_t g = base + i;
      bool in_tensor = false;
      for (const auto& t : unit.tensors) in_tensor |= g >= t.offset && g < t.offset + t.numel;
      if (!in_tensor) REQUIRE(store.shard_grads(u)[i] == 0.0f);
    }
  }
}
