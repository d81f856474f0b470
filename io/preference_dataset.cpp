#include "io/preference_dataset.h"

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/jsonl.h"

namespace rlhf::io {

std::string PreferenceDatasetStats::summary() const {
  return fmt::format("{} pairs read, {} with a side cut to --max_len, {} identical pairs skipped",
                     total, truncated, identical_skipped);
}

PreferenceDataset build_preference_dataset(const std::string& path, const Tokenizer& tok,
                                           const PreferenceDatasetOptions& opt) {
  RLHF_CHECK(opt.max_len >= 3, "--max_len {} is too small for a reward-model sample", opt.max_len);
  PreferenceDataset ds;
  auto text_of = [&](const nlohmann::json& rec, const std::string& key, int64_t line) {
    RLHF_CHECK(rec.contains(key), "{}:{}: missing key '{}'\nhint: set --{}", path, line, key,
               key == opt.chosen_key     ? "chosen_key"
               : key == opt.rejected_key ? "rejected_key"
                                         : "prompt_key");
    RLHF_CHECK(rec[key].is_string(), "{}:{}: key '{}' must be a string, got {}", path, line, key,
               rec[key].type_name());
    return rec[key].get<std::string>();
  };
  for_each_jsonl(path, [&](const nlohmann::json& rec, int64_t line) {
    RLHF_CHECK(rec.is_object(), "{}:{}: a record must be a JSON object", path, line);
    if (opt.max_samples >= 0 && ds.stats.total >= opt.max_samples) return false;
    ++ds.stats.total;
    const std::string prompt = opt.prompt_key.empty() ? "" : text_of(rec, opt.prompt_key, line);
    bool cut = false;
    auto encode = [&](const std::string& text) {
      std::vector<int32_t> ids = tok.encode(prompt + text, true, true);
      if (static_cast<int64_t>(ids.size()) > opt.max_len) {
        ids.resize(static_cast<size_t>(opt.max_len));
        ids.back() = tok.eos_id();
        cut = true;
      }
      return ids;
    };
    PreferencePair p{encode(text_of(rec, opt.chosen_key, line)),
                     encode(text_of(rec, opt.rejected_key, line))};
    ds.stats.truncated += cut;
    if (p.chosen == p.rejected) {
      ++ds.stats.identical_skipped;
      return true;
    }
    ds.pairs.push_back(std::move(p));
    return true;
  });
  RLHF_CHECK(!ds.pairs.empty(), "{}: no usable preference pair ({})", path, ds.stats.summary());
  return ds;
}

}  // namespace rlhf::io
