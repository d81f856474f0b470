// Sharded training checkpoints (rl/checkpoint_sharded.h) on N ranks: every rank writes its ZeRO-3
// shard, rank 0 the index; the checkpoint verifies, resumes on N, N/2 and 1 ranks bit for bit like
// the single-file checkpoint of the same state (weights and AdamW moments), and like the N-rank
// store itself; a damaged shard makes it skipped for the previous checkpoint; a write that dies
// half-way leaves the previous checkpoint the newest, loadable one.
#include <mpi.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "io/hdf5_ckpt.h"
#include "io/pretrained.h"
#include "io/sharded_ckpt.h"
#include "parallel/comm.h"
#include "parallel/zero3.h"
#include "rl/checkpoint.h"
#include "tests/mpi/train_util.h"
#include "tests/test_util.h"

using namespace rlhf;
using namespace rlhf::test;

namespace fs = std::filesystem;

namespace {

// Weights and moments, consolidated (collective over the store's communicator).
struct State {
  std::vector<std::vector<float>> w, m, v;
};
State state_of(parallel::ParamStore& s) {
  State st;
  st.w = full_weights(s);
  for (int u = 0; u < s.layout().num_units(); ++u) {
    const size_t n = size_t(s.layout().unit(u).numel);
    st.m.emplace_back(n);
    st.v.emplace_back(n);
    s.gather_moments(u, st.m.back().data(), st.v.back().data());
  }
  return st;
}
bool operator==(const State& a, const State& b) {
  return a.w == b.w && a.m == b.m && a.v == b.v;
}

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}
void spit(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

// A folder every rank agrees on (rank 0's temp name, broadcast).
std::string shared_dir(parallel::Comm& world) {
  std::vector<uint8_t> name;
  if (world.rank() == 0) {
    const std::string p =
        (fs::temp_directory_path() / fmt::format("rlhf_sharded_{}", ::getpid())).string();
    name.assign(p.begin(), p.end());
  }
  auto all = world.all_gather_bytes(name);
  return std::string(all[0].begin(), all[0].end());
}

// A sub-communicator of the first m world ranks (null on the others).
std::unique_ptr<parallel::Comm> first_ranks(int m) {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  MPI_Comm c = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, r < m ? 0 : MPI_UNDEFINED, r, &c);
  if (c == MPI_COMM_NULL) return nullptr;
  return parallel::make_comm(c, fmt::format("first_{}", m), parallel::CommKind::kMpi);
}

}  // namespace

TEST_CASE("sharded checkpoints: N ranks write, verify, and resume on N, N/2 and 1 ranks") {
  auto world = parallel::make_comm(MPI_COMM_WORLD, "train_comm", parallel::CommKind::kMpi);
  const int N = world->size();
  const auto cfg = small_config(false);
  const model::ParamLayout layout(cfg, model::HeadKind::kLM);
  const std::string dir = shared_dir(*world);
  if (world->rank() == 0) fs::create_directories(dir);
  world->barrier();

  // N ranks train two steps (moments non-zero), then save both forms of step 2, then step 3.
  parallel::Zero3Store store(layout, *world);
  init_store(store, 3);
  const int64_t per = kSeqs / N;
  train(store, cfg, 2, world->rank() * per, per, 1);
  const State s2 = state_of(store);
  std::vector<rl::CheckpointSlot> slots = {{"model", &store, true}};
  const std::string single = (fs::path(dir) / "single" / "step_2.h5").string();
  const std::string sharded = rl::checkpoint_path((fs::path(dir) / "sharded").string(), 2);
  const bool w0 = world->rank() == 0;
  rl::save_train_checkpoint(single, slots, {{"step", 2}}, w0, 0);
  rl::save_train_checkpoint(sharded, slots, {{"step", 2}}, w0, 0, nullptr, world.get());
  world->barrier();

  // The files: an index with /shards and no weights, one shard per rank, each holding pieces.
  {
    io::CheckpointReader idx(sharded);
    REQUIRE(io::is_sharded_checkpoint(idx));
    CHECK(idx.read_int_attr("/shards", "ranks") == N);
    CHECK_FALSE(idx.exists("/model/model.embed_tokens.weight"));
    CHECK(idx.exists("/trainer"));
    for (int r = 0; r < N; ++r)
      CHECK(fs::is_regular_file(fs::path(io::shard_dir(sharded)) / io::shard_file_name(r, N)));
    CHECK_FALSE(fs::exists(io::shard_dir(sharded) + ".tmp"));
    CHECK(io::ShardSet(idx).verify() > 0);
  }
  CHECK(rl::latest_valid_checkpoint(fs::path(sharded).parent_path().string()) == sharded);

  // Resume on M ranks: the sharded and the single-file checkpoint load the same bits, which are
  // the N-rank store's.
  for (int M : {N, N / 2, 1}) {
    if (M < 1) continue;
    CAPTURE(M);
    auto sub = first_ranks(M);
    if (sub) {
      parallel::Zero3Store a(layout, *sub), b(layout, *sub);
      init_store(a, 7);
      init_store(b, 8);
      std::vector<rl::CheckpointSlot> sa = {{"model", &a, true}}, sb = {{"model", &b, true}};
      const nlohmann::json st = rl::load_train_checkpoint(sharded, sa);
      rl::load_train_checkpoint(single, sb);
      CHECK(st.at("step") == 2);
      const State la = state_of(a), lb = state_of(b);
      CHECK(la == lb);
      CHECK(la == s2);
    }
    world->barrier();
  }
  // And into a one-process store (what `rlhf export --pretrain step_2.h5` and rank-1 runs use).
  if (w0) {
    parallel::LocalParamStore l(layout);
    std::vector<rl::CheckpointSlot> sl = {{"model", &l, true}};
    rl::load_train_checkpoint(sharded, sl);
    CHECK(state_of(l) == s2);
    // --pretrain / `rlhf export` read the sharded checkpoint's model like the single file's.
    const io::PretrainedModel ps = io::open_pretrained(sharded), p1 = io::open_pretrained(single);
    CHECK(ps.tensors->names() == p1.tensors->names());
    for (const std::string& name : p1.tensors->names()) {
      const auto meta = p1.tensors->find(name);
      REQUIRE(meta.has_value());
      CHECK(ps.tensors->find(name)->shape == meta->shape);
      std::vector<float> a(size_t(meta->numel())), b(a.size());
      ps.tensors->read(name, a.data());
      p1.tensors->read(name, b.data());
      CHECK_MESSAGE(a == b, name);
    }
  }
  world->barrier();

  // A ZeRO-0 (replicated) store writes ShardLayout's slices; a ZeRO-3 store on 1 rank reads them.
  {
    parallel::ReplicatedStore rep(layout, *world);
    for (int u = 0; u < layout.num_units(); ++u) {
      rep.load_unit(u, s2.w[size_t(u)].data());
      rep.load_moments(u, s2.m[size_t(u)].data(), s2.v[size_t(u)].data());
    }
    std::vector<rl::CheckpointSlot> sr = {{"model", &rep, true}};
    const std::string p = rl::checkpoint_path((fs::path(dir) / "rep").string(), 2);
    rl::save_train_checkpoint(p, sr, {{"step", 2}}, w0, 0, nullptr, world.get());
    if (auto one = first_ranks(1)) {
      parallel::Zero3Store z(layout, *one);
      std::vector<rl::CheckpointSlot> sz = {{"model", &z, true}};
      rl::load_train_checkpoint(p, sz);
      CHECK(state_of(z) == s2);
    }
    world->barrier();
  }

  // Step 3, then a flipped byte in one shard: step 3 is skipped for step 2.
  train(store, cfg, 1, world->rank() * per, per, 1);
  const State s3 = state_of(store);
  const std::string dir3 = fs::path(sharded).parent_path().string();
  const std::string step3 = rl::checkpoint_path(dir3, 3);
  rl::save_train_checkpoint(step3, slots, {{"step", 3}}, w0, 0, nullptr, world.get());
  world->barrier();
  CHECK(rl::latest_valid_checkpoint(dir3) == step3);
  world->barrier();  // every rank has read the files before rank 0 damages one
  const fs::path victim = fs::path(io::shard_dir(step3)) / io::shard_file_name(N - 1, N);
  std::string saved_bytes;
  if (w0) {
    saved_bytes = slurp(victim.string());
    std::string bad = saved_bytes;
    bad[bad.size() / 2] = char(bad[bad.size() / 2] ^ 0x5a);
    spit(victim.string(), bad);
  }
  world->barrier();
  CHECK(rl::latest_valid_checkpoint(dir3) == sharded);
  world->barrier();
  if (w0) spit(victim.string(), saved_bytes);
  world->barrier();
  CHECK(rl::latest_valid_checkpoint(dir3) == step3);
  {
    parallel::Zero3Store c(layout, *world);
    std::vector<rl::CheckpointSlot> sc = {{"model", &c, true}};
    rl::load_train_checkpoint(step3, sc);
    CHECK(state_of(c) == s3);
  }

  // A write that dies after the first unit on every rank (RLHF_INJECT_FAILURE): no step_4.h5;
  // step 3 stays the newest valid checkpoint and loads whole.
  ::setenv("RLHF_INJECT_FAILURE", "checkpoint_write:*", 1);
  const std::string step4 = rl::checkpoint_path(dir3, 4);
  CHECK_THROWS_WITH_AS(
      rl::save_train_checkpoint(step4, slots, {{"step", 4}}, w0, 0, nullptr, world.get()),
      doctest::Contains("injected failure at checkpoint_write"), rlhf::Error);
  ::unsetenv("RLHF_INJECT_FAILURE");
  world->barrier();
  CHECK_FALSE(fs::exists(step4));
  CHECK(rl::list_checkpoints(dir3).back() == step3);
  CHECK(rl::latest_valid_checkpoint(dir3) == step3);
  {
    parallel::Zero3Store c(layout, *world);
    std::vector<rl::CheckpointSlot> sc = {{"model", &c, true}};
    CHECK(rl::load_train_checkpoint(step3, sc).at("step") == 3);
    CHECK(state_of(c) == s3);
  }
  world->barrier();
  if (w0) fs::remove_all(dir);
}
