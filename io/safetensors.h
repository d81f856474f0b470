// safetensors files (Hugging Face): an 8-byte little-endian header length N, N bytes of JSON
// {"<name>": {"dtype": "F32", "shape": [...], "data_offsets": [begin, end]}, "__metadata__":
// {...}}, then the tensor bytes (offsets relative to the end of the header). Format reference:
// https://github.com/huggingface/safetensors (README, "Format").
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "io/bytes.h"
#include "io/dtype.h"

namespace rlhf::io {

/// One tensor entry of a safetensors header.
struct SafetensorsEntry {
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  int64_t numel = 1;
  int64_t begin = 0, end = 0;  ///< byte offsets into the data section
};

/// A parsed safetensors file. The Blob (a mapping) stays alive with it.
struct SafetensorsFile {
  Blob blob;
  int64_t data_offset = 0;  ///< 8 + header length
  std::map<std::string, SafetensorsEntry> tensors;
  std::map<std::string, std::string> metadata;  ///< "__metadata__" (string values only)

  /// Converts tensor `name` to fp32 into `out` (numel floats). Throws if absent.
  void read_f32(const std::string& name, float* out) const;
};

/// Largest header accepted (the reference implementation's limit is 100 MB).
inline constexpr int64_t kSafetensorsMaxHeaderBytes = 100'000'000;

/// Parses and validates a safetensors blob. Every check happens before any offset is trusted: the
/// header length fits the file and the limit, the header is a JSON object, each entry has a known
/// dtype (F32, F16, BF16; others are rejected by name), a non-negative shape whose element count
/// does not overflow, offsets with begin <= end inside the data section, end - begin equal to the
/// element count times the element size, and no two tensors overlap. Errors are rlhf::Error naming
/// blob.source and the tensor.
SafetensorsFile parse_safetensors(Blob blob);

/// map_file + parse_safetensors.
SafetensorsFile open_safetensors(const std::string& path);

/// A tensor to write: its name, shape, and a callback that fills numel fp32 values.
struct SafetensorsWriteItem {
  std::string name;
  std::vector<int64_t> shape;
  std::function<void(float* out)> fill;
};

/// Writes a safetensors file at `path` (via `<path>.tmp` + rename): tensors in the given order,
/// stored as `dtype` (F32, F16 or BF16), header padded with spaces to a multiple of 8 bytes (as the
/// reference writer does), `metadata` as "__metadata__" (e.g. {"format": "pt"}). Tensors are
/// converted one at a time (memory = the largest tensor). Throws rlhf::Error on I/O failure.
void write_safetensors(const std::string& path, const std::vector<SafetensorsWriteItem>& items,
                       DType dtype, const std::map<std::string, std::string>& metadata);

}  // namespace rlhf::io
