#include "io/preference_dataset.h"

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/chat_template.h"
#include "io/jsonl.h"

namespace rlhf::io {

std::string PreferenceDatasetStats::summary() const {
  return fmt::format("{} pairs read, {} with a side cut to --max_len, {} identical pairs skipped",
                     total, truncated, identical_skipped);
}

namespace {

// Whether `text` still needs an EOS token: it does not end with the tokenizer's EOS token.
bool needs_eos(const Tokenizer& tok, const std::string& text) {
  if (tok.eos_id() < 0) return false;
  const std::string eos = tok.id_to_token(tok.eos_id());
  return eos.empty() || text.size() < eos.size() ||
         text.compare(text.size() - eos.size(), eos.size(), eos) != 0;
}

// --apply_chat_template: the rendered text of side `key` of record `rec` (OpenRLHF's
// RewardDataset), trailing newlines dropped. `where` is "file:line".
std::string chat_side(const Tokenizer& tok, const PreferenceDatasetOptions& opt,
                      const nlohmann::json& rec, const std::string& key, const std::string& where) {
  auto value = [&](const std::string& k, const char* flag) -> const nlohmann::json& {
    RLHF_CHECK(rec.contains(k), "{}: missing key '{}'\nhint: set --{}", where, k, flag);
    return rec[k];
  };
  const char* flag = key == opt.chosen_key ? "chosen_key" : "rejected_key";
  const nlohmann::json& side = value(key, flag);
  const std::string side_where = fmt::format("{}: key '{}'", where, key);
  std::string text;
  if (!opt.prompt_key.empty()) {
    const std::vector<ChatMessage> prompt = chat_messages_from_json(
        value(opt.prompt_key, "prompt_key"), fmt::format("{}: key '{}'", where, opt.prompt_key));
    const std::vector<ChatMessage> response =
        side.is_string() ? std::vector<ChatMessage>{{"assistant", side.get<std::string>()}}
                         : chat_messages_from_json(side, side_where);
    const ChatSplit split = render_chat_split(tok, opt.model_type, prompt, response, side_where);
    text = split.prompt + split.response;
  } else {
    RLHF_CHECK(side.is_array(),
               "{}: with --apply_chat_template and no --prompt_key, each side must be a "
               "conversation (an array of {{\"role\", \"content\"}} messages), got {}\nhint: "
               "set --prompt_key to the prompt's key, or drop --apply_chat_template for transcript "
               "texts",
               side_where, side.type_name());
    text = render_chat(tok, opt.model_type, chat_messages_from_json(side, side_where), false);
  }
  while (!text.empty() && text.back() == '\n') text.pop_back();
  return text;
}

}  // namespace

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
    bool cut = false;
    // The text of one side: prompt + text, or its chat rendering.
    auto side_text = [&](const std::string& key) {
      if (!opt.apply_chat_template) {
        const std::string prompt = opt.prompt_key.empty() ? "" : text_of(rec, opt.prompt_key, line);
        return prompt + text_of(rec, key, line);
      }
      return chat_side(tok, opt, rec, key, fmt::format("{}:{}", path, line));
    };
    auto encode = [&](const std::string& text) {
      std::vector<int32_t> ids = tok.encode(text, !opt.apply_chat_template,
                                            !opt.apply_chat_template || needs_eos(tok, text));
      if (static_cast<int64_t>(ids.size()) > opt.max_len) {
        ids.resize(static_cast<size_t>(opt.max_len));
        ids.back() = tok.eos_id();
        cut = true;
      }
      return ids;
    };
    PreferencePair p{encode(side_text(opt.chosen_key)), encode(side_text(opt.rejected_key))};
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
