#include "io/hf_shards.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <map>

#include "core/error.h"

namespace rlhf::io {

int64_t parse_shard_size(const std::string& s) {
  std::string t;
  for (char c : s)
    if (!std::isspace(static_cast<unsigned char>(c)))
      t += char(std::toupper(static_cast<unsigned char>(c)));
  static const std::vector<std::pair<std::string, double>> units = {{"TIB", 1099511627776.0},
                                                                    {"GIB", 1073741824.0},
                                                                    {"MIB", 1048576.0},
                                                                    {"KIB", 1024.0},
                                                                    {"TB", 1e12},
                                                                    {"GB", 1e9},
                                                                    {"MB", 1e6},
                                                                    {"KB", 1e3},
                                                                    {"B", 1.0}};
  double mult = 1.0;
  for (const auto& [u, m] : units) {
    if (t.size() > u.size() && t.compare(t.size() - u.size(), u.size(), u) == 0) {
      t.resize(t.size() - u.size());
      mult = m;
      break;
    }
  }
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(t, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  RLHF_CHECK(!t.empty() && used == t.size() && std::isfinite(v) && v * mult >= 1.0,
             "'{}' is not a shard size\nhint: a positive size such as 5GB, 500MB or 2GiB", s);
  return int64_t(v * mult);
}

std::vector<size_t> hf_state_dict_order(const std::vector<std::string>& names) {
  // Rank of a name inside a decoder layer, in the modules' registration order.
  static const std::vector<std::string> layer_order = {
      "self_attn.q_proj.weight", "self_attn.q_proj.bias",   "self_attn.k_proj.weight",
      "self_attn.k_proj.bias",   "self_attn.v_proj.weight", "self_attn.v_proj.bias",
      "self_attn.o_proj.weight", "self_attn.o_proj.bias",   "self_attn.q_norm.weight",
      "self_attn.k_norm.weight", "mlp.gate_proj.weight",    "mlp.up_proj.weight",
      "mlp.down_proj.weight",    "input_layernorm.weight",  "post_attention_layernorm.weight"};
  // Key: (group, layer, rank in group); group 0 embeddings, 1 layers, 2 final norm, 3 heads,
  // 4 anything else (kept in its given order).
  std::vector<std::tuple<int, int64_t, size_t, size_t>> keys;
  const std::string lp = "model.layers.";
  for (size_t i = 0; i < names.size(); ++i) {
    const std::string& n = names[i];
    std::tuple<int, int64_t, size_t, size_t> k{4, 0, 0, i};
    if (n == "model.embed_tokens.weight") {
      k = {0, 0, 0, i};
    } else if (n == "model.norm.weight") {
      k = {2, 0, 0, i};
    } else if (n == "lm_head.weight" || n.rfind("score.", 0) == 0) {
      k = {3, 0, 0, i};
    } else if (n.rfind(lp, 0) == 0) {
      const size_t dot = n.find('.', lp.size());
      const std::string idx = n.substr(lp.size(), dot - lp.size());
      const bool numeric =
          dot != std::string::npos && !idx.empty() &&
          std::all_of(idx.begin(), idx.end(), [](char c) { return c >= '0' && c <= '9'; });
      if (numeric) {
        const std::string rest = n.substr(dot + 1);
        const auto it = std::find(layer_order.begin(), layer_order.end(), rest);
        k = {1, std::stoll(idx), size_t(it - layer_order.begin()), i};
      }
    }
    keys.push_back(k);
  }
  std::stable_sort(keys.begin(), keys.end());
  std::vector<size_t> out;
  for (const auto& k : keys) out.push_back(std::get<3>(k));
  return out;
}

std::vector<std::vector<size_t>> plan_hf_shards(const std::vector<int64_t>& bytes,
                                                const std::vector<size_t>& order,
                                                int64_t max_shard_bytes) {
  std::vector<std::vector<size_t>> shards;
  std::vector<size_t> current;
  int64_t current_bytes = 0;
  for (size_t i : order) {
    const int64_t b = bytes.at(i);
    if (b > max_shard_bytes) {  // its own shard, appended before the one being filled
      shards.push_back({i});
      continue;
    }
    if (current_bytes + b > max_shard_bytes) {
      shards.push_back(std::move(current));
      current.clear();
      current_bytes = 0;
    }
    current.push_back(i);
    current_bytes += b;
  }
  if (!current.empty()) shards.push_back(std::move(current));
  return shards;
}

std::string hf_shard_file_name(size_t index, size_t n) {
  if (n == 1) return "model.safetensors";
  return fmt::format("model-{:05d}-of-{:05d}.safetensors", index + 1, n);
}

}  // namespace rlhf::io
