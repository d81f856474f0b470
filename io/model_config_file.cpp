#include "io/model_config_file.h"

#include <toml++/toml.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <map>
#include <sstream>

#include "core/error.h"
#include "core/strings.h"
#include "io/jsonl.h"

namespace rlhf::io {

namespace {

nlohmann::json toml_to_json(const toml::node& node) {
  if (const toml::table* t = node.as_table()) {
    nlohmann::json j = nlohmann::json::object();
    for (auto&& [k, v] : *t) j[std::string(k.str())] = toml_to_json(v);
    return j;
  }
  if (const toml::array* a = node.as_array()) {
    nlohmann::json j = nlohmann::json::array();
    for (const toml::node& v : *a) j.push_back(toml_to_json(v));
    return j;
  }
  if (const auto* v = node.as_string()) return v->get();
  if (const auto* v = node.as_integer()) return v->get();
  if (const auto* v = node.as_floating_point()) return v->get();
  if (const auto* v = node.as_boolean()) return v->get();
  std::ostringstream os;  // dates and times: their TOML text
  node.visit([&](auto&& n) { os << n; });
  return os.str();
}

struct KeyPos {
  int64_t line, column;
};

// The key of `keys` that the message is about: a quoted 'key' first, else the earliest key that
// appears as a whole word. Empty if none.
std::string key_in_message(const std::string& msg, const std::map<std::string, KeyPos>& keys) {
  for (const auto& [k, pos] : keys)
    if (msg.find("'" + k + "'") != std::string::npos) return k;
  auto is_word = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; };
  std::string best;
  size_t best_at = std::string::npos;
  for (const auto& [k, pos] : keys) {
    for (size_t at = msg.find(k); at != std::string::npos; at = msg.find(k, at + 1)) {
      const bool left = at == 0 || !is_word(msg[at - 1]);
      const bool right = at + k.size() >= msg.size() || !is_word(msg[at + k.size()]);
      if (left && right) {
        if (at < best_at) {
          best_at = at;
          best = k;
        }
        break;
      }
    }
  }
  return best;
}

model::ModelConfig load_toml(const std::string& path) {
  const std::string text = read_text_file(path);
  toml::table table;
  try {
    table = toml::parse(text, path);
  } catch (const toml::parse_error& e) {
    RLHF_FAIL("{}:{}:{}: TOML parse error: {}", path, e.source().begin.line,
              e.source().begin.column, e.description());
  }
  std::map<std::string, KeyPos> keys;
  for (auto&& [k, v] : table)
    keys[std::string(k.str())] = KeyPos{static_cast<int64_t>(k.source().begin.line),
                                        static_cast<int64_t>(k.source().begin.column)};
  const nlohmann::json j = toml_to_json(table);
  try {
    return model::ModelConfig::from_json(j, path, model::ConfigKeys::kStrict);
  } catch (const Error& e) {
    std::string msg = e.what();
    const std::string key = key_in_message(msg, keys);
    if (key.empty()) throw;
    const KeyPos pos = keys.at(key);
    const std::string prefix = path + ": ";
    if (msg.rfind(prefix, 0) == 0) msg.erase(0, prefix.size());
    throw Error(fmt::format("{}:{}:{}: {}", path, pos.line, pos.column, msg), e.where());
  }
}

}  // namespace

model::ModelConfig load_model_config_file(const std::string& path) {
  const std::string ext = to_lower_ascii(std::filesystem::path(path).extension().string());
  if (ext == ".json")
    return model::ModelConfig::from_json(parse_json_file(path), path,
                                         model::ConfigKeys::kHuggingFace);
  if (ext == ".toml") return load_toml(path);
  RLHF_FAIL(
      "{}: unsupported model config format '{}'\nhint: use a .json (HF config.json) or "
      ".toml file; see examples/models/",
      path, ext);
}

}  // namespace rlhf::io
