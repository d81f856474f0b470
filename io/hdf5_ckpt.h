// HDF5 checkpoints (docs/design.md, "Checkpoints and formats"): a generic writer/reader of typed
// datasets and scalar attributes under any group path, committed atomically by rename
// (io/hdf5_ckpt.cpp), and the model save/load on top of it (io/hdf5_model.cpp).
//
// File layout (format "rlhf-checkpoint", version 1):
//   /                       attrs: format = "rlhf-checkpoint", format_version = 1, + caller's
//   extras /model/<HF tensor name> fp32 datasets, HF shapes, real elements only (no padding) /model
//   attrs: config (HF config.json text), head ("lm"|"value"|"reward"), and
//                           one attribute per scalar config field (hidden_size, rope_theta, ...)
//   /optimizer/..., /trainer/...   reserved for optimizer shards, RNG states, data position
//
// Files use the HDF5 1.10 file format (superblock v3, v2 object headers): every metadata block is
// checksummed, and every non-empty, non-scalar dataset is chunked with the Fletcher-32 filter, so a
// truncated or corrupt file raises rlhf::Error instead of returning wrong numbers. Readable by
// HDF5 >= 1.10 (h5py >= 2.8); string attributes are fixed-length UTF-8 (h5py returns bytes).
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/layout.h"

namespace rlhf::io {

/// Value of the root attribute "format" of every file written by CheckpointWriter.
inline constexpr const char* kCheckpointFormat = "rlhf-checkpoint";
/// Value of the root attribute "format_version"; readers reject larger versions.
inline constexpr int64_t kCheckpointFormatVersion = 1;

/// Writes one checkpoint file. Everything goes to `<path>.tmp` (parent directories are created);
/// `commit()` flushes, closes, fsyncs and renames it to `<path>` — the rename is the commit, so
/// `<path>` is either the previous complete file or the new complete file, never a partial one.
/// Destroying the writer without commit() closes and deletes `<path>.tmp` and leaves `<path>`
/// untouched. Object paths are absolute or relative to the root ("model/x" == "/model/x");
/// components may contain dots (HF names) but not be empty, "." or "..".
/// Every method throws rlhf::Error naming the file and object on failure, and after commit().
class CheckpointWriter {
 public:
  /// Creates `<path>.tmp` (truncating a stale one) and writes the root "format" attributes.
  explicit CheckpointWriter(std::string path);
  ~CheckpointWriter();
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  /// The final path (what commit() renames to).
  const std::string& path() const { return path_; }
  /// `<path>.tmp`, where the data goes until commit().
  const std::string& tmp_path() const { return tmp_path_; }
  bool committed() const { return committed_; }

  /// Creates group `group` and any missing parents; no-op if it exists.
  void create_group(const std::string& group);

  /// Writes dataset `dataset` (parents created) with row-major `shape` ({} = scalar) from
  /// `data` (product(shape) elements; may be null when that is 0).
  /// T ∈ {float, double, int32_t, int64_t, uint8_t, uint64_t}, stored as the same little-endian
  /// type. Throws if the dataset already exists.
  template <typename T>
  void write_dataset(const std::string& dataset, const T* data, const std::vector<int64_t>& shape);

  /// Scalar attributes on a group or dataset `object`; a missing `object` is created as a group.
  /// An existing attribute of the same name is replaced.
  void write_string_attr(const std::string& object, const std::string& name,
                         const std::string& value);
  void write_int_attr(const std::string& object, const std::string& name, int64_t value);
  void write_float_attr(const std::string& object, const std::string& name, double value);
  /// One attribute per key of the JSON object `attrs`: strings → string, integers → int64,
  /// floats → float64, booleans → int64 0/1, arrays/objects/null → their JSON text as a string.
  void write_attrs(const std::string& object, const nlohmann::json& attrs);

  /// Flush, close, fsync, rename `<path>.tmp` → `<path>` (replacing an existing file), fsync the
  /// directory. Throws on any failure (the .tmp is then removed by the destructor).
  void commit();

 private:
  void check_open(const char* what) const;
  void write_attr_raw(const std::string& object, const std::string& name, int64_t file_type,
                      int64_t mem_type, const void* value);

  std::string path_, tmp_path_;
  int64_t file_ = -1;  // hid_t
  bool committed_ = false;
};

/// Reads a checkpoint (or any HDF5 file: the format attribute is checked only by the model
/// loaders). Every method throws rlhf::Error naming the file and object: missing file, not HDF5,
/// truncated or corrupt (checksum) data, missing object, wrong shape or type.
class CheckpointReader {
 public:
  explicit CheckpointReader(std::string path);
  ~CheckpointReader();
  CheckpointReader(const CheckpointReader&) = delete;
  CheckpointReader& operator=(const CheckpointReader&) = delete;

  const std::string& path() const { return path_; }

  /// True if `object` (group or dataset) exists; "/" always does.
  bool exists(const std::string& object) const;
  /// Sorted names (not paths) of the datasets / groups directly inside `group`.
  std::vector<std::string> list_datasets(const std::string& group) const;
  std::vector<std::string> list_groups(const std::string& group) const;
  /// Shape of `dataset` ({} for a scalar).
  std::vector<int64_t> shape(const std::string& dataset) const;

  /// Reads `dataset` into `out` (product(expected_shape) elements) after checking that its shape
  /// equals `expected_shape` — a mismatch is an error naming the file, dataset, expected and actual
  /// shape — and that its stored type converts to T without loss (float32 → double is fine,
  /// float64 → float is an error). T as for CheckpointWriter::write_dataset.
  template <typename T>
  void read_dataset(const std::string& dataset, T* out,
                    const std::vector<int64_t>& expected_shape) const;
  /// Reads elements [begin, begin + count) of the 1-D float32 dataset `dataset` into `out`
  /// (count floats) through a hyperslab, so only the chunks that hold them are read (and
  /// checksummed). An out-of-range request is an error naming the file, dataset and its length.
  void read_float_range(const std::string& dataset, int64_t begin, int64_t count, float* out) const;
  /// Reads a whole dataset of any shape; its shape goes to `*shape_out` when given.
  template <typename T>
  std::vector<T> read_dataset_vector(const std::string& dataset,
                                     std::vector<int64_t>* shape_out = nullptr) const;

  bool has_attr(const std::string& object, const std::string& name) const;
  /// Sorted attribute names of `object`.
  std::vector<std::string> attr_names(const std::string& object) const;
  /// Scalar attributes. Strings may be fixed or variable length; read_float_attr also accepts
  /// integers. A missing attribute or another type is an error naming the file, object and name.
  std::string read_string_attr(const std::string& object, const std::string& name) const;
  int64_t read_int_attr(const std::string& object, const std::string& name) const;
  double read_float_attr(const std::string& object, const std::string& name) const;
  /// All scalar string / integer / float attributes of `object` as a JSON object (others skipped).
  nlohmann::json read_attrs(const std::string& object) const;

 private:
  std::string path_;
  int64_t file_ = -1;  // hid_t
};

/// Throws rlhf::Error unless the root carries format == "rlhf-checkpoint" and a format_version
/// this build reads (<= kCheckpointFormatVersion).
void check_checkpoint_format(const CheckpointReader& reader);

// --- model save / load ---------------------------------------------------------------------

/// The model description stored in a checkpoint.
struct StoredModelConfig {
  model::ModelConfig config;
  model::HeadKind head = model::HeadKind::kLM;
};

/// "lm" | "value" | "reward" → HeadKind; throws rlhf::Error on anything else.
model::HeadKind head_kind_from_string(const std::string& s);

/// Writes the /model attributes (config JSON, one attribute per scalar field, head).
void write_model_config_hdf5(CheckpointWriter& writer, const model::ParamLayout& layout);
/// Writes /model/<hf name> for every tensor of unit `unit` from its full (gathered) flat buffer
/// (fp32, at least layout.unit(unit).numel elements; only real elements are stored).
void write_model_unit_hdf5(CheckpointWriter& writer, const model::ParamLayout& layout, int unit,
                           const float* unit_buffer);
/// write_model_config_hdf5 + write_model_unit_hdf5 for every unit; unit_buffers[i] is unit i.
void write_model_hdf5(CheckpointWriter& writer, const model::ParamLayout& layout,
                      const std::vector<const float*>& unit_buffers);

/// One-call save: a CheckpointWriter on `path`, the whole model, `extra_root_attrs` (a JSON object
/// or null; see CheckpointWriter::write_attrs; "format"/"format_version" are reserved) on the
/// root, then commit().
void save_model_hdf5(const std::string& path, const model::ParamLayout& layout,
                     const std::vector<const float*>& unit_buffers,
                     const nlohmann::json& extra_root_attrs);

/// Reads the /model config and head, checks the format, and cross-checks the JSON config against
/// the per-field attributes (a disagreement means a corrupt file).
StoredModelConfig read_model_config_hdf5(const CheckpointReader& reader);
/// Same, opening `path`.
StoredModelConfig load_model_config_hdf5(const std::string& path);

/// Fills unit `unit`'s flat buffer (layout.unit(unit).numel fp32 elements) from /model: every
/// tensor at its offset after a shape check; alignment gaps are set to 0.
/// Does not compare configs (so a reward model can start from an LM checkpoint unit by unit).
void load_model_unit_hdf5(const CheckpointReader& reader, const model::ParamLayout& layout,
                          int unit, float* unit_buffer);
/// Loads every unit of `layout` from `path` (unit_buffers[i] is unit i) after checking that the
/// stored config and head equal the layout's (an error lists the differing fields).
void load_model_hdf5(const std::string& path, const model::ParamLayout& layout,
                     const std::vector<float*>& unit_buffers);

}  // namespace rlhf::io
