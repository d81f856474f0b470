#include "io/chat_template.h"

#include <nlohmann/json.hpp>

#include <atomic>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "core/error.h"
#include "core/log.h"
#include "io/jinja/jinja.h"

namespace rlhf::io {

namespace {

// --- the Jinja engine: parse once per template text, render per call -----------------------------

// The parsed template of `source` (cached: datasets render thousands of records with one template).
std::shared_ptr<const jinja::Template> parsed_template(const std::string& source,
                                                       const std::string& where) {
  static std::mutex mu;
  static std::unordered_map<std::string, std::shared_ptr<const jinja::Template>> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(source);
  if (it != cache.end()) return it->second;
  std::shared_ptr<const jinja::Template> t;
  try {
    t = std::make_shared<const jinja::Template>(source);
  } catch (const Error& e) {
    RLHF_FAIL("{}: cannot parse the Jinja template: {}", where, e.what());
  }
  cache.emplace(source, t);
  return t;
}

// A message as transformers hands it to the template (transformers 5: keys whose value is null
// dropped; a reasoning text under "reasoning_content", "thinking" or "reasoning" copied to
// "thinking" and "reasoning_content").
nlohmann::ordered_json template_message(const nlohmann::ordered_json& m) {
  if (!m.is_object()) return m;
  nlohmann::ordered_json out = nlohmann::ordered_json::object();
  const nlohmann::ordered_json* reasoning = nullptr;
  for (const char* key : {"reasoning_content", "thinking", "reasoning"}) {
    auto it = m.find(key);
    if (it != m.end() && !it->is_null()) {
      reasoning = &*it;
      break;
    }
  }
  if (reasoning) out["thinking"] = *reasoning;
  for (auto it = m.begin(); it != m.end(); ++it)
    if (!it->is_null()) out[it.key()] = *it;
  if (reasoning) out["reasoning_content"] = *reasoning;
  return out;
}

// --- built-in fallback formats
// --------------------------------------------------------------------

std::string chatml(const std::vector<ChatMessage>& messages, bool add_generation_prompt) {
  std::string out;
  for (const ChatMessage& m : messages)
    out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
  if (add_generation_prompt) out += "<|im_start|>assistant\n";
  return out;
}

// Llama 2: the system prompt is folded into the first user turn.
std::string llama2(const std::vector<ChatMessage>& messages) {
  std::string out, system;
  size_t i = 0;
  if (!messages.empty() && messages[0].role == "system") {
    system = "<<SYS>>\n" + messages[0].content + "\n<</SYS>>\n\n";
    i = 1;
  }
  bool expect_user = true;
  for (; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    RLHF_CHECK((m.role == "user") == expect_user,
               "chat message {}: the Llama 2 format needs alternating user/assistant turns "
               "starting with user, got '{}'",
               i, m.role);
    if (expect_user) {
      out += "<s>[INST] " + system + m.content + " [/INST]";
      system.clear();
    } else {
      out += " " + m.content + " </s>";
    }
    expect_user = !expect_user;
  }
  return out;
}

}  // namespace

ChatTemplateTokens chat_template_tokens(const Tokenizer& tokenizer) {
  ChatTemplateTokens t;
  const int64_t V = tokenizer.vocab_size();
  auto name_of = [&](int32_t id) -> std::optional<std::string> {
    if (id < 0 || id >= V) return std::nullopt;
    return tokenizer.id_to_token(id);
  };
  t.bos_token = name_of(tokenizer.bos_id());
  t.eos_token = name_of(tokenizer.eos_id());
  t.pad_token = name_of(tokenizer.pad_id());
  const int32_t unk = tokenizer.token_to_id("<unk>");
  if (unk >= 0) t.unk_token = "<unk>";
  return t;
}

std::string render_chat_template_json(const std::string& source, const std::string& where,
                                      const ChatTemplateTokens& tokens,
                                      const nlohmann::ordered_json& messages,
                                      bool add_generation_prompt,
                                      const nlohmann::ordered_json& extra) {
  const std::shared_ptr<const jinja::Template> t = parsed_template(source, where);
  // transformers: render(messages=, tools=, documents=, add_generation_prompt=, **special tokens,
  // **kwargs), the kwargs overriding the special tokens.
  nlohmann::ordered_json context = nlohmann::ordered_json::object();
  for (const auto& [key, value] :
       {std::pair{"bos_token", tokens.bos_token}, std::pair{"eos_token", tokens.eos_token},
        std::pair{"unk_token", tokens.unk_token}, std::pair{"pad_token", tokens.pad_token}})
    if (value) context[key] = *value;
  RLHF_CHECK(extra.is_null() || extra.is_object(), "{}: template variables must be an object",
             where);
  RLHF_CHECK(messages.is_array(), "{}: the messages must be a JSON array", where);
  nlohmann::ordered_json msgs = nlohmann::ordered_json::array();
  for (const auto& m : messages) msgs.push_back(template_message(m));
  context["messages"] = std::move(msgs);
  context["tools"] = nullptr;
  context["documents"] = nullptr;
  context["add_generation_prompt"] = add_generation_prompt;
  if (extra.is_object())
    for (auto it = extra.begin(); it != extra.end(); ++it) context[it.key()] = it.value();
  try {
    return t->render(context);
  } catch (const jinja::TemplateRaised& e) {
    RLHF_FAIL("{}: the template refused the conversation: {}", where, e.what());
  } catch (const Error& e) {
    RLHF_FAIL("{}: cannot render the Jinja template: {}", where, e.what());
  }
}

std::string render_chat_template(const std::string& source, const std::string& where,
                                 const ChatTemplateTokens& tokens,
                                 const std::vector<ChatMessage>& messages,
                                 bool add_generation_prompt) {
  nlohmann::ordered_json msgs = nlohmann::ordered_json::array();
  for (const ChatMessage& m : messages) msgs.push_back({{"role", m.role}, {"content", m.content}});
  return render_chat_template_json(source, where, tokens, msgs, add_generation_prompt, {});
}

const char* to_string(ChatFormat f) {
  return f == ChatFormat::kChatML ? "chatml" : "llama2";
}

ChatFormat fallback_chat_format(const Tokenizer& tokenizer, const std::string& model_type) {
  if (tokenizer.token_to_id("<|im_start|>") >= 0 || model_type == "qwen2")
    return ChatFormat::kChatML;
  return ChatFormat::kLlama2;
}

std::string apply_fallback_chat_format(const std::vector<ChatMessage>& messages, ChatFormat format,
                                       bool add_generation_prompt) {
  for (size_t i = 0; i < messages.size(); ++i) {
    const std::string& r = messages[i].role;
    RLHF_CHECK(r == "system" || r == "user" || r == "assistant",
               "chat message {}: unknown role '{}'\nhint: system, user or assistant", i, r);
    RLHF_CHECK(r != "system" || i == 0, "chat message {}: a system message must come first", i);
  }
  return format == ChatFormat::kChatML ? chatml(messages, add_generation_prompt) : llama2(messages);
}

std::vector<ChatMessage> chat_messages_from_json(const nlohmann::json& value,
                                                 const std::string& where) {
  std::vector<ChatMessage> messages;
  if (value.is_string()) {
    messages.push_back({"user", value.get<std::string>()});
  } else if (value.is_array()) {
    for (const auto& m : value) {
      RLHF_CHECK(m.is_object() && m.contains("role") && m["role"].is_string() &&
                     m.contains("content") && m["content"].is_string(),
                 "{}: chat messages must be objects with string role and content", where);
      messages.push_back({m["role"].get<std::string>(), m["content"].get<std::string>()});
    }
  }
  RLHF_CHECK(!messages.empty() && !messages.front().content.empty(),
             "{}: must be a non-empty string (or chat messages)", where);
  return messages;
}

std::string render_chat(const Tokenizer& tokenizer, const std::string& model_type,
                        const std::vector<ChatMessage>& messages, bool add_generation_prompt) {
  const std::string source = tokenizer.chat_template();
  if (!source.empty())
    return render_chat_template(source, "chat template of " + tokenizer.name(),
                                chat_template_tokens(tokenizer), messages, add_generation_prompt);
  const ChatFormat format = fallback_chat_format(tokenizer, model_type);
  static std::atomic<bool> announced[2] = {false, false};
  if (!announced[static_cast<int>(format)].exchange(true))
    LOG0_WARN(
        "--apply_chat_template: the tokenizer ({}) has no chat template; using the built-in {} "
        "format",
        tokenizer.name(), to_string(format));
  return apply_fallback_chat_format(messages, format, add_generation_prompt);
}

ChatSplit render_chat_split(const Tokenizer& tokenizer, const std::string& model_type,
                            const std::vector<ChatMessage>& prompt_messages,
                            const std::vector<ChatMessage>& response_messages,
                            const std::string& where) {
  std::vector<ChatMessage> all = prompt_messages;
  all.insert(all.end(), response_messages.begin(), response_messages.end());
  ChatSplit s;
  s.prompt = render_chat(tokenizer, model_type, prompt_messages, true);
  const std::string full = render_chat(tokenizer, model_type, all, false);
  RLHF_CHECK(full.compare(0, s.prompt.size(), s.prompt) == 0,
             "{}: --apply_chat_template: the conversation rendered in full does not start with "
             "its prompt rendered with the generation prompt, so the response cannot be cut off "
             "(prompt: \"{}\", full: \"{}\")",
             where, s.prompt, full);
  s.response = full.substr(s.prompt.size());
  return s;
}

}  // namespace rlhf::io
