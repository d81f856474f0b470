// Topology on the real MPI world: the communicators it splits agree with the pure plan, every
// engine lies inside one node, the placement table is gathered to rank 0, refusals are thrown on
// every rank. Run by ctest under 2 and 4 ranks with RLHF_RANKS_PER_NODE=2 (4 ranks = 2 simulated
// nodes); the cases below pass ranks_per_node explicitly so they do not depend on the environment.
#include <doctest/doctest.h>
#include <mpi.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "core/error.h"
#include "parallel/mpi_check.h"
#include "parallel/topology.h"

using namespace rlhf::parallel;

namespace {

int world_rank() {
  return comm_rank(MPI_COMM_WORLD);
}
int world_size() {
  return comm_size(MPI_COMM_WORLD);
}

// World ranks of the members of `comm`, in comm-rank order (a naive reference built from a plain
// all-gather of each member's world rank).
std::vector<int> members(MPI_Comm comm) {
  if (comm == MPI_COMM_NULL) return {};
  int me = world_rank(), n = comm_size(comm);
  std::vector<int> out(static_cast<size_t>(n));
  MPI_CHECK(MPI_Allgather(&me, 1, MPI_INT, out.data(), 1, MPI_INT, comm));
  return out;
}

std::vector<std::string> all_hosts() {
  char name[MPI_MAX_PROCESSOR_NAME] = {0};
  int len = 0;
  MPI_CHECK(MPI_Get_processor_name(name, &len));
  std::vector<char> all(static_cast<size_t>(world_size()) * MPI_MAX_PROCESSOR_NAME);
  MPI_CHECK(MPI_Allgather(name, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, all.data(),
                          MPI_MAX_PROCESSOR_NAME, MPI_CHAR, MPI_COMM_WORLD));
  std::vector<std::string> hosts;
  for (int r = 0; r < world_size(); ++r)
    hosts.emplace_back(all.data() + static_cast<size_t>(r) * MPI_MAX_PROCESSOR_NAME);
  return hosts;
}

// Builds the Topology and checks it against plan_placement and against the communicators' actual
// membership.
void check_topology(const TopologyOptions& opts) {
  const int W = world_size(), me = world_rank();
  CAPTURE(W);
  CAPTURE(opts.ranks_per_node);
  CAPTURE(opts.gen_ranks_per_node);
  CAPTURE(opts.tensor_parallel);
  Topology topo(MPI_COMM_WORLD, opts);
  // The plan from the same inputs, computed here independently of the constructor.
  Placement plan = plan_placement(W, {}, all_hosts(), opts);
  const Placement& p = topo.placement();
  REQUIRE(p.world_size() == W);
  CHECK(p.num_nodes() == plan.num_nodes());
  CHECK(p.engines == plan.engines);
  CHECK(p.train_ranks == plan.train_ranks);
  CHECK(p.gen_ranks == plan.gen_ranks);
  for (int r = 0; r < W; ++r) {
    const RankPlacement &a = p.ranks[static_cast<size_t>(r)],
                        &b = plan.ranks[static_cast<size_t>(r)];
    CHECK(a.node == b.node);
    CHECK(a.local_rank == b.local_rank);
    CHECK(a.role == b.role);
    CHECK(a.engine == b.engine);
    CHECK(a.engine_rank == b.engine_rank);
  }

  // Communicators: membership from a plain all-gather of world ranks.
  const RankPlacement& m = topo.me();
  CHECK(members(topo.world()) == std::vector<int>([&] {
          std::vector<int> v(static_cast<size_t>(W));
          for (int r = 0; r < W; ++r) v[static_cast<size_t>(r)] = r;
          return v;
        }()));
  std::vector<int> node_members;
  for (const auto& rp : p.ranks)
    if (rp.node == m.node) node_members.push_back(rp.rank);
  CHECK(members(topo.node_comm()) == node_members);
  if (m.trains()) {
    CHECK(members(topo.train_comm()) == p.train_ranks);
  } else {
    CHECK(topo.train_comm() == MPI_COMM_NULL);
  }
  if (m.generates()) {
    CHECK(members(topo.gen_comm()) == p.gen_ranks);
    REQUIRE(topo.engine_comm() != MPI_COMM_NULL);
    CHECK(members(topo.engine_comm()) == p.engines[static_cast<size_t>(m.engine)]);
    // Every engine member is on this rank's node.
    for (int r : members(topo.engine_comm())) CHECK(p.ranks[static_cast<size_t>(r)].node == m.node);
  } else {
    CHECK(topo.gen_comm() == MPI_COMM_NULL);
    CHECK(topo.engine_comm() == MPI_COMM_NULL);
  }

  // Placement table on rank 0 only, one line per rank after the header.
  std::string table = topo.placement_table();
  if (me == 0) {
    CHECK(table == format_placement_table(p));
    int lines = 0;
    for (char c : table) lines += c == '\n';
    CHECK(lines == W + 1 + (p.warning.empty() ? 0 : 1));
    CHECK(table.find("local_rank") != std::string::npos);
  } else {
    CHECK(table.empty());
  }
}

}  // namespace

TEST_CASE("topology: simulated nodes of 2 ranks, colocated, tp 1 and 2") {
  const int W = world_size();
  const int rpn = W % 2 == 0 ? 2 : W;
  check_topology({rpn, 0, 1});
  if (rpn % 2 == 0) check_topology({rpn, 0, 2});
}

TEST_CASE("topology: simulated nodes of 2 ranks, one generation rank per node") {
  const int W = world_size();
  if (W % 2 != 0) return;
  check_topology({2, 1, 1});
  Topology topo(MPI_COMM_WORLD, {2, 1, 1});
  // Per node: local rank 0 trains, local rank 1 generates (the highest local rank).
  CHECK(topo.me().role == (world_rank() % 2 == 0 ? Role::kTrain : Role::kGen));
  CHECK(static_cast<int>(topo.placement().train_ranks.size()) == W / 2);
  CHECK(topo.placement().num_engines() == W / 2);
}

TEST_CASE("topology: real nodes (one host), one engine of every rank") {
  const int W = world_size();
  // ranks_per_node = 0 with RLHF_RANKS_PER_NODE unset: the real shared-memory node, which holds the
  // whole world on this one host. Every rank changes the environment the same way.
  const char* env = std::getenv("RLHF_RANKS_PER_NODE");
  std::string saved = env != nullptr ? env : "";
  unsetenv("RLHF_RANKS_PER_NODE");
  check_topology({0, 0, W});
  {
    Topology topo(MPI_COMM_WORLD, {0, 0, W});
    CHECK(topo.placement().num_nodes() == 1);
    CHECK(topo.placement().num_engines() == 1);
    CHECK(comm_size(topo.engine_comm()) == W);
  }
  if (env != nullptr) setenv("RLHF_RANKS_PER_NODE", saved.c_str(), 1);
  // A simulated node may not span real nodes, but the whole world is one real node here.
  check_topology({W, 0, 1});
}

TEST_CASE("topology: an impossible placement is refused on every rank") {
  const int W = world_size();
  // tp = W + 1 cannot be cut from any node.
  CHECK_THROWS_WITH_AS(Topology(MPI_COMM_WORLD, {0, 0, W + 1}),
                       doctest::Contains("not a multiple of"), rlhf::Error);
  // Every rank generates: no training rank.
  CHECK_THROWS_WITH_AS(Topology(MPI_COMM_WORLD, {1, 1, 1}), doctest::Contains("no rank trains"),
                       rlhf::Error);
  // The world is still usable afterwards (every rank threw, none is left inside a collective).
  int one = 1, sum = 0;
  MPI_CHECK(MPI_Allreduce(&one, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD));
  CHECK(sum == W);
}

TEST_CASE("topology: RLHF_RANKS_PER_NODE is used when the option is 0") {
  const char* env = std::getenv("RLHF_RANKS_PER_NODE");
  int expect = env != nullptr && *env != '\0' ? std::atoi(env) : 0;
  CHECK(resolve_ranks_per_node(0) == expect);
  CHECK(resolve_ranks_per_node(3) == 3);
  if (expect > 0 && world_size() % expect == 0) {
    Topology topo(MPI_COMM_WORLD, {0, 0, 1});
    CHECK(topo.placement().num_nodes() == world_size() / expect);
    CHECK(topo.placement().options.ranks_per_node == expect);
  }
}

TEST_CASE("MPI_CHECK: a failing MPI call throws rlhf::Error with the MPI error string") {
  int r = 0;
  // MPI_ERRORS_RETURN is set on MPI_COMM_WORLD by the runner; an invalid root is reported.
  CHECK_THROWS_WITH_AS(MPI_CHECK(MPI_Bcast(&r, 1, MPI_INT, world_size() + 5, MPI_COMM_WORLD)),
                       doctest::Contains("MPI error: MPI_ERR_ROOT"), rlhf::Error);
}
