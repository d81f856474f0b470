#include "io/builtin_tasks.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>

#include "core/error.h"

namespace rlhf::io {

bool is_builtin_dataset(const std::string& spec) {
  return spec.rfind("builtin:", 0) == 0;
}

namespace {

struct Spec {
  std::string task;
  std::map<std::string, std::string> params;
};

Spec parse_spec(const std::string& spec) {
  RLHF_CHECK(is_builtin_dataset(spec), "'{}' is not a builtin dataset", spec);
  Spec s;
  const std::string rest = spec.substr(8);
  const size_t q = rest.find('?');
  s.task = rest.substr(0, q);
  if (q != std::string::npos) {
    std::string query = rest.substr(q + 1);
    size_t pos = 0;
    while (pos <= query.size()) {
      size_t amp = query.find('&', pos);
      if (amp == std::string::npos) amp = query.size();
      const std::string kv = query.substr(pos, amp - pos);
      pos = amp + 1;
      if (kv.empty()) continue;
      const size_t eq = kv.find('=');
      RLHF_CHECK(eq != std::string::npos, "{}: parameter '{}' needs a value (name=value)", spec,
                 kv);
      s.params[kv.substr(0, eq)] = kv.substr(eq + 1);
    }
  }
  return s;
}

int64_t int_param(const Spec& s, const std::string& spec, const char* name, int64_t def, int64_t lo,
                  int64_t hi) {
  auto it = s.params.find(name);
  if (it == s.params.end()) return def;
  char* end = nullptr;
  const long long v = std::strtoll(it->second.c_str(), &end, 10);
  RLHF_CHECK(end && *end == '\0' && !it->second.empty(), "{}: {} must be an integer, got '{}'",
             spec, name, it->second);
  RLHF_CHECK(v >= lo && v <= hi, "{}: {} must be in [{}, {}], got {}", spec, name, lo, hi, v);
  return v;
}

}  // namespace

std::vector<nlohmann::json> builtin_records(const std::string& spec) {
  const Spec s = parse_spec(spec);
  RLHF_CHECK(s.task == "addition", "{}: unknown builtin task '{}'\nhint: builtin:addition", spec,
             s.task);
  for (const auto& [k, v] : s.params)
    RLHF_CHECK(k == "n" || k == "digits" || k == "seed" || k == "split",
               "{}: unknown parameter '{}' (n, digits, seed, split)", spec, k);
  const int64_t n = int_param(s, spec, "n", 1000, 1, 10000000);
  const int64_t digits = int_param(s, spec, "digits", 2, 1, 9);
  const int64_t seed = int_param(s, spec, "seed", 1, 0, int64_t(1) << 40);
  const std::string split = s.params.count("split") ? s.params.at("split") : "train";
  RLHF_CHECK(split == "train" || split == "test", "{}: split must be train or test", spec);
  std::mt19937_64 rng(uint64_t(seed) * 2 + (split == "test" ? 1 : 0));
  int64_t hi = 1;
  for (int64_t d = 0; d < digits; ++d) hi *= 10;
  std::uniform_int_distribution<int64_t> dist(0, hi - 1);
  std::vector<nlohmann::json> out;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t a = dist(rng), b = dist(rng);
    const std::string c = std::to_string(a + b);
    out.push_back({{"input", std::to_string(a) + "+" + std::to_string(b) + "="},
                   {"output", c},
                   {"label", c}});
  }
  return out;
}

std::string materialize_builtin_dataset(const std::string& spec, const std::string& dir) {
  const auto records = builtin_records(spec);
  std::string name = spec.substr(8);
  for (char& c : name)
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  std::filesystem::create_directories(dir);
  const std::string path = (std::filesystem::path(dir) / ("builtin_" + name + ".jsonl")).string();
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::trunc);
    RLHF_CHECK(f.good(), "cannot write {}", tmp);
    for (const auto& r : records) f << r.dump() << '\n';
    RLHF_CHECK(f.good(), "cannot write {}", tmp);
  }
  std::filesystem::rename(tmp, path);
  return path;
}

}  // namespace rlhf::io
