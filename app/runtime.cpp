#include "app/runtime.h"

#include <nlohmann/json.hpp>

#include <mpi.h>
#include <omp.h>

#include <cblas.h>

#include <filesystem>
#include <thread>
#include <vector>

#include "core/error.h"
#include "core/log.h"
#include "io/hdf5_ckpt.h"
#include "io/model_config_file.h"
#include "model/init.h"

namespace rlhf::app {

int configure_threads(int threads) {
  if (threads <= 0) {
    MPI_Comm node;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
    int local = 1;
    MPI_Comm_size(node, &local);
    MPI_Comm_free(&node);
    const int hw = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    threads = std::max(1, hw / local);
  }
  omp_set_num_threads(threads);
  openblas_set_num_threads(threads);
  return threads;
}

std::string ModelSource::describe() const {
  return checkpoint.empty() ? "random init" : "checkpoint " + checkpoint;
}

ModelSource resolve_model_source(const ModelArgs& args, model::HeadKind want_head) {
  ModelSource src;
  src.head = want_head;
  if (!args.model_config.empty()) {
    RLHF_CHECK(std::filesystem::exists(args.model_config), "--model_config {}: no such file",
               args.model_config);
    src.config = io::load_model_config_file(args.model_config);
    return src;
  }
  std::string path = args.pretrain;
  if (std::filesystem::is_directory(path))
    path = (std::filesystem::path(path) / "model.h5").string();
  RLHF_CHECK(std::filesystem::exists(path), "--pretrain {}: no such file{}", args.pretrain,
             path != args.pretrain ? " (looked for " + path + ")" : "");
  io::StoredModelConfig stored = io::load_model_config_hdf5(path);
  RLHF_CHECK(stored.head == want_head ||
                 (want_head != model::HeadKind::kLM && stored.head == model::HeadKind::kLM),
             "--pretrain {}: the checkpoint has a '{}' head, this command needs '{}'", path,
             model::to_string(stored.head), model::to_string(want_head));
  src.config = stored.config;
  src.checkpoint = path;
  src.head = want_head;
  return src;
}

void initialize_weights(parallel::ParamStore& store, const ModelSource& src, uint64_t seed) {
  const model::ParamLayout& layout = store.layout();
  std::unique_ptr<io::CheckpointReader> reader;
  if (!src.checkpoint.empty()) reader = std::make_unique<io::CheckpointReader>(src.checkpoint);
  std::vector<float> full;
  for (int u = 0; u < layout.num_units(); ++u) {
    const model::UnitLayout& unit = layout.unit(u);
    full.assign(static_cast<size_t>(unit.numel_padded), 0.0f);
    // A checkpoint of an LM supplies the trunk of a value/reward model; its new head is random.
    const bool from_ckpt =
        reader && (unit.kind != model::UnitKind::kHead ||
                   io::load_model_config_hdf5(src.checkpoint).head == layout.head());
    if (from_ckpt) {
      io::load_model_unit_hdf5(*reader, layout, u, full.data());
    } else {
      model::init_unit_params(full.data(), unit, seed);
      if (reader && unit.kind == model::UnitKind::kHead) {
        // Keep the pretrained final norm; only score.weight is new.
        const auto& norm = unit.at("model.norm.weight");
        reader->read_dataset("/model/model.norm.weight", full.data() + norm.offset, norm.shape);
      }
    }
    store.load_unit(u, full.data());
  }
}

void save_model(parallel::ParamStore& store, const std::string& path, int rank) {
  const model::ParamLayout& layout = store.layout();
  std::vector<std::vector<float>> units(static_cast<size_t>(layout.num_units()));
  std::vector<const float*> ptrs;
  for (int u = 0; u < layout.num_units(); ++u) {
    units[size_t(u)].resize(static_cast<size_t>(layout.unit(u).numel_padded));
    store.gather_unit(u, units[size_t(u)].data());
    ptrs.push_back(units[size_t(u)].data());
  }
  if (rank == 0) io::save_model_hdf5(path, layout, ptrs, nlohmann::json::object());
}

std::string format_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int i = 0;
  while (bytes >= 1024.0 && i < 4) {
    bytes /= 1024.0;
    ++i;
  }
  return fmt::format("{:.1f} {}", bytes, units[i]);
}

}  // namespace rlhf::app
