// Process-level set-up shared by the subcommands: threads per rank, model construction and
// initialisation (random or from a checkpoint).
#pragma once

#include <cstdint>
#include <string>

#include "app/cli.h"
#include "model/config.h"
#include "model/layout.h"
#include "parallel/param_store.h"

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
void save_model(parallel::ParamStore& store, const std::string& path, int rank);

/// "12.3 MiB"-style byte count.
std::string format_bytes(double bytes);

}  // namespace rlhf::app
