// Sharded checkpoints: a file per training rank plus an index (rl/checkpoint.h writes them). The
// index is the checkpoint's own file (`<dir>/step_<k>.h5`, what list_checkpoints finds): the
// usual root, /model config attributes, /trainer and /tokenizer (and LoRA adapters, which are
// small), plus /shards. The weights and AdamW moments of every full-parameter model are in
// `<dir>/step_<k>_shards/rank-<r>-of-<n>.h5`, one per rank, each holding that rank's contiguous
// element range of every unit (its ZeRO-3 shard, padding excluded) cut into tensor pieces:
//
//   /<group>/<HF name>                  fp32, 1-D: elements [start, start + len) of the tensor
//                                       flattened row-major; attribute start (int64)
//   /optimizer/<group>/<m|v>/<HF name>  the same pieces of the AdamW moments
//
// A tensor is the concatenation of its pieces in rank order. /shards in the index: attribute
// ranks (n) and dataset /shards/index, the UTF-8 JSON text
//   {"ranks": n, "files": [{"name", "bytes", "crc32"}], "groups": {"<group>": {"tensors":
//    {"<HF name>": shape}, "units": [{"name", "numel", "ranges": [[offset, count] per rank]}]}}}
// (crc32: zlib's CRC-32 of the whole shard file). The shard folder is complete and renamed into
// place before the index is committed, so the index's rename is the commit of the whole checkpoint.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "io/hdf5_ckpt.h"

namespace rlhf::io {

/// The shard folder of index `index_path`: `<dir>/step_<k>.h5` → `<dir>/step_<k>_shards`.
std::string shard_dir(const std::string& index_path);
/// `rank-<r>-of-<n>.h5` with five digits each (as Hugging Face numbers its shards).
std::string shard_file_name(int rank, int n_ranks);

/// True if the checkpoint opened by `r` is the index of a sharded checkpoint (has /shards).
bool is_sharded_checkpoint(const CheckpointReader& r);

/// One shard file as the index records it.
struct ShardFileInfo {
  std::string name;    ///< file name inside shard_dir
  int64_t bytes = 0;   ///< file size
  uint32_t crc32 = 0;  ///< zlib CRC-32 of the whole file
};

/// zlib CRC-32 of the file at `path` read sequentially; its size goes to `*bytes`. Throws
/// rlhf::Error naming the file when it cannot be read.
uint32_t file_crc32(const std::string& path, int64_t* bytes);

/// Writes /shards (attribute ranks, dataset /shards/index) into the index being written.
void write_shard_index(CheckpointWriter& w, const nlohmann::json& index);
/// Reads /shards/index; throws rlhf::Error naming the file when it is missing or malformed.
nlohmann::json read_shard_index(const CheckpointReader& r);

/// Writes one tensor piece: dataset `dataset` (1-D, `count` floats from `data`) with attribute
/// start = `start`.
void write_tensor_piece(CheckpointWriter& w, const std::string& dataset, const float* data,
                        int64_t start, int64_t count);

/// The shard files of one sharded checkpoint, opened for reading (each file once, on first use).
class ShardSet {
 public:
  /// Reads the /shards index of the index file `index` (copied: `index` need not outlive this).
  /// Throws rlhf::Error when the index is malformed.
  explicit ShardSet(const CheckpointReader& index);
  ~ShardSet();
  ShardSet(const ShardSet&) = delete;
  ShardSet& operator=(const ShardSet&) = delete;

  const nlohmann::json& index() const { return index_; }
  /// The index file's path.
  const std::string& index_path() const { return index_path_; }
  int ranks() const { return ranks_; }
  /// Sets `*shape` to the shape of tensor `name` of group `group` (e.g. "model") and returns true;
  /// false (shape untouched) when the index does not list it.
  bool tensor_shape(const std::string& group, const std::string& name,
                    std::vector<int64_t>* shape) const;
  /// Elements [begin, begin + count) of the flattened tensor stored as `dataset` in the shards
  /// ("/model/<HF name>", "/optimizer/model/m/<HF name>") into out (count floats), read from every
  /// piece that overlaps them (only those chunks are read). Throws rlhf::Error naming the index
  /// and the dataset when the pieces do not cover the range.
  void read_range(const std::string& dataset, int64_t begin, int64_t count, float* out) const;
  /// Checks every shard file: present, the recorded size and CRC-32, and every dataset readable
  /// (io::verify_hdf5_file: the Fletcher32 checksum of each chunk). Returns the bytes read.
  /// Throws rlhf::Error naming the first bad file and why.
  int64_t verify() const;

 private:
  const CheckpointReader& shard(int r) const;
  std::string index_path_, dir_;
  nlohmann::json index_;
  int ranks_ = 0;
  mutable std::vector<std::unique_ptr<CheckpointReader>> shards_;
};

}  // namespace rlhf::io
