// Tokenizers behind one interface: the byte-level tokenizer, and the tokenizers that come with
// real models (io/hf_tokenizer.h: Hugging Face tokenizer.json BPE; io/spm_tokenizer.h: llama2.c
// tokenizer.bin and GGUF vocabularies; io/sp_tokenizer.h: SentencePiece tokenizer.model), picked
// by make_tokenizer from a file or folder.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace rlhf::io {

/// A file that recreates a tokenizer: its base name and its bytes. Stored in checkpoints
/// (/tokenizer/<name>) and copied by exports.
struct TokenizerFile {
  std::string name;
  std::string bytes;
};

/// Text ⇄ token ids. Implementations are immutable after construction and thread-safe to use.
class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  /// Token ids of `text` (UTF-8 or any bytes), with bos_id() in front when `add_bos` and eos_id()
  /// at the end when `add_eos`.
  virtual std::vector<int32_t> encode(std::string_view text, bool add_bos, bool add_eos) const = 0;
  /// Text of `ids`; special tokens (BOS/EOS/PAD) are dropped when `skip_special_tokens`, else
  /// rendered by name. The result may end inside a UTF-8 sequence if `ids` do.
  /// Throws rlhf::Error for an id outside [0, vocab_size()).
  virtual std::string decode(std::span<const int32_t> ids,
                             bool skip_special_tokens = true) const = 0;

  virtual int32_t bos_id() const = 0;
  virtual int32_t eos_id() const = 0;
  virtual int32_t pad_id() const = 0;
  virtual int64_t vocab_size() const = 0;
  /// True for BOS, EOS, PAD and other control tokens.
  virtual bool is_special(int32_t id) const = 0;
  /// Short description for logs, e.g. "byte (vocab 259)".
  virtual std::string name() const = 0;

  /// What make_tokenizer_from_files needs to rebuild it: "byte" | "hf" (tokenizer.json) |
  /// "llama2c" (tokenizer.bin) | "sentencepiece" (tokenizer.model) | "gguf" (a GGUF vocabulary).
  virtual std::string kind() const { return "byte"; }
  /// The files that recreate this tokenizer (none for "byte").
  virtual std::vector<TokenizerFile> files() const { return {}; }
  /// Id of the vocabulary entry or added/special token spelled `token` (e.g. "<|im_start|>",
  /// "<s>"), or -1 when there is none.
  virtual int32_t token_to_id(std::string_view token) const {
    (void)token;
    return -1;
  }
  /// The raw vocabulary entry of `id` (e.g. "▁Once", "<0x0A>", "<s>"); throws rlhf::Error for an
  /// id outside the vocabulary.
  virtual std::string id_to_token(int32_t id) const {
    const int32_t one[1] = {id};
    return decode(std::span<const int32_t>(one, 1), false);
  }
  /// The chat template (Jinja text from tokenizer_config.json), or "" when the tokenizer has none.
  virtual std::string chat_template() const { return ""; }
};

/// Byte-level tokenizer: ids 0..255 are the bytes, 256 = BOS, 257 = EOS, 258 = PAD; vocab 259.
/// encode/decode round-trip any byte string exactly (UTF-8 is not interpreted).
class ByteTokenizer final : public Tokenizer {
 public:
  static constexpr int32_t kBos = 256, kEos = 257, kPad = 258;
  static constexpr int64_t kVocabSize = 259;

  std::vector<int32_t> encode(std::string_view text, bool add_bos, bool add_eos) const override;
  /// Special tokens render as "<s>", "</s>", "<pad>" when not skipped.
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens = true) const override;
  int32_t bos_id() const override { return kBos; }
  int32_t eos_id() const override { return kEos; }
  int32_t pad_id() const override { return kPad; }
  int64_t vocab_size() const override { return kVocabSize; }
  bool is_special(int32_t id) const override { return id >= kBos && id < kVocabSize; }
  std::string name() const override { return "byte (vocab 259)"; }
};

/// The tokenizer named by `spec`:
///  - "byte" → ByteTokenizer;
///  - a folder → its tokenizer.json (with tokenizer_config.json when present), else
///    tokenizer.model, else tokenizer.bin (llama2.c), else tokenizer.gguf;
///  - a file, by content: JSON → Hugging Face tokenizer.json; "GGUF" magic → the vocabulary
///    embedded in a GGUF file; *.model → SentencePiece; otherwise a llama2.c tokenizer.bin.
/// Throws rlhf::Error naming the file and what is wrong (missing, corrupt, unsupported model type),
/// or, for an unknown name, listing what `spec` can be.
std::unique_ptr<Tokenizer> make_tokenizer(const std::string& spec);

/// Rebuilds a tokenizer of `kind` (Tokenizer::kind()) from its files (Tokenizer::files()), e.g.
/// as stored in a checkpoint; `source` names where they came from in messages.
std::unique_ptr<Tokenizer> make_tokenizer_from_files(const std::string& kind,
                                                     const std::vector<TokenizerFile>& files,
                                                     const std::string& source);

}  // namespace rlhf::io
