// TensorSource: read access to the tensors of a pretrained model by Hugging Face name, whatever
// file format holds them (HDF5 checkpoint, safetensors, llama2.c, GGUF), converted to fp32 in HF's
// conventions (shape (out, in) for linears, the file's RoPE convention recorded in the config).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace rlhf::io {

/// Shape and stored element type of one tensor.
struct TensorMeta {
  std::vector<int64_t> shape;  ///< HF order, row-major
  std::string dtype;           ///< as stored: "F32", "BF16", "F16", "Q8_0", ...
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
};

/// "[a, b]" for messages.
std::string shape_to_string(const std::vector<int64_t>& shape);

/// Tensors of one model by HF name. Implementations are immutable after construction and safe to
/// read from several threads.
class TensorSource {
 public:
  virtual ~TensorSource() = default;
  /// The file or folder the tensors come from (for messages).
  virtual const std::string& source() const = 0;
  /// HF names of every tensor present (after name mapping and aliasing), sorted.
  virtual std::vector<std::string> names() const = 0;
  /// Shape and dtype of `name`, or nullopt if the model has no such tensor.
  virtual std::optional<TensorMeta> find(const std::string& name) const = 0;
  /// Converts tensor `name` (which find() knows) to fp32: writes find(name)->numel() floats.
  virtual void read(const std::string& name, float* out) const = 0;

  /// find + shape check + read: throws rlhf::Error "<source>: no tensor '<name>'" when absent and
  /// "<source>: tensor '<name>' has shape [..], the model config needs [..]" on a mismatch.
  void read_checked(const std::string& name, float* out,
                    const std::vector<int64_t>& expected_shape) const;
};

}  // namespace rlhf::io
