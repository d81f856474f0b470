// Hugging Face `tokenizer.json` BPE tokenizers (the `tokenizers` library's serialisation), both
// kinds that Llama-family models ship:
//  - byte-level BPE (GPT-2 style; SmolLM, Qwen2, Llama 3): a regex pre-tokenizer splits the text,
//    each piece's bytes are mapped to printable characters, then ranked merges apply;
//  - SentencePiece-style BPE (Llama 2, TinyStories-656K): a normalizer prepends '▁' and maps ' ' to
//    '▁' (or a Metaspace pre-tokenizer does), ranked merges over characters, byte fallback to
//    <0xXX> tokens for characters outside the vocabulary.
// Supported components: normalizers Sequence, Prepend, Replace, NFC (taken as identity: inputs are
// assumed NFC), Strip; pre-tokenizers Sequence, ByteLevel, Split (Isolated, Removed,
// MergedWithPrevious, MergedWithNext), Metaspace, Digits; model BPE (byte_fallback, fuse_unk,
// ignore_merges; merges as "a b" strings or [a, b] pairs); post-processors TemplateProcessing,
// ByteLevel, Sequence; decoders Sequence, ByteLevel, Replace, ByteFallback, Fuse, Strip,
// Metaspace. Anything else is a clear error when the file is loaded. Added tokens are split out
// first, as the library does: non-normalized ones on the raw text, normalized ones on the
// normalized text (matching their normalized form), leftmost-longest, with lstrip/rstrip/
// single_word.
// Deliberate differences: decode keeps invalid UTF-8 bytes from byte tokens as they are (the
// library substitutes U+FFFD), so decode(encode(x)) == x for any bytes; transformers'
// clean_up_tokenization_spaces is not applied.
// tokenizer_config.json's split_special_tokens (transformers) is honoured: special added tokens
// written in the text are then tokenized as text.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <memory>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "io/spm_tokenizer.h"
#include "io/tokenizer.h"

namespace rlhf::io {

class Regex;

/// A tokenizer.json BPE tokenizer; see the file comment.
class HfTokenizer final : public Tokenizer {
 public:
  /// `tokenizer_json`: the parsed tokenizer.json; `config_json`: tokenizer_config.json (or null):
  /// bos/eos/pad/unk token names, add_bos_token, chat_template. `files` is what files() returns;
  /// `source` names the file in messages. Throws rlhf::Error for unsupported or corrupt content.
  HfTokenizer(const nlohmann::json& tokenizer_json, const nlohmann::json& config_json,
              std::vector<TokenizerFile> files, std::string source, std::string kind = "hf");
  ~HfTokenizer() override;

  /// add_bos: the special tokens the post-processor puts before the text (TemplateProcessing's
  /// "single" prefix, e.g. <|start_story|>), else bos_token when tokenizer_config.json sets
  /// add_bos_token, else nothing. add_eos: the template's suffix, else eos_token.
  std::vector<int32_t> encode(std::string_view text, bool add_bos, bool add_eos) const override;
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens = true) const override;
  /// The template's first prefix token, else bos_token; -1 if the tokenizer has none (Qwen2).
  int32_t bos_id() const override { return bos_id_; }
  /// eos_token (tokenizer_config.json / special_tokens_map.json), else the template's suffix;
  /// -1 if none.
  int32_t eos_id() const override { return eos_id_; }
  /// pad_token, else unk, else eos, else 0.
  int32_t pad_id() const override { return pad_id_; }
  /// 1 + the largest id of the vocabulary and the added tokens.
  int64_t vocab_size() const override { return static_cast<int64_t>(tokens_.size()); }
  /// Added tokens marked special, and the BOS/EOS/PAD/UNK ids.
  bool is_special(int32_t id) const override;
  std::string name() const override { return label_; }
  std::string kind() const override { return kind_; }
  std::vector<TokenizerFile> files() const override { return files_; }
  int32_t token_to_id(std::string_view token) const override;
  std::string id_to_token(int32_t id) const override;
  std::string chat_template() const override { return chat_template_; }

  /// True for a byte-level (GPT-2 style) tokenizer.
  bool byte_level() const { return byte_level_; }

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
  std::vector<std::string> tokens_;  // id → token text (vocab and added tokens)
  int32_t bos_id_ = -1, eos_id_ = -1, pad_id_ = 0;
  bool byte_level_ = false;
  std::string label_, kind_, chat_template_;
  std::vector<TokenizerFile> files_;
};

/// Loads `path` (a tokenizer.json) with tokenizer_config.json and special_tokens_map.json from the
/// same folder when present (they travel with it in files()).
std::unique_ptr<HfTokenizer> load_hf_tokenizer(const std::string& path);

/// Rebuilds an HfTokenizer from stored files (tokenizer.json required; tokenizer_config.json and
/// special_tokens_map.json optional).
std::unique_ptr<HfTokenizer> hf_tokenizer_from_files(const std::vector<TokenizerFile>& files,
                                                     const std::string& source);

struct GgufFile;
/// The byte-level BPE of a GGUF file whose tokenizer.ggml.model is "gpt2": tokens, merges,
/// token types, tokenizer.ggml.pre (selects the split regex: "llama-bpe"/"llama3" → Llama 3's,
/// "qwen2" → Qwen2's, "smollm"/"gpt-2"/default → GPT-2's), BOS/EOS/PAD ids.
std::unique_ptr<Tokenizer> load_gguf_bpe_tokenizer(const GgufFile& f,
                                                   const std::vector<TokenType>& types,
                                                   std::vector<TokenizerFile> files);

/// The tokenizer.json (`tokenizer_json`) and tokenizer_config.json (`config_json`: bos/eos/pad
/// token names, add_bos_token, chat_template) that load_gguf_bpe_tokenizer builds for a GGUF "gpt2"
/// vocabulary; `types` as there. Throws rlhf::Error for inconsistent metadata.
void gguf_bpe_tokenizer_json(const GgufFile& f, const std::vector<TokenType>& types,
                             nlohmann::json* tokenizer_json, nlohmann::json* config_json);

/// The GPT-2 pre-tokenizer pattern (HF ByteLevel with use_regex).
extern const char* const kGpt2SplitPattern;

}  // namespace rlhf::io
