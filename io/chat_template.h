// Chat templates: conversations rendered as the model's own Jinja chat template renders them
// (transformers' `tokenizer.apply_chat_template(messages, tokenize=False, ...)`), through the
// project's Jinja engine (io/jinja: the Jinja2 subset chat templates use). The template is the
// tokenizer's chat_template() (tokenizer_config.json's "chat_template", or GGUF
// "tokenizer.chat_template").
//
// A tokenizer without a template falls back to one of two built-in formats (logged once):
//   ChatML (Qwen2, SmolLM-Instruct, ...): when the vocabulary has "<|im_start|>" or model_type is
//   "qwen2"
//     <|im_start|>{role}\n{content}<|im_end|>\n ... [<|im_start|>assistant\n]
//   Llama 2 [INST] (Llama-2-chat, Mistral-Instruct, TinyLlama-chat v0.x): otherwise
//     <s>[INST] <<SYS>>\n{system}\n<</SYS>>\n\n{user} [/INST] {assistant} </s><s>[INST] {user}
//     [/INST]
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <optional>
#include <string>
#include <vector>

#include "io/tokenizer.h"

namespace rlhf::io {

/// One chat message: its role ("system", "user", "assistant", or any role the template knows)
/// and its text.
struct ChatMessage {
  std::string role;
  std::string content;
};

/// The special tokens a template sees as bos_token, eos_token, pad_token, unk_token (transformers
/// passes the tokenizer's special_tokens_map); an unset one is undefined in the template.
struct ChatTemplateTokens {
  std::optional<std::string> bos_token, eos_token, pad_token, unk_token;
};

/// The special tokens of `tokenizer` by name: BOS and EOS when it has them (id >= 0), PAD as
/// Tokenizer::pad_id names it (which falls back to UNK or EOS where the tokenizer sets none),
/// unk_token only when the vocabulary spells "<unk>" (the Tokenizer interface has no UNK id).
/// Chat templates in practice use bos_token and eos_token only.
ChatTemplateTokens chat_template_tokens(const Tokenizer& tokenizer);

/// Renders the Jinja chat template `source` as transformers does: trim_blocks and lstrip_blocks
/// on, context {messages: [{role, content}], tools: None, documents: None, add_generation_prompt,
/// the tokens that are set}, raise_exception(msg) (aborts the render with msg), strftime_now(fmt)
/// (local time, as Python's datetime.now().strftime). Undefined variables render as "" (Jinja's
/// default Undefined), so a template's own defaults (`if not date_string is defined`) apply.
/// Parsed templates are cached by text (thread-safe). Throws rlhf::Error naming `where` (e.g.
/// "chat template of tokenizer.json") with the template's raise_exception message, or the parse or
/// render error with its line and column (including any construct the engine does not support).
std::string render_chat_template(const std::string& source, const std::string& where,
                                 const ChatTemplateTokens& tokens,
                                 const std::vector<ChatMessage>& messages,
                                 bool add_generation_prompt);

/// render_chat_template with messages as JSON objects (any keys: tool_calls, tool_call_id,
/// reasoning_content, ...; as transformers 5 hands them over: null values dropped, reasoning
/// copied to "thinking" and "reasoning_content") and `extra` template variables (tools,
/// documents, enable_thinking, ...: an object, or null for none) that override the defaults.
/// Errors as render_chat_template.
std::string render_chat_template_json(const std::string& source, const std::string& where,
                                      const ChatTemplateTokens& tokens,
                                      const nlohmann::ordered_json& messages,
                                      bool add_generation_prompt,
                                      const nlohmann::ordered_json& extra);

/// The two built-in formats used when a tokenizer has no chat template.
enum class ChatFormat { kChatML, kLlama2 };

/// "chatml" | "llama2".
const char* to_string(ChatFormat f);

/// The built-in format for a tokenizer without a template: ChatML when its vocabulary has
/// "<|im_start|>" or model_type is "qwen2", else Llama 2.
ChatFormat fallback_chat_format(const Tokenizer& tokenizer, const std::string& model_type);

/// Formats `messages` in a built-in format (to be encoded with add_bos = false: the Llama 2 form
/// writes its own "<s>"). add_generation_prompt appends the assistant header (ChatML); the Llama 2
/// form already ends ready for the answer after a user turn. Throws rlhf::Error for an unknown
/// role, a system message that is not first, or (Llama 2) turns that do not alternate
/// user/assistant.
std::string apply_fallback_chat_format(const std::vector<ChatMessage>& messages, ChatFormat format,
                                       bool add_generation_prompt);

/// A prompt or conversation as read from a dataset value: a string is one user turn; an array of
/// {"role", "content"} objects (string values) is taken as is. Throws rlhf::Error naming `where`
/// (e.g. "data.jsonl:3: key 'prompt'") for any other value or an empty conversation.
std::vector<ChatMessage> chat_messages_from_json(const nlohmann::json& value,
                                                 const std::string& where);

/// The text the model's chat template makes of `messages`: what transformers'
/// `tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=...)` returns
/// (render_chat_template of tokenizer.chat_template() with chat_template_tokens(tokenizer)), to be
/// encoded with add_bos = false (templates write their own BOS). Without a template, the built-in
/// fallback_chat_format(tokenizer, model_type), announced once per format in the log. Throws
/// rlhf::Error for messages the template refuses (its raise_exception message) or a broken
/// template, naming the tokenizer.
std::string render_chat(const Tokenizer& tokenizer, const std::string& model_type,
                        const std::vector<ChatMessage>& messages, bool add_generation_prompt);

/// A prompt and its response as the chat template splits them, OpenRLHF's SFTDataset/RewardDataset
/// way: prompt = render(prompt_messages, add_generation_prompt = true), response = render(
/// prompt_messages + response_messages, false) with that prompt cut off its front. Throws
/// rlhf::Error when the full render does not start with the prompt render (a template that
/// renders earlier turns differently once later ones exist), naming `where`.
struct ChatSplit {
  std::string prompt, response;
};
ChatSplit render_chat_split(const Tokenizer& tokenizer, const std::string& model_type,
                            const std::vector<ChatMessage>& prompt_messages,
                            const std::vector<ChatMessage>& response_messages,
                            const std::string& where);

}  // namespace rlhf::io
