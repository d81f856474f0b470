// Process-level set-up shared by the subcommands: threads per rank, model construction and
// initialisation (random or from a checkpoint).
#pragma once

#include <cstdint>
#include <string>

#include "app/cli.h"
#include "model/config.h"
#include "model/layout.h"
#include "optim/adamw.h"
#include "parallel/comm.h"
#include "parallel/param_store.h"
#include "parallel/topology.h"

namespace rlhf::app {

/// Sets the OpenMP (and OpenBLAS) thread count of this rank: `threads` if > 0, else the node's
/// hardware threads divided by the ranks on this node (at least 1). Returns the count used.
int configure_threads(int threads);

/// Where a model comes from: a config for random init, or a checkpoint.
struct ModelSource {
  model::ModelConfig config;
  model::HeadKind head = model::HeadKind::kLM;
  std::string checkpoint;  ///< HDF5 file to load weights from; "" = random init
  std::string describe() const;
};

/// Resolves --model_config / --pretrain. A --pretrain directory means `<dir>/model.h5`.
/// Throws rlhf::Error naming the flag when the file is missing or unreadable, or when the
/// checkpoint's head is not `want_head`.
ModelSource resolve_model_source(const ModelArgs& args, model::HeadKind want_head);

/// Fills the store's master weights: from the checkpoint (shapes checked) or a deterministic random
/// init with `seed` (the same weights for any rank count).
void initialize_weights(parallel::ParamStore& store, const ModelSource& src, uint64_t seed);

/// Writes the store's consolidated model to `path` (HDF5, .tmp + rename) from rank 0; collective.
/// Returns (and rank 0 logs) a fingerprint of the weights: FNV-1a 64 over the fp32 bytes of every
/// tensor in layout order — equal fingerprints mean bit-identical weights.
uint64_t save_model(parallel::ParamStore& store, const std::string& path, int rank);

/// What a training command runs on: the placement of every rank and the training communicator.
struct TrainRuntime {
  std::unique_ptr<parallel::Topology> topology;
  std::unique_ptr<parallel::Comm> train_comm;  ///< nullptr on ranks that do not train
  int threads = 1;
  int rank() const { return topology->rank(); }
};

/// Builds the topology (collective over MPI_COMM_WORLD; refuses placements that cannot be made,
/// with the reason), prints the placement table on rank 0, sets the thread count, and makes
/// train_comm with --comm_backend. `needs_generation` = false refuses --gen_ranks_per_node > 0
/// (a command that only trains would leave those ranks idle).
TrainRuntime setup_train_runtime(const ParallelArgs& args, int tensor_parallel,
                                 bool needs_generation);

/// The training state for --zero_stage: ZeRO-3 shards (with --adam_offload, --zero_keep_params),
/// or ZeRO-0 replicas (all-reduced gradients), or whole local buffers on a single rank.
/// `layout` must be padded for train_comm's size. Throws rlhf::Error for --adam_offload with
/// --zero_stage 0.
std::unique_ptr<parallel::ParamStore> make_param_store(const model::ParamLayout& layout,
                                                       parallel::Comm& comm, const ZeroArgs& z);

/// Logs this rank's memory (rank 0 prints the max over ranks of each part): params, grads,
/// optimizer, gather buffers, activations and the process's peak resident size.
void log_memory(const parallel::ParamStore& store, int64_t activation_bytes, parallel::Comm& comm);

/// Peak resident set size of this process in bytes (getrusage).
int64_t peak_rss_bytes();

/// AdamW hyper-parameters from --learning_rate (or `lr`), --adam_betas, --l2 (validated).
optim::AdamWConfig make_adamw(const OptimArgs& args, double lr);

/// The shuffled sample order of each epoch: a permutation of [0, n) drawn from (seed, epoch), the
/// same on every rank and for every rank count (OpenRLHF's DistributedSampler with shuffle).
class EpochOrder {
 public:
  EpochOrder(int64_t n, uint64_t seed) : n_(n), seed_(seed) {}
  /// The index at global position `pos` (pos / n is the epoch).
  int64_t at(int64_t pos);

 private:
  int64_t n_;
  uint64_t seed_;
  int64_t epoch_ = -1;
  std::vector<int64_t> order_;
};

/// "12.3 MiB"-style byte count.
std::string format_bytes(double bytes);

}  // namespace rlhf::app
