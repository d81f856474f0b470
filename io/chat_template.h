// Basic chat templates: the two formats most Llama-family chat models use, chosen from the
// tokenizer's chat_template (tokenizer_config.json) or the model type. Not a Jinja interpreter:
// the template text only selects the format.
//   ChatML (Qwen2, SmolLM-Instruct, ...):
//     <|im_start|>{role}\n{content}<|im_end|>\n ... [<|im_start|>assistant\n]
//   Llama 2 [INST] (Llama-2-chat, Mistral-Instruct, TinyLlama-chat v0.x):
//     <s>[INST] <<SYS>>\n{system}\n<</SYS>>\n\n{user} [/INST] {assistant} </s><s>[INST] {user}
//     [/INST]
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <string>
#include <vector>

#include "io/tokenizer.h"

namespace rlhf::io {

/// One chat message: role "system" | "user" | "assistant", and its text.
struct ChatMessage {
  std::string role;
  std::string content;
};

enum class ChatFormat { kChatML, kLlama2 };

/// "chatml" | "llama2".
const char* to_string(ChatFormat f);

/// The format for a tokenizer and model: its chat_template mentions "<|im_start|>" → ChatML, or
/// "[INST]" → Llama 2; without a template, a vocabulary with "<|im_start|>" or model_type
/// "qwen2" → ChatML, otherwise Llama 2.
ChatFormat detect_chat_format(const Tokenizer& tokenizer, const std::string& model_type);

/// Formats `messages` as text (to be encoded with add_bos = false: the Llama 2 form writes its own
/// "<s>", which the tokenizers encode as BOS). add_generation_prompt appends the assistant header
/// (ChatML) — the Llama 2 form already ends ready for the answer after a user turn. Throws
/// rlhf::Error for an unknown role, a system message that is not first, or (Llama 2) turns that do
/// not alternate user/assistant.
std::string apply_chat_template(const std::vector<ChatMessage>& messages, ChatFormat format,
                                bool add_generation_prompt);

/// A prompt or conversation as read from a dataset value: a string is one user turn; an array of
/// {"role", "content"} objects (string values) is taken as is. Throws rlhf::Error naming `where`
/// (e.g. "data.jsonl:3: key 'prompt'") for any other value or an empty conversation.
std::vector<ChatMessage> chat_messages_from_json(const nlohmann::json& value,
                                                 const std::string& where);

/// The text the model's chat template makes of `messages` (what transformers'
/// `tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=...)` returns),
/// to be encoded with add_bos = false (templates write their own BOS). `model_type` picks the
/// format when the tokenizer has no template. Throws rlhf::Error for messages the template refuses.
std::string render_chat(const Tokenizer& tokenizer, const std::string& model_type,
                        const std::vector<ChatMessage>& messages, bool add_generation_prompt);

}  // namespace rlhf::io
