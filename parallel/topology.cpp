#include "parallel/topology.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <map>
#include <numeric>
#include <string>

#include "core/error.h"
#include "parallel/mpi_check.h"
#include "parallel/watchdog.h"

namespace rlhf::parallel {

namespace {

// "[a, b, c]"
template <typename T>
std::string list_str(const std::vector<T>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + fmt::format("{}", v[i]);
  return s + "]";
}

// Dense ids 0..k-1 in order of first appearance (= order of the lowest rank holding each key).
template <typename Key>
std::vector<int> dense_ids(const std::vector<Key>& keys) {
  std::map<Key, int> seen;
  std::vector<int> out(keys.size());
  for (size_t r = 0; r < keys.size(); ++r) {
    auto it = seen.find(keys[r]);
    if (it == seen.end()) it = seen.emplace(keys[r], static_cast<int>(seen.size())).first;
    out[r] = it->second;
  }
  return out;
}

// The hint for a generation-rank count that is not a multiple of tp.
std::string tp_hint(const std::vector<int>& node_sizes, const std::vector<int>& gen_counts, int tp,
                    int G) {
  int g = 0;
  for (int c : gen_counts) g = std::gcd(g, c);
  std::vector<int> tps;
  for (int t = 1; t <= g; ++t)
    if (g % t == 0) tps.push_back(t);
  int min_size = *std::min_element(node_sizes.begin(), node_sizes.end());
  std::vector<int> gs;
  for (int k = tp; k <= min_size - 1; k += tp) gs.push_back(k);
  std::string hint = fmt::format(
      "\nhint: with these generation ranks per node, "
      "--vllm_tensor_parallel_size {} works",
      list_str(tps));
  if (!gs.empty()) {
    hint += fmt::format("; or keep {} and set --gen_ranks_per_node to one of {}", tp, list_str(gs));
  } else {
    hint += fmt::format(
        "; no node has room for {} generation ranks plus a training rank (the "
        "smallest node holds {} ranks)",
        tp, min_size);
  }
  bool colocated_ok =
      std::all_of(node_sizes.begin(), node_sizes.end(), [&](int s) { return s % tp == 0; });
  if (G > 0 && colocated_ok) hint += "; or --gen_ranks_per_node 0 (colocated)";
  return hint;
}

}  // namespace

const char* role_name(Role role) {
  switch (role) {
    case Role::kTrain:
      return "train";
    case Role::kGen:
      return "gen";
    case Role::kBoth:
      return "both";
  }
  return "?";
}

int resolve_ranks_per_node(int option) {
  RLHF_CHECK(option >= 0, "--ranks_per_node must be >= 0, got {}", option);
  if (option > 0) return option;
  const char* env = std::getenv("RLHF_RANKS_PER_NODE");
  if (env == nullptr || *env == '\0') return 0;
  char* end = nullptr;
  long v = std::strtol(env, &end, 10);
  RLHF_CHECK(end != env && *end == '\0' && v >= 0 && v <= 1 << 20,
             "environment variable RLHF_RANKS_PER_NODE='{}' is not an integer >= 0\nhint: unset it "
             "to use the real nodes, or set it to the number of ranks per simulated node",
             env);
  return static_cast<int>(v);
}

Placement plan_placement(int world_size, const std::vector<int>& node_of_rank,
                         const std::vector<std::string>& host_of_rank,
                         const TopologyOptions& opts) {
  const int W = world_size, G = opts.gen_ranks_per_node, tp = opts.tensor_parallel;
  const int rpn = opts.ranks_per_node;
  RLHF_CHECK(W >= 1, "topology: world size must be >= 1, got {}", W);
  RLHF_CHECK(tp >= 1, "--vllm_tensor_parallel_size must be >= 1, got {}", tp);
  RLHF_CHECK(G >= 0, "--gen_ranks_per_node must be >= 0 (0 = colocated), got {}", G);
  RLHF_CHECK(rpn >= 0, "--ranks_per_node must be >= 0 (0 = real nodes), got {}", rpn);
  RLHF_CHECK(node_of_rank.empty() || static_cast<int>(node_of_rank.size()) == W,
             "topology: {} node ids for {} ranks", node_of_rank.size(), W);
  RLHF_CHECK(host_of_rank.empty() || static_cast<int>(host_of_rank.size()) == W,
             "topology: {} host names for {} ranks", host_of_rank.size(), W);

  // --- real nodes
  std::vector<int> real(static_cast<size_t>(W), 0);
  if (!node_of_rank.empty()) {
    real = dense_ids(node_of_rank);
  } else if (!host_of_rank.empty()) {
    real = dense_ids(host_of_rank);
  }
  auto host = [&](int r) {
    return host_of_rank.empty() ? fmt::format("node{}", real[static_cast<size_t>(r)])
                                : host_of_rank[static_cast<size_t>(r)];
  };

  // --- nodes used for placement (real or simulated)
  std::vector<int> node(static_cast<size_t>(W));
  if (rpn > 0) {
    for (int r = 0; r < W; ++r) node[static_cast<size_t>(r)] = r / rpn;
    for (int r = 1; r < W; ++r) {
      if (node[r] == node[r - 1] && real[r] != real[r - 1]) {
        int first = node[r] * rpn, last = std::min(W, first + rpn) - 1;
        std::vector<int> per_real(static_cast<size_t>(*std::max_element(real.begin(), real.end())) +
                                  1);
        for (int x : real) ++per_real[static_cast<size_t>(x)];
        RLHF_FAIL(
            "--ranks_per_node {} (or RLHF_RANKS_PER_NODE) puts ranks {}..{} into one simulated "
            "node, but rank {} runs on {} and rank {} on {}: a node cannot span real nodes\nhint: "
            "use a --ranks_per_node that divides the number of ranks of every real node (ranks "
            "per real node: {}), or 0 to use the real nodes",
            rpn, first, last, r - 1, host(r - 1), r, host(r), list_str(per_real));
      }
    }
  } else {
    node = real;
  }
  const int num_nodes = *std::max_element(node.begin(), node.end()) + 1;

  Placement p;
  p.options = opts;
  p.node_sizes.assign(static_cast<size_t>(num_nodes), 0);
  p.ranks.resize(static_cast<size_t>(W));
  for (int r = 0; r < W; ++r) {
    RankPlacement& rp = p.ranks[static_cast<size_t>(r)];
    rp.rank = r;
    rp.host = host(r);
    rp.node = node[static_cast<size_t>(r)];
    rp.local_rank = p.node_sizes[static_cast<size_t>(rp.node)]++;
  }
  std::vector<std::vector<int>> node_members(static_cast<size_t>(num_nodes));
  for (int r = 0; r < W; ++r) node_members[static_cast<size_t>(node[r])].push_back(r);
  auto node_host = [&](int k) { return host(node_members[static_cast<size_t>(k)][0]); };
  const int min_size = *std::min_element(p.node_sizes.begin(), p.node_sizes.end());

  // --- roles
  for (int k = 0; k < num_nodes; ++k) {
    int s = p.node_sizes[static_cast<size_t>(k)];
    RLHF_CHECK(G <= s,
               "node {} ({}) holds {} ranks, fewer than --gen_ranks_per_node {}\nhint: "
               "--gen_ranks_per_node must be at most the smallest node's rank count ({}){}; 0 = "
               "colocated (every rank trains and generates)",
               k, node_host(k), s, G, min_size,
               min_size > 1
                   ? fmt::format("; at most {} leaves a training rank on every node", min_size - 1)
                   : std::string());
  }
  std::vector<int> gen_counts(static_cast<size_t>(num_nodes));
  for (int k = 0; k < num_nodes; ++k)
    gen_counts[static_cast<size_t>(k)] = G > 0 ? G : p.node_sizes[static_cast<size_t>(k)];
  if (G > 0) {
    bool any_train =
        std::any_of(p.node_sizes.begin(), p.node_sizes.end(), [&](int s) { return s > G; });
    RLHF_CHECK(any_train,
               "no rank trains: --gen_ranks_per_node {} makes every rank of every node a "
               "generation rank (ranks per node: {})\nhint: {}",
               G, list_str(p.node_sizes),
               min_size > 1 ? fmt::format("use --gen_ranks_per_node at most {} (a multiple of "
                                          "--vllm_tensor_parallel_size {}), or 0 (colocated: "
                                          "every rank trains and generates)",
                                          min_size - 1, tp)
                            : std::string("with one rank per node, use --gen_ranks_per_node 0 "
                                          "(colocated: every rank trains and generates), or "
                                          "more ranks per node"));
  }
  for (int k = 0; k < num_nodes; ++k) {
    int s = p.node_sizes[static_cast<size_t>(k)], g = gen_counts[static_cast<size_t>(k)];
    if (g % tp == 0) continue;
    if (G == 0) {
      RLHF_FAIL(
          "cannot cut generation engines of --vllm_tensor_parallel_size {} from node {} ({}): "
          "in colocated mode (--gen_ranks_per_node 0) {} of a node generate{}, and "
          "{} is not a multiple of {}; an engine never spans nodes{}",
          tp, k, node_host(k), s == 1 ? std::string("the 1 rank") : fmt::format("all {} ranks", s),
          s == 1 ? "s" : "", s, tp, tp_hint(p.node_sizes, gen_counts, tp, G));
    }
    RLHF_FAIL(
        "cannot cut generation engines of --vllm_tensor_parallel_size {} from node {} ({}): "
        "its {} generation ranks (--gen_ranks_per_node) are not a multiple of {}; an engine "
        "never spans nodes{}",
        tp, k, node_host(k), g, tp, tp_hint(p.node_sizes, gen_counts, tp, G));
  }
  for (auto& rp : p.ranks) {
    int s = p.node_sizes[static_cast<size_t>(rp.node)];
    rp.role = G == 0 ? Role::kBoth : (rp.local_rank >= s - G ? Role::kGen : Role::kTrain);
    if (rp.trains()) {
      rp.train_rank = static_cast<int>(p.train_ranks.size());
      p.train_ranks.push_back(rp.rank);
    }
    if (rp.generates()) p.gen_ranks.push_back(rp.rank);
  }

  // --- engines: tp consecutive generation ranks of one node, in local-rank order
  for (int k = 0; k < num_nodes; ++k) {
    std::vector<int> gen;
    for (int r : node_members[static_cast<size_t>(k)])
      if (p.ranks[static_cast<size_t>(r)].generates()) gen.push_back(r);
    RLHF_ASSERT(gen.size() % static_cast<size_t>(tp) == 0);
    for (size_t i = 0; i < gen.size(); i += static_cast<size_t>(tp)) {
      int e = p.num_engines();
      p.engines.emplace_back(gen.begin() + static_cast<std::ptrdiff_t>(i),
                             gen.begin() + static_cast<std::ptrdiff_t>(i) + tp);
      for (int j = 0; j < tp; ++j) {
        RankPlacement& rp = p.ranks[static_cast<size_t>(gen[i + static_cast<size_t>(j)])];
        rp.engine = e;
        rp.engine_rank = j;
      }
    }
  }
  RLHF_CHECK(!p.train_ranks.empty(), "no rank trains (world of {} ranks)", W);
  RLHF_CHECK(p.num_engines() > 0,
             "no generation engine can be placed (world of {} ranks, --gen_ranks_per_node {}, "
             "--vllm_tensor_parallel_size {})",
             W, G, tp);

  // --- imbalance report
  if (min_size != *std::max_element(p.node_sizes.begin(), p.node_sizes.end())) {
    std::vector<int> train_per_node(static_cast<size_t>(num_nodes)),
        engines_per_node(static_cast<size_t>(num_nodes));
    for (const auto& rp : p.ranks) {
      if (rp.trains()) ++train_per_node[static_cast<size_t>(rp.node)];
      if (rp.engine_rank == 0) ++engines_per_node[static_cast<size_t>(rp.node)];
    }
    p.warning = fmt::format(
        "warning: nodes hold different numbers of ranks: ranks per node {}, training ranks per "
        "node {}, engines per node {}",
        list_str(p.node_sizes), list_str(train_per_node), list_str(engines_per_node));
  }
  return p;
}

std::string format_placement_table(const Placement& placement) {
  size_t hw = 4;
  for (const auto& rp : placement.ranks) hw = std::max(hw, rp.host.size());
  std::string out = fmt::format("{:>5}  {:<{}}  {:>4}  {:>10}  {:<5}  {:>6}  {:>7}\n", "rank",
                                "host", hw, "node", "local_rank", "role", "engine", "tp_rank");
  for (const auto& rp : placement.ranks) {
    std::string e = rp.engine >= 0 ? std::to_string(rp.engine) : "-";
    std::string er = rp.engine_rank >= 0 ? std::to_string(rp.engine_rank) : "-";
    out += fmt::format("{:>5}  {:<{}}  {:>4}  {:>10}  {:<5}  {:>6}  {:>7}\n", rp.rank, rp.host, hw,
                       rp.node, rp.local_rank, role_name(rp.role), e, er);
  }
  if (!placement.warning.empty()) out += placement.warning + "\n";
  return out;
}

// ---------------------------------------------------------------------------------------------
// Topology

void Topology::free_all() noexcept {
  free_comm_quietly(&engine_);
  free_comm_quietly(&gen_);
  free_comm_quietly(&train_);
  free_comm_quietly(&node_);
  free_comm_quietly(&world_);
}

Topology::~Topology() {
  free_all();
}

Placement plan_world_placement(MPI_Comm world, const TopologyOptions& opts) {
  WatchScope watch("placement planning", "world");
  int rank = 0, W = 0;
  MPI_CHECK(MPI_Comm_rank(world, &rank));
  MPI_CHECK(MPI_Comm_size(world, &W));

  // Real node: the lowest world rank of this rank's shared-memory communicator.
  MPI_Comm shm = MPI_COMM_NULL;
  MPI_CHECK(MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &shm));
  int leader = rank;
  int rc = MPI_Allreduce(MPI_IN_PLACE, &leader, 1, MPI_INT, MPI_MIN, shm);
  MPI_Comm_free(&shm);
  MPI_CHECK(rc);
  std::vector<int> leaders(static_cast<size_t>(W));
  MPI_CHECK(MPI_Allgather(&leader, 1, MPI_INT, leaders.data(), 1, MPI_INT, world));

  // Host names.
  char name[MPI_MAX_PROCESSOR_NAME] = {0};
  int len = 0;
  MPI_CHECK(MPI_Get_processor_name(name, &len));
  std::vector<char> names(static_cast<size_t>(W) * MPI_MAX_PROCESSOR_NAME);
  MPI_CHECK(MPI_Allgather(name, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, names.data(),
                          MPI_MAX_PROCESSOR_NAME, MPI_CHAR, world));
  std::vector<std::string> hosts(static_cast<size_t>(W));
  for (int r = 0; r < W; ++r) {
    const char* s = names.data() + static_cast<size_t>(r) * MPI_MAX_PROCESSOR_NAME;
    hosts[static_cast<size_t>(r)] = std::string(s, strnlen(s, MPI_MAX_PROCESSOR_NAME));
  }

  // Plan: the same input on every rank, so a refusal throws the same error everywhere.
  TopologyOptions resolved = opts;
  resolved.ranks_per_node = resolve_ranks_per_node(opts.ranks_per_node);
  return plan_placement(W, leaders, hosts, resolved);
}

Topology::Topology(MPI_Comm world, const TopologyOptions& opts) {
  WatchScope watch("placement setup", "world");
  try {
    MPI_CHECK(MPI_Comm_dup(world, &world_));
    MPI_CHECK(MPI_Comm_rank(world_, &rank_));
    plan_ = plan_world_placement(world_, opts);
    // This rank's real node (the lowest world rank of its shared-memory communicator), for the
    // check below that an engine does not span real nodes.
    MPI_Comm shm = MPI_COMM_NULL;
    MPI_CHECK(MPI_Comm_split_type(world_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &shm));
    int leader = rank_;
    const int rc = MPI_Allreduce(MPI_IN_PLACE, &leader, 1, MPI_INT, MPI_MIN, shm);
    MPI_Comm_free(&shm);
    MPI_CHECK(rc);
    const RankPlacement& m = me();

    // Splits: every rank takes part in every split, in the same order.
    MPI_CHECK(MPI_Comm_split(world_, m.node, rank_, &node_));
    MPI_CHECK(MPI_Comm_split(world_, m.trains() ? 0 : MPI_UNDEFINED, rank_, &train_));
    MPI_CHECK(MPI_Comm_split(world_, m.generates() ? 0 : MPI_UNDEFINED, rank_, &gen_));
    MPI_CHECK(
        MPI_Comm_split(node_, m.engine >= 0 ? m.engine : MPI_UNDEFINED, m.engine_rank, &engine_));

    // Check the splits against the plan; every engine's ranks must share one node (simulated and
    // real): MPI_Allreduce of (max node, max -node) over engine_comm.
    int bad = 0;
    int node_rank = -1, node_size = -1;
    MPI_CHECK(MPI_Comm_rank(node_, &node_rank));
    MPI_CHECK(MPI_Comm_size(node_, &node_size));
    if (node_rank != m.local_rank || node_size != plan_.node_sizes[static_cast<size_t>(m.node)])
      bad |= 1;
    if (train_ != MPI_COMM_NULL) {
      int tr = -1;
      MPI_CHECK(MPI_Comm_rank(train_, &tr));
      if (tr != m.train_rank) bad |= 1;
    }
    if (engine_ != MPI_COMM_NULL) {
      int ids[4] = {m.node, -m.node, leader, -leader};
      int ext[4] = {0, 0, 0, 0};
      MPI_CHECK(MPI_Allreduce(ids, ext, 4, MPI_INT, MPI_MAX, engine_));
      if (ext[0] != -ext[1] || ext[2] != -ext[3]) bad |= 2;  // min != max: spans nodes
      int er = -1, es = -1;
      MPI_CHECK(MPI_Comm_rank(engine_, &er));
      MPI_CHECK(MPI_Comm_size(engine_, &es));
      if (er != m.engine_rank || es != plan_.options.tensor_parallel) bad |= 1;
    }
    int any_bad = 0;
    MPI_CHECK(MPI_Allreduce(&bad, &any_bad, 1, MPI_INT, MPI_BOR, world_));
    RLHF_CHECK(!(any_bad & 2),
               "topology check failed: a generation engine's ranks do not share one node after the "
               "split (this rank: engine {}, node {})",
               m.engine, m.node);
    RLHF_CHECK(any_bad == 0,
               "topology check failed: a communicator split disagrees with the placement plan "
               "(this rank {}: node {} local_rank {}, engine {} tp_rank {})",
               rank_, m.node, m.local_rank, m.engine, m.engine_rank);
  } catch (...) {
    free_all();
    throw;
  }
}

std::string Topology::placement_table() const {
  // What this rank observes: node_comm rank, engine_comm rank, role, node.
  int rec[5] = {plan_.ranks[static_cast<size_t>(rank_)].node, -1, static_cast<int>(me().role), -1,
                -1};
  MPI_CHECK(MPI_Comm_rank(node_, &rec[1]));
  if (engine_ != MPI_COMM_NULL) {
    rec[3] = me().engine;
    MPI_CHECK(MPI_Comm_rank(engine_, &rec[4]));
  }
  std::vector<int> all(rank_ == 0 ? static_cast<size_t>(size()) * 5 : 0);
  MPI_CHECK(MPI_Gather(rec, 5, MPI_INT, all.data(), 5, MPI_INT, 0, world_));
  if (rank_ != 0) return "";
  Placement observed = plan_;
  for (int r = 0; r < size(); ++r) {
    RankPlacement& rp = observed.ranks[static_cast<size_t>(r)];
    const int* x = all.data() + static_cast<size_t>(r) * 5;
    rp.node = x[0];
    rp.local_rank = x[1];
    rp.role = static_cast<Role>(x[2]);
    rp.engine = x[3];
    rp.engine_rank = x[4];
    const RankPlacement& pp = plan_.ranks[static_cast<size_t>(r)];
    RLHF_CHECK(rp.node == pp.node && rp.local_rank == pp.local_rank && rp.role == pp.role &&
                   rp.engine == pp.engine && rp.engine_rank == pp.engine_rank,
               "placement table: rank {} reports node {} local_rank {} engine {} tp_rank {}, the "
               "plan says node {} local_rank {} engine {} tp_rank {}",
               r, rp.node, rp.local_rank, rp.engine, rp.engine_rank, pp.node, pp.local_rank,
               pp.engine, pp.engine_rank);
  }
  return format_placement_table(observed);
}

}  // namespace rlhf::parallel
