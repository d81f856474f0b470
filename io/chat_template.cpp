#include "io/chat_template.h"

#include <minja/minja.hpp>  // third_party/minja (system include: its warnings are not ours)
#include <nlohmann/json.hpp>

#include <atomic>
#include <ctime>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <unordered_map>

#include "core/error.h"
#include "core/log.h"

namespace rlhf::io {

namespace {

// --- minja: parse once per template text, render per call ----------------------------------------

// minja appends " at row R, column C:\n<lines>" once per enclosing node; keep the message and the
// innermost location only.
std::string innermost_error(const std::string& what) {
  const std::string marker = " at row ";
  const size_t first = what.find(marker);
  if (first == std::string::npos) return what;
  const size_t second = what.find(marker, first + marker.size());
  std::string out = what.substr(0, second);
  while (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

// The parsed template of `source` (cached: datasets render thousands of records with one template).
std::shared_ptr<minja::TemplateNode> parsed_template(const std::string& source,
                                                     const std::string& where) {
  static std::mutex mu;
  static std::unordered_map<std::string, std::shared_ptr<minja::TemplateNode>> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(source);
  if (it != cache.end()) return it->second;
  std::shared_ptr<minja::TemplateNode> root;
  try {
    // transformers compiles chat templates with trim_blocks=True, lstrip_blocks=True.
    root = minja::Parser::parse(source, minja::Options{/*trim_blocks=*/true,
                                                       /*lstrip_blocks=*/true,
                                                       /*keep_trailing_newline=*/false});
  } catch (const std::exception& e) {
    RLHF_FAIL("{}: cannot parse the Jinja template: {}", where, innermost_error(e.what()));
  }
  cache.emplace(source, root);
  return root;
}

// Python's datetime.now().strftime(fmt) (local time), as transformers defines strftime_now.
std::string strftime_now(const std::string& fmt) {
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  std::string buf(256, '\0');
  const size_t n = std::strftime(buf.data(), buf.size(), fmt.c_str(), &local);
  buf.resize(n);
  return buf;
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

std::string render_chat_template(const std::string& source, const std::string& where,
                                 const ChatTemplateTokens& tokens,
                                 const std::vector<ChatMessage>& messages,
                                 bool add_generation_prompt) {
  const std::shared_ptr<minja::TemplateNode> root = parsed_template(source, where);
  nlohmann::ordered_json msgs = nlohmann::ordered_json::array();
  for (const ChatMessage& m : messages) msgs.push_back({{"role", m.role}, {"content", m.content}});
  nlohmann::ordered_json values = {{"messages", std::move(msgs)},
                                   {"add_generation_prompt", add_generation_prompt}};
  auto context = minja::Context::make(minja::Value(values));
  for (const auto& [key, value] :
       {std::pair{"bos_token", tokens.bos_token}, std::pair{"eos_token", tokens.eos_token},
        std::pair{"pad_token", tokens.pad_token}, std::pair{"unk_token", tokens.unk_token}})
    if (value) context->set(key, minja::Value(*value));
  // raise_exception: minja wraps every exception on its way out (and loses its type), so the
  // template's own message is kept aside.
  auto raised = std::make_shared<std::optional<std::string>>();
  context->set("raise_exception",
               minja::Value::callable([raised](const std::shared_ptr<minja::Context>&,
                                               minja::ArgumentsValue& args) -> minja::Value {
                 args.expectArgs("raise_exception", {1, 1}, {0, 0});
                 *raised = args.args[0].is_string() ? args.args[0].get<std::string>()
                                                    : args.args[0].dump();
                 throw std::runtime_error(**raised);
               }));
  context->set("strftime_now",
               minja::Value::callable([](const std::shared_ptr<minja::Context>&,
                                         minja::ArgumentsValue& args) -> minja::Value {
                 args.expectArgs("strftime_now", {1, 1}, {0, 0});
                 return minja::Value(strftime_now(args.args[0].get<std::string>()));
               }));
  try {
    return root->render(context);
  } catch (const std::exception& e) {
    if (*raised) RLHF_FAIL("{}: the template refused the conversation: {}", where, **raised);
    RLHF_FAIL("{}: cannot render the Jinja template: {}", where, innermost_error(e.what()));
  }
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
