// Sharded safetensors exports the way Hugging Face writes them (transformers'
// PreTrainedModel.save_pretrained through huggingface_hub's split_state_dict_into_shards): tensors
// in state-dict order fill `model-0000k-of-0000n.safetensors` until the next one would pass
// max_shard_size (a tensor larger than that gets a shard of its own), plus
// `model.safetensors.index.json` {"metadata": {"total_parameters", "total_size"}, "weight_map":
// {name: file}} written with sorted keys and an indent of 2; one `model.safetensors` and no index
// when everything fits one shard.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace rlhf::io {

/// transformers' default max_shard_size ("5GB").
inline constexpr const char* kDefaultMaxShardSize = "5GB";

/// "5GB" → 5·10⁹ bytes: a number (decimal point allowed) and a unit TB, GB, MB, KB (powers of 10,
/// as huggingface_hub's parse_size_to_int), TiB, GiB, MiB, KiB (powers of 2), or B / none (bytes).
/// Case-insensitive, spaces allowed. Throws rlhf::Error quoting `s` when it is not such a size or
/// is not positive.
int64_t parse_shard_size(const std::string& s);

/// The tensors' indices in Hugging Face state-dict order (the modules' registration order of a
/// Llama / Qwen2 / Qwen3 / Mistral model: embeddings, each layer's attention q, k, v, o, q_norm,
/// k_norm, MLP gate, up, down, the two layer norms, the final norm, lm_head or score), the rest
/// after them in their given order. names: HF tensor names.
std::vector<size_t> hf_state_dict_order(const std::vector<std::string>& names);

/// Which tensors go to which shard: shards[k] lists indices into `bytes` (each tensor's stored
/// size), taken in the order of `order`, cut as split_state_dict_into_shards cuts.
std::vector<std::vector<size_t>> plan_hf_shards(const std::vector<int64_t>& bytes,
                                                const std::vector<size_t>& order,
                                                int64_t max_shard_bytes);

/// "model-00002-of-00005.safetensors" for shard index 1 of 5; "model.safetensors" when n == 1.
std::string hf_shard_file_name(size_t index, size_t n);

}  // namespace rlhf::io
