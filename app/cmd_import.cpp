// `rlhf import`: converts any model --pretrain reads (Hugging Face folder, llama2.c, GGUF, HDF5)
// into our HDF5 checkpoint, with the tokenizer (the model's own, or --tokenizer) stored under
// /tokenizer. Runs on rank 0; other ranks return at once.
#include <mpi.h>

#include <filesystem>

#include "app/commands.h"
#include "app/runtime.h"
#include "core/error.h"
#include "core/log.h"
#include "io/pretrained.h"

namespace rlhf::app {

int run_import(const ImportArgs& args) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank != 0) return 0;
  const io::PretrainedModel m = io::open_pretrained_arg(args.pretrain, args.tokenizer);
  LOG0_INFO("import: {}", m.describe());
  std::string out = args.output_path;
  if (std::filesystem::is_directory(out)) out = (std::filesystem::path(out) / "model.h5").string();
  std::error_code ec;
  RLHF_CHECK(!(std::filesystem::exists(out) && std::filesystem::equivalent(out, m.path, ec)),
             "--output_path {} is the model being read", out);
  io::export_hdf5(out, m);
  LOG0_INFO("wrote {}: {} {} parameters, RoPE {}{}", out, m.config.model_type,
            m.config.num_parameters(m.head), model::to_string(m.config.rope_style),
            m.tokenizer ? fmt::format(", tokenizer {}", m.tokenizer->name()) : ", no tokenizer");
  if (!m.tokenizer)
    LOG0_INFO("hint: the model carries no tokenizer; give one with --tokenizer to store it");
  return 0;
}

}  // namespace rlhf::app
