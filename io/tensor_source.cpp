#include "io/tensor_source.h"

#include <fmt/format.h>

#include "core/error.h"

namespace rlhf::io {

std::string shape_to_string(const std::vector<int64_t>& shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

void TensorSource::read_checked(const std::string& name, float* out,
                                const std::vector<int64_t>& expected_shape) const {
  const std::optional<TensorMeta> m = find(name);
  RLHF_CHECK(m.has_value(), "{}: no tensor '{}'\nhint: the file does not hold this model's {}",
             source(), name, name);
  RLHF_CHECK(m->shape == expected_shape, "{}: tensor '{}' has shape {}, the model config needs {}",
             source(), name, shape_to_string(m->shape), shape_to_string(expected_shape));
  read(name, out);
}

}  // namespace rlhf::io
