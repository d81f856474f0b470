// The sharded form of a training checkpoint (io/sharded_ckpt.h describes the files): every
// training rank writes its own shard of every full-parameter model's weights and AdamW moments in
// parallel, rank 0 writes the index (trainer state, tokenizer, LoRA adapters, the shard table)
// last. Used by rl/checkpoint.cpp (save_train_checkpoint with a shard communicator,
// load_train_checkpoint of an index).
#pragma once

#include <nlohmann/json.hpp>

#include <memory>
#include <string>

#include "io/hdf5_ckpt.h"
#include "io/sharded_ckpt.h"
#include "parallel/comm.h"
#include "rl/checkpoint.h"

namespace rlhf::rl {

/// One rank's side of writing a sharded checkpoint whose index is `index_path`. Collective over
/// `comm` (the training ranks, in the same order on each): the constructor, write_slot and
/// finish.
class ShardedCheckpointWriter {
 public:
  /// Rank 0 empties `<shard_dir>.tmp` (a leftover of an interrupted write) and creates it; after
  /// a barrier every rank opens its shard file there (`<file>.tmp` until finish()).
  ShardedCheckpointWriter(const std::string& index_path, parallel::Comm& comm);
  ~ShardedCheckpointWriter();

  /// Writes this rank's element range of every unit of `s.store` (ShardLayout's range for
  /// comm.size() shards, padding excluded: a ZeRO-3 store's own shard, a slice of a replicated
  /// store's copy) as tensor pieces, and of its AdamW moments when s.optimizer. A ZeRO-3 store on
  /// the host is read locally; any other sharded store gathers its moments (collective). Records
  /// the group in the index. Not for LoRA stores (their adapters go to the index file).
  void write_slot(const CheckpointSlot& s);

  /// Commits this rank's file, measures its size and CRC-32, gathers every rank's (collective),
  /// and rank 0 renames `<shard_dir>.tmp` to shard_dir (replacing an older folder) and removes
  /// the `*_shards.tmp` folders that killed writes left next to it. Returns the index JSON (every
  /// rank) for io::write_shard_index. Call once.
  nlohmann::json finish();

 private:
  std::string index_path_, dir_;
  parallel::Comm& comm_;
  std::unique_ptr<io::CheckpointWriter> file_;
  nlohmann::json groups_ = nlohmann::json::object();
};

/// Loads a full-parameter slot from a sharded checkpoint: for every unit, this rank reads only the
/// element range its store keeps (unit_shard for a ZeRO-3 store, the whole unit for a replicated
/// one) from the shard files that hold it — any rank count resumes a checkpoint made on any other
/// — then load_unit / load_moments. Not collective. Throws rlhf::Error naming the index and the
/// dataset when a range is missing.
void load_sharded_slot(const io::ShardSet& shards, const CheckpointSlot& s);

}  // namespace rlhf::rl
