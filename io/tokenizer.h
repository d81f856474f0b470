// Tokenizers behind one interface: the byte-level tokenizer now, real ones (SentencePiece, BPE)
// later.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace rlhf::io {

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

/// The tokenizer named by `spec`: "byte" → ByteTokenizer. Throws rlhf::Error (with the known
/// names) for anything else.
std::unique_ptr<Tokenizer> make_tokenizer(const std::string& spec);

}  // namespace rlhf::io
