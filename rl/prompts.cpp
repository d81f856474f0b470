#include "rl/prompts.h"

#include <filesystem>

#include "core/error.h"
#include "core/log.h"
#include "io/builtin_tasks.h"
#include "io/chat_template.h"
#include "io/jsonl.h"

namespace rlhf::rl {

namespace {

// The prompt records: a JSONL file, or a builtin task (also written to <save_path> on rank 0 so
// the data of the run can be looked at).
std::vector<nlohmann::json> prompt_records(const PromptOptions& a, int world_rank) {
  if (io::is_builtin_dataset(a.prompt_data)) {
    if (world_rank == 0) {
      const std::string path = io::materialize_builtin_dataset(a.prompt_data, a.save_dir);
      LOG0_INFO("prompts: {} written to {}", a.prompt_data, path);
    }
    return io::builtin_records(a.prompt_data);
  }
  RLHF_CHECK(std::filesystem::exists(a.prompt_data), "--prompt_data {}: no such file",
             a.prompt_data);
  return io::read_jsonl(a.prompt_data);
}

// The value at a dotted key path ("reward_model.ground_truth"), or nullptr.
const nlohmann::json* at_path(const nlohmann::json& j, const std::string& key) {
  const nlohmann::json* cur = &j;
  size_t pos = 0;
  while (pos <= key.size()) {
    const size_t dot = key.find('.', pos);
    const std::string part =
        key.substr(pos, dot == std::string::npos ? std::string::npos : dot - pos);
    if (!cur->is_object() || !cur->contains(part)) return nullptr;
    cur = &(*cur)[part];
    if (dot == std::string::npos) break;
    pos = dot + 1;
  }
  return cur;
}

}  // namespace

std::string apply_input_template(const std::string& tmpl, const std::string& text) {
  const size_t at = tmpl.find("{}");
  RLHF_CHECK(at != std::string::npos,
             "--input_template '{}' has no {{}} (the place of the prompt)\nhint: e.g. "
             "--input_template \"User: {{}}\\nAssistant: \"",
             tmpl);
  auto unescape = [](std::string_view s) {
    std::string out;
    for (size_t i = 0; i < s.size(); ++i) {
      if (s[i] == '\\' && i + 1 < s.size() && s[i + 1] == 'n') {
        out += '\n';
        ++i;
      } else {
        out += s[i];
      }
    }
    return out;
  };
  return unescape(tmpl.substr(0, at)) + text + unescape(tmpl.substr(at + 2));
}

std::vector<Prompt> load_prompts(const PromptOptions& a, const io::Tokenizer& tok,
                                 const model::ModelConfig& cfg, int world_rank) {
  const int64_t max_pos = cfg.max_position_embeddings;
  const auto records = prompt_records(a, world_rank);
  std::vector<Prompt> out;
  int64_t line = 0, too_long = 0;
  for (const nlohmann::json& r : records) {
    ++line;
    if (int64_t(out.size()) >= a.max_samples) break;
    RLHF_CHECK(r.is_object(), "{}:{}: a prompt record must be a JSON object", a.prompt_data, line);
    const nlohmann::json* in = at_path(r, a.input_key);
    RLHF_CHECK(in != nullptr, "{}:{}: no key '{}'\nhint: set --input_key", a.prompt_data, line,
               a.input_key);
    // The prompt as chat messages (a string is one user turn) or plain text.
    const std::vector<io::ChatMessage> messages = io::chat_messages_from_json(
        *in, fmt::format("{}:{}: key '{}'", a.prompt_data, line, a.input_key));
    std::string text;
    bool add_bos = true;
    if (a.apply_chat_template) {
      try {
        text = io::render_chat(tok, cfg.model_type, messages, true);
      } catch (const Error& e) {
        RLHF_FAIL("{}:{}: --apply_chat_template: {}", a.prompt_data, line, e.what());
      }
      add_bos = false;  // the template writes its own BOS where the format has one
    } else {
      for (const auto& m : messages) {  // contents, one per line
        if (!text.empty()) text += '\n';
        text += m.content;
      }
      if (!a.input_template.empty()) text = apply_input_template(a.input_template, text);
    }
    Prompt p;
    p.text = text;
    p.record = r;
    if (!a.label_key.empty()) {
      const nlohmann::json* l = at_path(r, a.label_key);
      RLHF_CHECK(l != nullptr, "{}:{}: no label key '{}'\nhint: set --label_key", a.prompt_data,
                 line, a.label_key);
      p.label = *l;
    }
    p.tokens = tok.encode(text, add_bos, false);
    if (int64_t(p.tokens.size()) > a.prompt_max_len || int64_t(p.tokens.size()) >= max_pos) {
      ++too_long;
      continue;
    }
    out.push_back(std::move(p));
  }
  RLHF_CHECK(!records.empty(),
             "{}: the file has no prompt records (an empty file?)\nhint: --prompt_data takes a "
             "JSONL file, one JSON object per line with the prompt under --input_key",
             a.prompt_data);
  RLHF_CHECK(!out.empty() || too_long > 0, "{}: no usable prompt: --max_samples is {}",
             a.prompt_data, a.max_samples);
  RLHF_CHECK(!out.empty(),
             "{}: no usable prompt: all {} are longer than --prompt_max_len {} (or the model's "
             "context of {} positions)",
             a.prompt_data, too_long, a.prompt_max_len, max_pos);
  if (too_long > 0)
    LOG0_WARN("{} prompts longer than --prompt_max_len {} (or the model's context) skipped",
              too_long, a.prompt_max_len);
  return out;
}

PromptSource::PromptSource(std::vector<Prompt> prompts, uint64_t seed)
    : prompts_(std::move(prompts)), order_(int64_t(prompts_.size()), seed) {
  RLHF_CHECK(!prompts_.empty(), "a prompt source needs at least one prompt");
}

const Prompt& PromptSource::at(int64_t pos) {
  RLHF_CHECK(pos >= 0, "prompt position {} must be >= 0", pos);
  return prompts_[size_t(order_.at(pos))];
}

}  // namespace rlhf::rl
