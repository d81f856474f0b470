// What the engine tests share: the tiny decoder they generate with, random LoRA adapters, and a
// fingerprint of what they generated.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/lora.h"
#include "rollout/engine.h"
#include "tests/test_util.h"

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

/// LoRA adapters of rank 4 (alpha 8) on every projection of engine e (Engine::set_lora), written
/// into its adapter buffer as an adapter sync does: PEFT's init of A from `seed`, and B ~ U(-0.5,
/// 0.5) (a fresh B = 0 would leave the base model).
inline void set_random_adapters(rollout::Engine& e, uint64_t seed) {
  model::LoraConfig lc;
  lc.rank = 4;
  lc.alpha = 8.0;
  lc.targets = model::parse_target_modules("all-linear");
  e.set_lora(lc);
  const model::ModelConfig& c = e.layout().config();
  const model::LoraLayout ll(model::layer_spec(c), int(c.num_hidden_layers), lc);
  model::lora_init(ll, e.lora_buffer(), seed);
  for (const model::TensorInfo& t : ll.tensors())
    if (t.name.find("lora_B") != std::string::npos) {
      const auto b = random_vec<float>(t.numel, seed + uint64_t(t.offset), -0.5, 0.5);
      std::copy(b.begin(), b.end(), e.lora_buffer() + t.offset);
    }
}

/// FNV-1a over the tokens and the log-probs' bits of every result: equal fingerprints = the same
/// generations bit for bit.
inline uint64_t results_fingerprint(const std::vector<rollout::GenerationResult>& res) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&](const void* p, size_t n) {
    for (size_t i = 0; i < n; ++i)
      h = (h ^ static_cast<const unsigned char*>(p)[i]) * 1099511628211ull;
  };
  for (const auto& r : res) {
    mix(r.tokens.data(), r.tokens.size() * sizeof(int32_t));
    mix(r.logprobs.data(), r.logprobs.size() * sizeof(float));
  }
  return h;
}

}  // namespace rlhf::test
