// Training checkpoints, full form: one HDF5 file per checkpoint holding the consolidated model(s),
// their AdamW moments, and the trainer state (step, KL coefficient, data position, seeds), written
// to `<name>.tmp` and renamed (the rename is the commit), with the last --max_ckpt_num kept.
//
// Layout (h5py-readable):
//   /model/<HF name>                 the policy, exactly a model checkpoint (loadable by
//   --pretrain)
//   /<group>/<HF name>               other models (e.g. /critic), attrs config + head
//   /optimizer/<group>/m/<HF name>   AdamW first moments, consolidated (any rank count resumes)
//   /optimizer/<group>/v/<HF name>   AdamW second moments
//   /trainer                         attrs: format, step, the trainer's JSON state ("state")
//   /trainer/async_queue             with --async_train: the rollouts generated ahead, as the
//                                    UTF-8 JSON text of the state's "async_queue" (uint8)
// Moments are stored per tensor, unpadded, so a checkpoint made on N ranks loads on M ranks.
// The sharded form (rl/checkpoint_sharded.h, io/sharded_ckpt.h) keeps this file as the index and
// moves the full-parameter slots' weights and moments to a file per rank.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "io/tokenizer.h"
#include "model/config.h"
#include "model/lora.h"
#include "parallel/param_store.h"

namespace rlhf::parallel {
class Comm;
}  // namespace rlhf::parallel

namespace rlhf::rl {

/// One model in a checkpoint: its group ("model" for the policy), its store, and whether its
/// optimizer moments are saved/loaded.
struct CheckpointSlot {
  std::string group;
  parallel::ParamStore* store = nullptr;
  bool optimizer = true;
};

/// Collective over the stores' communicators (every training rank calls it in the same order);
/// `writer` (true on exactly one rank, e.g. train rank 0) writes the file. With a `tokenizer`, its
/// files go under /tokenizer (io/tokenizer_hdf5.h), so the checkpoint used as --pretrain brings
/// its tokenizer. Prunes older `step_*.h5` files in the directory beyond max_keep (<= 0 keeps all)
/// after the commit, with their Hugging Face folders (hf_checkpoint_dir) and shard folders.
/// With `shard_comm` (the training ranks; `writer` must be its rank 0) the checkpoint is sharded
/// (io/sharded_ckpt.h, --ckpt_format sharded): every rank writes its own shard of each
/// full-parameter slot in parallel, then `writer` writes `path` as the index, last; a kill before
/// that leaves the previous checkpoint the newest. Logs the seconds, bytes and GB/s (rank 0).
void save_train_checkpoint(const std::string& path, const std::vector<CheckpointSlot>& slots,
                           const nlohmann::json& trainer_state, bool writer, int max_keep,
                           const io::Tokenizer* tokenizer = nullptr,
                           parallel::Comm* shard_comm = nullptr);

/// The adapters of a LoRA training checkpoint (save_train_checkpoint of a LoRA store): the model
/// config, the LoRA settings and the flat adapter buffer (model::LoraLayout of both).
struct LoraCheckpoint {
  model::ModelConfig config;
  model::LoraConfig lora;
  std::vector<float> adapters;
};
/// Reads them from the checkpoint's `group` ("model": the policy; "critic": a PPO critic's);
/// throws rlhf::Error naming `path` when that group holds no adapters.
LoraCheckpoint read_lora_checkpoint(const std::string& path, const std::string& group = "model");
/// Whether checkpoint `path` has a group `group` holding LoRA adapters (a PPO run's "critic").
bool has_lora_group(const std::string& path, const std::string& group);

/// The Hugging Face folder written next to checkpoint `ckpt_file` by --save_hf_ckpt:
/// `<dir>/step_<k>.h5` → `<dir>/step_<k>_hf` (OpenRLHF writes `<ckpt_path>/<tag>_hf`).
std::string hf_checkpoint_dir(const std::string& ckpt_file);

/// Loads weights (and moments where slot.optimizer) into the stores and returns the trainer state.
/// Every training rank reads the file; from a sharded checkpoint each rank reads only the ranges
/// its stores keep, whatever the rank count that wrote it. Throws rlhf::Error naming the file and
/// what is missing.
nlohmann::json load_train_checkpoint(const std::string& path,
                                     const std::vector<CheckpointSlot>& slots);

/// Whether --ckpt_format `format` ("single" | "sharded" | "auto") writes sharded checkpoints on
/// `train_ranks` training ranks ("auto": more than one). Throws rlhf::Error on another value.
bool sharded_checkpoints(const std::string& format, int train_ranks);

/// `<dir>/step_<k>.h5` for step k.
std::string checkpoint_path(const std::string& dir, int64_t step);

/// The committed checkpoints in `dir`, oldest first (by step).
std::vector<std::string> list_checkpoints(const std::string& dir);

/// The newest checkpoint in `dir` that opens, carries a trainer state and reads back whole (every
/// dataset read, so each chunk's Fletcher32 checksum is verified: io::verify_hdf5_file); a newer
/// file that is damaged (a truncated write, a flipped bit) is skipped with a warning naming it and
/// the reason. "" if none. A sharded checkpoint's shard files are checked too (present, the
/// index's size and CRC-32).
std::string latest_valid_checkpoint(const std::string& dir);

/// The settings of a resumed run that differ from those its checkpoint was made with, one
/// "key saved -> now" string per key of `now` (a JSON object of flag values, e.g.
/// {"rollout_batch_size": 16}) whose value in `saved` is missing or different; keys only in
/// `saved` are ignored. The run warns with the list: a changed batch size or step count moves the
/// data order and the learning-rate schedule.
std::vector<std::string> changed_settings(const nlohmann::json& saved, const nlohmann::json& now);

/// Warns (rank 0's log) with the changed_settings between the "settings" of the trainer state
/// loaded from checkpoint `path` and this run's `settings`; silent when none changed.
void warn_changed_settings(const std::string& path, const nlohmann::json& trainer_state,
                           const nlohmann::json& settings);

}  // namespace rlhf::rl
