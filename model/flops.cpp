#include "model/flops.h"

#include "model/projections.h"

namespace rlhf::model {

int64_t matmul_params(const ModelConfig& c, HeadKind head) {
  const int64_t C = c.hidden_size;
  const int64_t layer = layer_matmul_params(layer_spec(c));
  const int64_t head_params = head == HeadKind::kLM ? c.vocab_size * C : C;
  return c.num_hidden_layers * layer + head_params;
}

double training_flops_per_token(const ModelConfig& c, int64_t T, HeadKind head) {
  return 6.0 * double(matmul_params(c, head)) +
         6.0 * double(c.num_hidden_layers) * double(c.num_attention_heads * c.D()) * double(T);
}

double forward_flops_per_token(const ModelConfig& c, int64_t T, HeadKind head) {
  return training_flops_per_token(c, T, head) / 3.0;
}

}  // namespace rlhf::model
