#include "io/chat_template.h"

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace rlhf::io {

const char* to_string(ChatFormat f) {
  return f == ChatFormat::kChatML ? "chatml" : "llama2";
}

ChatFormat detect_chat_format(const Tokenizer& tokenizer, const std::string& model_type) {
  const std::string t = tokenizer.chat_template();
  if (t.find("<|im_start|>") != std::string::npos) return ChatFormat::kChatML;
  if (t.find("[INST]") != std::string::npos) return ChatFormat::kLlama2;
  if (tokenizer.token_to_id("<|im_start|>") >= 0 || model_type == "qwen2")
    return ChatFormat::kChatML;
  return ChatFormat::kLlama2;
}

std::string apply_chat_template(const std::vector<ChatMessage>& messages, ChatFormat format,
                                bool add_generation_prompt) {
  for (size_t i = 0; i < messages.size(); ++i) {
    const std::string& r = messages[i].role;
    RLHF_CHECK(r == "system" || r == "user" || r == "assistant",
               "chat message {}: unknown role '{}'\nhint: system, user or assistant", i, r);
    RLHF_CHECK(r != "system" || i == 0, "chat message {}: a system message must come first", i);
  }
  std::string out;
  if (format == ChatFormat::kChatML) {
    for (const ChatMessage& m : messages)
      out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
    if (add_generation_prompt) out += "<|im_start|>assistant\n";
    return out;
  }
  // Llama 2: the system prompt is folded into the first user turn.
  size_t i = 0;
  std::string system;
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
  return apply_chat_template(messages, detect_chat_format(tokenizer, model_type),
                             add_generation_prompt);
}

}  // namespace rlhf::io
