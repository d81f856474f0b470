// plan_placement (pure, no MPI): for several (world, ranks per node, G, TP) cases, every engine
// lies inside one node, roles and counts are as asked, uneven nodes are placed and reported, and
// impossible placements are refused with a message that says why and what would work.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "core/error.h"
#include "parallel/topology.h"

using namespace rlhf::parallel;

namespace {

// Independent check of a plan against the rules, from the node id of every rank.
void check_rules(const Placement& p, const std::vector<int>& node_of_rank, int G, int tp) {
  const int W = static_cast<int>(node_of_rank.size());
  REQUIRE(p.world_size() == W);
  // Node membership (by the given ids, whatever their numbering) and local ranks in rank order.
  std::map<int, std::vector<int>> members;
  for (int r = 0; r < W; ++r) members[node_of_rank[static_cast<size_t>(r)]].push_back(r);
  CHECK(p.num_nodes() == static_cast<int>(members.size()));
  for (auto& [id, ranks] : members) {
    const int node = p.ranks[static_cast<size_t>(ranks[0])].node;
    const int s = static_cast<int>(ranks.size());
    CHECK(p.node_sizes[static_cast<size_t>(node)] == s);
    int gen = 0, train = 0;
    for (int lr = 0; lr < s; ++lr) {
      const RankPlacement& rp = p.ranks[static_cast<size_t>(ranks[static_cast<size_t>(lr)])];
      CHECK(rp.node == node);
      CHECK(rp.local_rank == lr);
      if (G == 0) {
        CHECK(rp.role == Role::kBoth);
      } else {
        // The G highest local ranks generate.
        CHECK(rp.role == (lr >= s - G ? Role::kGen : Role::kTrain));
      }
      gen += rp.generates();
      train += rp.trains();
    }
    CHECK(gen == (G == 0 ? s : G));
    CHECK(train == (G == 0 ? s : s - G));
  }
  // Engines: tp ranks, all on one node, engine ranks 0..tp-1, every generating rank in exactly one.
  std::set<int> in_engine;
  for (int e = 0; e < p.num_engines(); ++e) {
    const auto& eng = p.engines[static_cast<size_t>(e)];
    REQUIRE(static_cast<int>(eng.size()) == tp);
    for (int j = 0; j < tp; ++j) {
      const RankPlacement& rp = p.ranks[static_cast<size_t>(eng[static_cast<size_t>(j)])];
      CHECK(node_of_rank[static_cast<size_t>(rp.rank)] ==
            node_of_rank[static_cast<size_t>(eng[0])]);
      CHECK(rp.node == p.ranks[static_cast<size_t>(eng[0])].node);
      CHECK(rp.engine == e);
      CHECK(rp.engine_rank == j);
      CHECK(rp.generates());
      CHECK(in_engine.insert(rp.rank).second);
    }
  }
  int train_rank = 0;
  for (const auto& rp : p.ranks) {
    CHECK((rp.engine >= 0) == rp.generates());
    CHECK(in_engine.count(rp.rank) == static_cast<size_t>(rp.generates()));
    CHECK(rp.train_rank == (rp.trains() ? train_rank++ : -1));
  }
  CHECK(static_cast<int>(p.train_ranks.size()) == train_rank);
  CHECK(!p.train_ranks.empty());
  CHECK(p.num_engines() > 0);
}

std::vector<int> consecutive_nodes(const std::vector<int>& sizes) {
  std::vector<int> ids;
  for (size_t k = 0; k < sizes.size(); ++k)
    ids.insert(ids.end(), static_cast<size_t>(sizes[k]), static_cast<int>(k) * 10 + 3);
  return ids;
}

}  // namespace

TEST_CASE("plan: balanced nodes, disaggregated and colocated") {
  struct Case {
    std::vector<int> sizes;
    int G, tp;
  };
  for (const Case& c : std::vector<Case>{{{4, 4}, 2, 2},
                                         {{4, 4}, 0, 4},
                                         {{4, 4}, 0, 2},
                                         {{8, 8, 8}, 4, 2},
                                         {{8, 8, 8}, 6, 3},
                                         {{2}, 1, 1},
                                         {{1}, 0, 1},
                                         {{2, 2}, 0, 1}}) {
    auto ids = consecutive_nodes(c.sizes);
    CAPTURE(ids.size());
    CAPTURE(c.G);
    CAPTURE(c.tp);
    Placement p = plan_placement(static_cast<int>(ids.size()), ids, {}, {0, c.G, c.tp});
    check_rules(p, ids, c.G, c.tp);
    CHECK(p.warning.empty());
    int gen_total = 0;
    for (int s : c.sizes) gen_total += c.G == 0 ? s : c.G;
    CHECK(p.num_engines() == gen_total / c.tp);
  }
  // The example of DESIGN §2: 2 nodes of 4, 2 generation ranks per node, tp 2.
  auto ids = consecutive_nodes({4, 4});
  Placement p = plan_placement(8, ids, {}, {0, 2, 2});
  CHECK(p.engines == std::vector<std::vector<int>>{{2, 3}, {6, 7}});
  CHECK(p.train_ranks == std::vector<int>{0, 1, 4, 5});
  CHECK(p.gen_ranks == std::vector<int>{2, 3, 6, 7});
}

TEST_CASE("plan: simulated nodes from ranks_per_node, last node smaller") {
  // 15 ranks on one host, 8 per simulated node: nodes of 8 and 7.
  Placement p = plan_placement(15, {}, std::vector<std::string>(15, "h"), {8, 1, 1});
  std::vector<int> ids(15);
  for (int r = 0; r < 15; ++r) ids[static_cast<size_t>(r)] = r / 8;
  check_rules(p, ids, 1, 1);
  CHECK(p.node_sizes == std::vector<int>{8, 7});
  CHECK(p.engines == std::vector<std::vector<int>>{{7}, {14}});
  CHECK(p.options.ranks_per_node == 8);
  CHECK(p.warning.find("[8, 7]") != std::string::npos);
}

TEST_CASE("plan: uneven nodes (7 then 8) are placed and the imbalance reported") {
  auto ids = consecutive_nodes({7, 8});
  Placement p = plan_placement(15, ids, {}, {0, 1, 1});
  check_rules(p, ids, 1, 1);
  CHECK(p.node_sizes == std::vector<int>{7, 8});
  CHECK(p.warning.find("warning") == 0);
  CHECK(p.warning.find("ranks per node [7, 8]") != std::string::npos);
  CHECK(p.warning.find("training ranks per node [6, 7]") != std::string::npos);

  Placement q = plan_placement(15, ids, {}, {0, 2, 2});
  check_rules(q, ids, 2, 2);
  CHECK(q.engines == std::vector<std::vector<int>>{{5, 6}, {13, 14}});

  // Colocated with tp 2: node 0's 7 ranks cannot be cut into engines of 2.
  CHECK_THROWS_WITH_AS(
      plan_placement(15, ids, {}, {0, 0, 2}),
      doctest::Contains("node 0 (node0): in colocated mode (--gen_ranks_per_node 0) "
                        "all 7 ranks of a node generate, and 7 is not a multiple of "
                        "2; an engine never spans nodes\nhint: "),
      rlhf::Error);
  try {
    plan_placement(15, ids, {}, {0, 0, 2});
  } catch (const rlhf::Error& e) {
    std::string m = e.what();
    CHECK(m.find("--vllm_tensor_parallel_size [1] works") != std::string::npos);
    CHECK(m.find("--gen_ranks_per_node to one of [2, 4, 6]") != std::string::npos);
  }
  // Colocated with tp 1 works.
  check_rules(plan_placement(15, ids, {}, {0, 0, 1}), ids, 0, 1);
}

TEST_CASE("plan: engines follow node ids, not rank arithmetic (round-robin rank mapping)") {
  // mpirun --map-by node: ranks alternate between two hosts.
  std::vector<std::string> hosts;
  std::vector<int> ids;
  for (int r = 0; r < 8; ++r) {
    hosts.push_back(r % 2 ? "hostB" : "hostA");
    ids.push_back(r % 2);
  }
  Placement p = plan_placement(8, {}, hosts, {0, 2, 2});
  check_rules(p, ids, 2, 2);
  CHECK(p.engines == std::vector<std::vector<int>>{{4, 6}, {5, 7}});
  CHECK(p.ranks[4].host == "hostA");
  CHECK(p.ranks[5].host == "hostB");
  // Same from explicit node ids (any integers).
  Placement q = plan_placement(8, {9, 4, 9, 4, 9, 4, 9, 4}, {}, {0, 2, 2});
  CHECK(q.engines == p.engines);
  CHECK(q.ranks[1].node == 1);  // nodes numbered by their lowest rank
}

TEST_CASE("plan: a node may be generation-only if another node trains") {
  auto ids = consecutive_nodes({4, 8});
  Placement p = plan_placement(12, ids, {}, {0, 4, 2});
  check_rules(p, ids, 4, 2);
  CHECK(p.train_ranks == std::vector<int>{4, 5, 6, 7});
  CHECK(p.num_engines() == 4);
}

TEST_CASE("plan: impossible placements are refused with why and what would work") {
  auto ids = consecutive_nodes({4, 4});
  // G not a multiple of tp.
  CHECK_THROWS_WITH_AS(plan_placement(8, ids, {}, {0, 2, 3}),
                       doctest::Contains("its 2 generation ranks (--gen_ranks_per_node) are not a "
                                         "multiple of 3; an engine never spans nodes\nhint: "
                                         "with these generation ranks per node, "
                                         "--vllm_tensor_parallel_size [1, 2] works"),
                       rlhf::Error);
  // tp larger than a node: would need an engine across nodes.
  CHECK_THROWS_WITH_AS(plan_placement(8, ids, {}, {0, 0, 8}),
                       doctest::Contains("4 is not a multiple of 8"), rlhf::Error);
  CHECK_THROWS_WITH_AS(plan_placement(8, ids, {}, {0, 0, 8}),
                       doctest::Contains("no node has room for 8 generation ranks"), rlhf::Error);
  // G larger than a node.
  CHECK_THROWS_WITH_AS(plan_placement(8, ids, {}, {0, 5, 1}),
                       doctest::Contains("node 0 (node0) holds 4 ranks, fewer than "
                                         "--gen_ranks_per_node 5\nhint: "),
                       rlhf::Error);
  // Every rank generates: no training rank.
  CHECK_THROWS_WITH_AS(plan_placement(8, ids, {}, {0, 4, 1}),
                       doctest::Contains("no rank trains: --gen_ranks_per_node 4 makes every rank "
                                         "of every node a generation rank (ranks per node: [4, "
                                         "4])\nhint: use --gen_ranks_per_node at most 3"),
                       rlhf::Error);
  CHECK_THROWS_WITH_AS(plan_placement(1, {}, {}, {0, 1, 1}), doctest::Contains("no rank trains"),
                       rlhf::Error);
  // One rank per node: no "at most 0" advice, no "all 1 ranks".
  try {
    plan_placement(1, {}, {}, {0, 1, 1});
  } catch (const rlhf::Error& e) {
    CHECK(std::string(e.what()).find("at most 0") == std::string::npos);
    CHECK(std::string(e.what()).find("use --gen_ranks_per_node 0") != std::string::npos);
  }
  try {
    plan_placement(2, {}, {}, {1, 0, 2});
    FAIL("a 1-rank node cannot hold an engine of 2");
  } catch (const rlhf::Error& e) {
    CHECK(std::string(e.what()).find("the 1 rank of a node generates") != std::string::npos);
    CHECK(std::string(e.what()).find("all 1 ranks") == std::string::npos);
  }
  // A simulated node across two hosts.
  std::vector<std::string> hosts = {"a", "a", "a", "b", "b", "b"};
  CHECK_THROWS_WITH_AS(plan_placement(6, {}, hosts, {2, 0, 1}),
                       doctest::Contains("puts ranks 2..3 into one simulated node, but rank 2 runs "
                                         "on a and rank 3 on b: a node cannot span real nodes"),
                       rlhf::Error);
  CHECK_NOTHROW(plan_placement(6, {}, hosts, {3, 0, 1}));
  // Options out of range and inconsistent inputs.
  CHECK_THROWS_WITH_AS(plan_placement(8, ids, {}, {0, 0, 0}),
                       doctest::Contains("--vllm_tensor_parallel_size must be >= 1"), rlhf::Error);
  CHECK_THROWS_WITH_AS(plan_placement(8, ids, {}, {0, -1, 1}),
                       doctest::Contains("--gen_ranks_per_node must be >= 0"), rlhf::Error);
  CHECK_THROWS_WITH_AS(plan_placement(8, ids, {}, {-2, 0, 1}),
                       doctest::Contains("--ranks_per_node must be >= 0"), rlhf::Error);
  CHECK_THROWS_AS(plan_placement(7, ids, {}, {0, 0, 1}), rlhf::Error);
  CHECK_THROWS_AS(plan_placement(0, {}, {}, {0, 0, 1}), rlhf::Error);
}

TEST_CASE("plan: the placement table") {
  Placement p = plan_placement(4, {}, {"alpha", "alpha", "beta", "beta"}, {0, 1, 1});
  std::string t = format_placement_table(p);
  CHECK(t ==
        " rank  host   node  local_rank  role   engine  tp_rank\n"
        "    0  alpha     0           0  train       -        -\n"
        "    1  alpha     0           1  gen         0        0\n"
        "    2  beta      1           0  train       -        -\n"
        "    3  beta      1           1  gen         1        0\n");
  Placement u = plan_placement(3, {0, 0, 1}, {}, {0, 0, 1});
  std::string tu = format_placement_table(u);
  CHECK(tu.find("node1") != std::string::npos);
  CHECK(tu.substr(tu.rfind("warning")) ==
        "warning: nodes hold different numbers of ranks: ranks per node [2, 1], training ranks per "
        "node [2, 1], engines per node [2, 1]\n");
}

TEST_CASE("plan: ranks per node from the environment") {
  const char* old = std::getenv("RLHF_RANKS_PER_NODE");
  std::string saved = old ? old : "";
  setenv("RLHF_RANKS_PER_NODE", "3", 1);
  CHECK(resolve_ranks_per_node(0) == 3);
  CHECK(resolve_ranks_per_node(5) == 5);
  setenv("RLHF_RANKS_PER_NODE", "two", 1);
  CHECK_THROWS_WITH_AS(resolve_ranks_per_node(0), doctest::Contains("RLHF_RANKS_PER_NODE='two'"),
                       rlhf::Error);
  unsetenv("RLHF_RANKS_PER_NODE");
  CHECK(resolve_ranks_per_node(0) == 0);
  if (old) setenv("RLHF_RANKS_PER_NODE", saved.c_str(), 1);
}
