// The communicator layer against a naive reference: every rank's input is a known pattern of (rank,
// index), so every rank can compute what every collective must return by plain loops over ranks.
// Both implementations (MpiComm, ShmComm with the default chunk and with a tiny chunk that forces
// many steps), on the world, on two interleaved halves of it and on MPI_COMM_SELF; every dtype;
// counts 0, 1, odd and larger than a chunk; in-place forms; non-blocking wait/test; sentinels after
// every output; accounting numbers; bitwise determinism of the shared-memory sums.
#include <doctest/doctest.h>
#include <mpi.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "parallel/comm.h"
#include "parallel/mpi_check.h"

using namespace rlhf::parallel;

namespace {

// Values exactly representable in every dtype, whose sums over up to 8 ranks stay exact (so any
// summation order gives the same result, MPI's included) and fit uint8.
template <typename T>
T pattern(int rank, int64_t i) {
  int64_t k = (rank * 31 + i * 7 + 3) % 29;  // 0..28
  if constexpr (std::is_same_v<T, uint8_t>) {
    return static_cast<T>(k);
  } else if constexpr (std::is_floating_point_v<T>) {
    return static_cast<T>(k - 14) / T(8);
  } else {
    return static_cast<T>(k - 14);
  }
}

template <typename T>
T combine(ReduceOp op, T a, T b) {
  switch (op) {
    case ReduceOp::kSum:
      return static_cast<T>(a + b);
    case ReduceOp::kMax:
      return b > a ? b : a;
    case ReduceOp::kMin:
      return b < a ? b : a;
  }
  return a;
}

// op over ranks 0..n-1 of pattern(r, i), in rank order.
template <typename T>
T reduced(ReduceOp op, int n, int64_t i) {
  T acc = pattern<T>(0, i);
  for (int r = 1; r < n; ++r) acc = combine(op, acc, pattern<T>(r, i));
  return acc;
}

constexpr int kGuard = 16;

template <typename T>
T sentinel() {
  return static_cast<T>(77);  // never produced by pattern/reduced in the guard positions
}

// Output buffer of n elements followed by kGuard sentinels.
template <typename T>
std::vector<T> out_buffer(int64_t n) {
  return std::vector<T>(static_cast<size_t>(n + kGuard), sentinel<T>());
}

template <typename T>
int64_t guards_broken(const std::vector<T>& v, int64_t n) {
  int64_t bad = 0;
  for (int64_t i = n; i < n + kGuard; ++i) bad += v[static_cast<size_t>(i)] != sentinel<T>();
  return bad;
}

// Runs every collective of `c` for element type T and `count`, blocking or not, and returns the
// number of wrong elements (including overwritten guards).
template <typename T>
int64_t check_collectives(Comm& c, int64_t count, bool nonblocking) {
  const int n = c.size(), me = c.rank();
  int64_t wrong = 0;
  auto finish = [&](CommRequest req) {
    if (!nonblocking) return;
    // test() until done; it must report completion eventually.
    for (int spins = 0; !req.test(); ++spins) {
      if (spins > 10000000) {
        req.wait();
        break;
      }
    }
    wrong += !req.done();
  };

  // --- all_gather (out of place and in place)
  {
    std::vector<T> send(static_cast<size_t>(count));
    for (int64_t i = 0; i < count; ++i) send[static_cast<size_t>(i)] = pattern<T>(me, i);
    for (int in_place = 0; in_place < 2; ++in_place) {
      auto recv = out_buffer<T>(n * count);
      const T* src = send.data();
      if (in_place) {
        std::copy(send.begin(), send.end(), recv.begin() + me * count);
        src = recv.data() + me * count;
      }
      if (nonblocking) {
        finish(c.iall_gather(src, recv.data(), count));  // typed form
      } else {
        c.all_gather(src, recv.data(), count);
      }
      for (int j = 0; j < n; ++j)
        for (int64_t i = 0; i < count; ++i)
          wrong += recv[static_cast<size_t>(j * count + i)] != pattern<T>(j, i);
      wrong += guards_broken(recv, n * count);
    }
  }
  // --- reduce_scatter, all_reduce (out of place and in place), every op
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kMin}) {
    std::vector<T> send(static_cast<size_t>(n * count));
    // Rank me's input for index x of the full buffer is pattern(me, x).
    for (int64_t x = 0; x < n * count; ++x) send[static_cast<size_t>(x)] = pattern<T>(me, x);
    auto recv = out_buffer<T>(count);
    if (nonblocking) {
      finish(c.ireduce_scatter(send.data(), recv.data(), count, dtype_of<T>(), op));
    } else {
      c.reduce_scatter(send.data(), recv.data(), count, op);
    }
    for (int64_t i = 0; i < count; ++i)
      wrong += recv[static_cast<size_t>(i)] != reduced<T>(op, n, me * count + i);
    wrong += guards_broken(recv, count);

    for (int in_place = 0; in_place < 2; ++in_place) {
      auto buf = out_buffer<T>(count);
      std::vector<T> in(static_cast<size_t>(count));
      for (int64_t i = 0; i < count; ++i) in[static_cast<size_t>(i)] = pattern<T>(me, i);
      const T* src = in.data();
      if (in_place) {
        std::copy(in.begin(), in.end(), buf.begin());
        src = buf.data();
      }
      if (nonblocking) {
        finish(c.iall_reduce(src, buf.data(), count, dtype_of<T>(), op));
      } else {
        c.all_reduce(src, buf.data(), count, op);
      }
      for (int64_t i = 0; i < count; ++i)
        wrong += buf[static_cast<size_t>(i)] != reduced<T>(op, n, i);
      wrong += guards_broken(buf, count);
    }
  }
  // --- broadcast from the first and the last rank
  for (int root : {0, n - 1}) {
    auto buf = out_buffer<T>(count);
    for (int64_t i = 0; i < count; ++i) buf[static_cast<size_t>(i)] = pattern<T>(me, i);
    if (nonblocking) {
      finish(c.ibroadcast(buf.data(), count, root));  // typed form
    } else {
      c.broadcast(buf.data(), count, root);
    }
    for (int64_t i = 0; i < count; ++i) wrong += buf[static_cast<size_t>(i)] != pattern<T>(root, i);
    wrong += guards_broken(buf, count);
  }
  return wrong;
}

int64_t check_all_dtypes(Comm& c, int64_t count, bool nonblocking) {
  return check_collectives<float>(c, count, nonblocking) +
         check_collectives<double>(c, count, nonblocking) +
         check_collectives<int32_t>(c, count, nonblocking) +
         check_collectives<int64_t>(c, count, nonblocking) +
         check_collectives<uint8_t>(c, count, nonblocking);
}

// The communicators to test: the world, two interleaved halves (ranks 0,2,.. and 1,3,..; at 2 ranks
// these are size 1), and MPI_COMM_SELF.
struct BaseComms {
  MPI_Comm halves = MPI_COMM_NULL;
  BaseComms() {
    int me = comm_rank(MPI_COMM_WORLD);
    MPI_CHECK(MPI_Comm_split(MPI_COMM_WORLD, me % 2, me, &halves));
  }
  ~BaseComms() { free_comm_quietly(&halves); }
  std::vector<std::pair<std::string, MPI_Comm>> list() const {
    return {{"world", MPI_COMM_WORLD}, {"halves", halves}, {"self", MPI_COMM_SELF}};
  }
};

std::unique_ptr<Comm> make_kind(MPI_Comm base, const std::string& name, int variant) {
  if (variant == 0) return std::make_unique<MpiComm>(base, name);
  ShmCommOptions o;
  if (variant == 2) {
    o.chunk_bytes = 4096;    // many steps even for small counts
    o.stream_min_bytes = 0;  // every output through the non-temporal copy (odd sizes, alignments)
  }
  return std::make_unique<ShmComm>(base, name, o);
}
const char* kVariantNames[] = {"mpi", "shm", "shm(chunk 4 KiB, streaming stores)"};

}  // namespace

TEST_CASE("comm: every collective, both implementations, against the pattern reference") {
  BaseComms bases;
  for (auto& [label, base] : bases.list()) {
    for (int variant = 0; variant < 3; ++variant) {
      auto c = make_kind(base, label, variant);
      for (int64_t count : {0, 1, 5, 1237, 2600}) {
        for (bool nb : {false, true}) {
          INFO(label, " ", kVariantNames[variant], " size ", c->size(), " count ", count,
               nb ? " non-blocking" : " blocking");
          CHECK(check_all_dtypes(*c, count, nb) == 0);
        }
      }
    }
  }
}

TEST_CASE("comm: multi-step messages (chunked) and the all_reduce slice path") {
  // 20000 floats = 80 KB: several steps at 4 KiB chunks, and all_reduce steps above 16 KiB take the
  // 2-barrier slice path with the default chunk.
  BaseComms bases;
  for (int variant = 0; variant < 3; ++variant) {
    auto c = make_kind(MPI_COMM_WORLD, "world", variant);
    INFO(kVariantNames[variant]);
    CHECK(check_collectives<float>(*c, 20000, false) == 0);
    CHECK(check_collectives<uint8_t>(*c, 20011, false) == 0);
  }
}

TEST_CASE(
    "comm: shared-memory sums are deterministic: rank-order fp32 sums, identical on all ranks") {
  const int n = comm_size(MPI_COMM_WORLD), me = comm_rank(MPI_COMM_WORLD);
  const int64_t count = 10007;
  auto input = [&](int r) {
    std::mt19937 rng(1234u + static_cast<unsigned>(r));
    std::uniform_real_distribution<float> d(-1.f, 1.f);
    std::vector<float> v(static_cast<size_t>(n * count));
    for (auto& x : v) x = d(rng) * std::pow(10.f, static_cast<float>(r % 3) * 3.f);
    return v;
  };
  // Reference: ((x0 + x1) + x2) + ... in fp32.
  std::vector<std::vector<float>> all;
  for (int r = 0; r < n; ++r) all.push_back(input(r));
  std::vector<float> ref(static_cast<size_t>(n * count));
  for (int64_t x = 0; x < n * count; ++x) {
    float acc = all[0][static_cast<size_t>(x)];
    for (int r = 1; r < n; ++r) acc += all[static_cast<size_t>(r)][static_cast<size_t>(x)];
    ref[static_cast<size_t>(x)] = acc;
  }
  for (int64_t chunk : {int64_t{4096}, int64_t{2} << 20}) {
    ShmCommOptions o;
    o.chunk_bytes = chunk;
    o.stream_min_bytes = chunk == 4096 ? 0 : o.stream_min_bytes;
    ShmComm c(MPI_COMM_WORLD, "world", o);
    std::vector<float> ar(static_cast<size_t>(n * count)), rs(static_cast<size_t>(count));
    c.all_reduce(all[static_cast<size_t>(me)].data(), ar.data(), n * count);
    c.reduce_scatter(all[static_cast<size_t>(me)].data(), rs.data(), count);
    CHECK(std::memcmp(ar.data(), ref.data(), ar.size() * sizeof(float)) == 0);
    CHECK(std::memcmp(rs.data(), ref.data() + me * count, rs.size() * sizeof(float)) == 0);
    // Identical bits on every rank: all-gather rank 0's result bytes and compare.
    std::vector<float> r0(ar);
    c.broadcast(r0.data(), n * count, 0);
    CHECK(std::memcmp(ar.data(), r0.data(), ar.size() * sizeof(float)) == 0);
  }
}

TEST_CASE("comm: accounting of calls, bytes and seconds per communicator") {
  const int n = comm_size(MPI_COMM_WORLD);
  for (int variant = 0; variant < 2; ++variant) {
    auto c = make_kind(MPI_COMM_WORLD, "acct_comm", variant);
    INFO(kVariantNames[variant]);
    CHECK(c->stats().calls == 0);
    std::vector<float> f(static_cast<size_t>(10 * n));
    std::vector<double> d(static_cast<size_t>(3 * n)), d3(3);
    std::vector<int64_t> l(5);
    std::vector<uint8_t> u(7);
    std::vector<float> f10(10);
    c->all_gather(f10.data(), f.data(), 10);
    c->reduce_scatter(d.data(), d3.data(), 3);
    c->all_reduce(l.data(), l.data(), 5);
    c->broadcast(u.data(), 7, 0);
    auto req = c->iall_gather(f.data(), f.data(), 0, DType::kFloat32);
    req.wait();
    c->barrier();
    CHECK(c->stats(CollOp::kAllGather).calls == 2);
    CHECK(c->stats(CollOp::kAllGather).bytes == 10 * n * 4);
    CHECK(c->stats(CollOp::kReduceScatter).calls == 1);
    CHECK(c->stats(CollOp::kReduceScatter).bytes == 3 * n * 8);
    CHECK(c->stats(CollOp::kAllReduce).bytes == 5 * 8);
    CHECK(c->stats(CollOp::kBroadcast).bytes == 7);
    CHECK(c->stats(CollOp::kBarrier).calls == 1);
    CHECK(c->stats(CollOp::kBarrier).bytes == 0);
    CHECK(c->stats().calls == 6);
    CHECK(c->stats().bytes == 10 * n * 4 + 3 * n * 8 + 40 + 7);
    CHECK(c->stats().seconds > 0);
    CHECK(std::isfinite(c->stats().seconds));
    std::string s = c->summary(true);
    CHECK(s.rfind("acct_comm: 6 calls, ", 0) == 0);
    CHECK(s.find("reduce_scatter 1 calls") != std::string::npos);
    c->reset_stats();
    CHECK(c->stats().calls == 0);
    CHECK(c->stats().bytes == 0);
    CHECK(c->stats().seconds == 0);
    CHECK(c->stats(CollOp::kAllGather).calls == 0);
  }
}

TEST_CASE("comm: make_comm picks shared memory on one node, nullptr for MPI_COMM_NULL") {
  CHECK(make_comm(MPI_COMM_NULL, "none") == nullptr);
  CHECK(is_node_local(MPI_COMM_WORLD));
  const char* env = std::getenv("RLHF_COMM_KIND");
  if (env == nullptr || *env == '\0')
    CHECK(make_comm(MPI_COMM_WORLD, "w")->kind() == CommKind::kShm);
  CHECK(make_comm(MPI_COMM_WORLD, "w", CommKind::kMpi)->kind() == CommKind::kMpi);
  auto s = make_comm(MPI_COMM_SELF, "self", CommKind::kShm);
  CHECK(s->size() == 1);
  CHECK(s->name() == "self");
}

TEST_CASE("comm: argument errors throw before any communication") {
  MpiComm c(MPI_COMM_WORLD, "w");
  float x = 0;
  CHECK_THROWS_WITH_AS(c.broadcast(&x, 1, c.size()), doctest::Contains("root"), rlhf::Error);
  CHECK_THROWS_WITH_AS(c.all_reduce(&x, &x, -1), doctest::Contains("count -1"), rlhf::Error);
  CHECK_THROWS_AS(c.all_gather<float>(nullptr, &x, 1), rlhf::Error);
}
