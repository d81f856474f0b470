// Topology: where every rank sits (host, node, local rank), what it does (train, generate or both),
// which generation engine it belongs to, and the MPI communicators that follow from it
// (docs/design.md, "Processes and communicators" and "Errors").
//
// Two layers:
//  - plan_placement(): a pure function (no MPI) from per-rank node ids / host names and the options
//    to the placement of every rank, or an rlhf::Error that says why it cannot be placed and what
//    would work. Tested without MPI.
//  - Topology: built collectively by every rank of a communicator; gathers host names and node ids,
//    calls plan_placement() with the same input on every rank (so a refusal is thrown identically
//    on every rank), splits the communicators, and checks after the splits that every engine's
//    ranks share one node.
//
// Design law: a generation engine (tensor-parallel group) is cut from the generation ranks of ONE
// node, never by rank arithmetic on the world.
#pragma once

#include <mpi.h>

#include <string>
#include <vector>

namespace rlhf::parallel {

// ---------------------------------------------------------------------------------------------
// Planning (pure)

/// Placement options (CLI: --ranks_per_node, --gen_ranks_per_node, --vllm_tensor_parallel_size).
struct TopologyOptions {
  /// > 0: simulate nodes as consecutive groups of this many ranks (the last group may be smaller);
  /// each simulated node must lie inside one real node. 0: use the real nodes
  /// (MPI_Comm_split_type(SHARED)); the Topology constructor also reads env RLHF_RANKS_PER_NODE
  /// when this is 0 (see resolve_ranks_per_node). plan_placement() does not read the environment.
  int ranks_per_node = 0;
  /// G: per node, the G highest local ranks generate and the rest train. 0 = colocated: every rank
  /// trains and generates (time-shared).
  int gen_ranks_per_node = 0;
  /// Ranks per generation engine (tensor parallel size), >= 1.
  int tensor_parallel = 1;
};

/// What a rank does.
enum class Role { kTrain, kGen, kBoth };

/// "train", "gen", "both".
const char* role_name(Role role);

/// The placement of one rank.
struct RankPlacement {
  int rank = 0;        ///< rank in the world communicator
  std::string host;    ///< host name (MPI_Get_processor_name)
  int node = 0;        ///< node id, 0..num_nodes-1, numbered by the lowest rank on the node
  int local_rank = 0;  ///< rank inside its node (ranks of a node in world-rank order)
  Role role = Role::kTrain;
  int engine = -1;  ///< generation engine id (0..num_engines-1), -1 if the rank does not generate
  int engine_rank = -1;  ///< rank inside the engine (tensor-parallel rank), -1 if none
  int train_rank = -1;   ///< rank inside train_comm, -1 if the rank does not train

  bool trains() const { return role != Role::kGen; }
  bool generates() const { return role != Role::kTrain; }
};

/// The placement of every rank, and the summary counts.
struct Placement {
  TopologyOptions options;           ///< as resolved (ranks_per_node is the value used)
  std::vector<RankPlacement> ranks;  ///< indexed by world rank
  std::vector<int> node_sizes;       ///< ranks per node
  std::vector<int> train_ranks;      ///< world ranks that train, ascending (= train_comm order)
  std::vector<int> gen_ranks;        ///< world ranks that generate, ascending (= gen_comm order)
  std::vector<std::vector<int>> engines;  ///< world ranks of engine e, in engine-rank order
  std::string warning;  ///< imbalance report ("" if every node holds the same number of ranks)

  int world_size() const { return static_cast<int>(ranks.size()); }
  int num_nodes() const { return static_cast<int>(node_sizes.size()); }
  int num_engines() const { return static_cast<int>(engines.size()); }
  bool colocated() const { return options.gen_ranks_per_node == 0; }
};

/// Places every rank of a world of `world_size` ranks.
///  - node_of_rank: per world rank, an id of the real (shared-memory) node it runs on (any
///  integers;
///    equal ids = same node). May be empty: then nodes are derived from host_of_rank (equal host
///    name = same node), and if that is empty too, all ranks are on one node.
///  - host_of_rank: per world rank, its host name (for the table and messages); may be empty
///    (hosts are then shown as "node<k>").
///  - opts.ranks_per_node > 0 replaces the real nodes by consecutive groups of that many ranks,
///  each
///    of which must lie inside one real node.
/// Nodes are numbered in order of their lowest rank; local ranks follow world-rank order. Per node
/// the G = opts.gen_ranks_per_node highest local ranks generate (G = 0: all ranks do both);
/// engines of opts.tensor_parallel ranks are cut, in local-rank order, from one node's generation
/// ranks; engine ids run over nodes in node order.
/// Throws rlhf::Error, with a "hint:" line saying what would work, when: an option is out of range,
/// node_of_rank/host_of_rank has the wrong length, a simulated node spans two real nodes, a node
/// holds fewer than G ranks, a node's generation-rank count is not a multiple of tensor_parallel
/// (no engine may span nodes), no rank trains, or no engine results. Nodes of unequal size are
/// accepted and reported in Placement::warning.
Placement plan_placement(int world_size, const std::vector<int>& node_of_rank,
                         const std::vector<std::string>& host_of_rank, const TopologyOptions& opts);

/// Collective over `world`: gathers the real node (shared-memory leader) and host name of every
/// rank, resolves ranks_per_node (resolve_ranks_per_node) and returns plan_placement()'s answer,
/// the same on every rank (a refusal throws the same rlhf::Error everywhere). The Topology
/// constructor plans with it, and so does the usage check at start-up (app/usage_checks.h), so the
/// two cannot disagree.
Placement plan_world_placement(MPI_Comm world, const TopologyOptions& opts);

/// The ranks-per-node value to use: `option` if > 0, else env RLHF_RANKS_PER_NODE if set (must be
/// an integer >= 0; throws rlhf::Error otherwise), else 0 (real nodes).
int resolve_ranks_per_node(int option);

/// The placement table, one line per rank in rank order, columns
/// `rank host node local_rank role engine tp_rank`, then the warning line if any.
std::string format_placement_table(const Placement& placement);

// ---------------------------------------------------------------------------------------------
// Topology (collective)

/// The communicators of one run. Built collectively by every rank of `world` (every rank takes part
/// in every split, in the same order: Megatron's create-all-keep-one). Owns its communicators and
/// frees them in the destructor. Not copyable, not movable.
class Topology {
 public:
  /// Collective over `world` (usually MPI_COMM_WORLD, with MPI_ERRORS_RETURN set). Gathers host
  /// names and real node ids (MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)), resolves ranks_per_node
  /// (resolve_ranks_per_node), plans (plan_placement; a refusal throws the same rlhf::Error on
  /// every rank), splits node_comm, train_comm, gen_comm and engine_comm (engine_comm is split from
  /// node_comm), then checks with MPI_Allreduce(min/max of the node id) over each engine_comm that
  /// its ranks share one node (simulated and real); if any engine fails, every rank throws.
  Topology(MPI_Comm world, const TopologyOptions& opts);
  ~Topology();
  Topology(const Topology&) = delete;
  Topology& operator=(const Topology&) = delete;

  const Placement& placement() const { return plan_; }
  const RankPlacement& me() const { return plan_.ranks[static_cast<size_t>(rank_)]; }
  int rank() const { return rank_; }
  int size() const { return plan_.world_size(); }
  bool trains() const { return me().trains(); }
  bool generates() const { return me().generates(); }

  /// A duplicate of the world communicator given to the constructor (all ranks).
  MPI_Comm world() const { return world_; }
  /// The ranks of this rank's node (simulated or real), ordered by world rank. All ranks.
  MPI_Comm node_comm() const { return node_; }
  /// All training ranks, ordered by world rank; MPI_COMM_NULL on generation-only ranks.
  MPI_Comm train_comm() const { return train_; }
  /// All generating ranks (roles gen and both), ordered by world rank; MPI_COMM_NULL otherwise.
  MPI_Comm gen_comm() const { return gen_; }
  /// This rank's engine, ordered by engine rank; MPI_COMM_NULL on ranks that do not generate.
  MPI_Comm engine_comm() const { return engine_; }

  /// Collective over world(): every rank reports what its communicators actually are (node_comm
  /// rank, engine_comm rank, role), gathered to rank 0 in rank order. Returns on rank 0 the table
  /// (format_placement_table columns) followed by the imbalance warning if any; "" on other
  /// ranks. Throws if a reported value disagrees with the plan.
  std::string placement_table() const;

 private:
  int rank_ = 0;
  Placement plan_;
  MPI_Comm world_ = MPI_COMM_NULL;
  MPI_Comm node_ = MPI_COMM_NULL;
  MPI_Comm train_ = MPI_COMM_NULL;
  MPI_Comm gen_ = MPI_COMM_NULL;
  MPI_Comm engine_ = MPI_COMM_NULL;
  void free_all() noexcept;
};

}  // namespace rlhf::parallel
