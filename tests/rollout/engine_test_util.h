// What the engine tests share: the tiny decoder they generate with.
#pragma once

#include <cstdint>
#include <string>

#include "model/config.h"

namespace rlhf::test {

/// A tiny decoder: C = 48, 2 layers, 4 attention heads over kv_heads KV heads (D = 12), F = 80,
/// V = 61 with BOS 59, EOS 60, PAD 58 (token ids 0..57 are ordinary). model_type "qwen2" has
/// q/k/v biases, "llama" none; positions: max_position_embeddings; tied: tie_word_embeddings.
inline model::ModelConfig tiny_engine_config(const std::string& model_type, int64_t positions,
                                             bool tied = false, int64_t kv_heads = 2) {
  model::ModelConfig c;
  c.model_type = model_type;
  c.hidden_size = 48;
  c.intermediate_size = 80;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = kv_heads;
  c.vocab_size = 61;
  c.max_position_embeddings = positions;
  c.tie_word_embeddings = tied;
  c.bos_token_id = 59;
  c.eos_token_id = 60;
  c.pad_token_id = 58;
  return c;
}

}  // namespace rlhf::test
