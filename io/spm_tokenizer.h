// Score-based SentencePiece-style BPE: the tokenizer of llama2.c (tokenizer.bin) and of GGUF files
// whose tokenizer.ggml.model is "llama". Encoding follows llama2.c's encoder (run.c, `encode`):
// a space is put in front of the text (SentencePiece's dummy prefix), each UTF-8 character becomes
// its vocabulary piece or, when it has none, one <0xXX> piece per byte (byte fallback), then the
// adjacent pair whose concatenation is the highest-scoring piece is merged (leftmost on ties) until
// no pair is a piece. Pieces use ' ' for SentencePiece's '▁' (GGUF pieces are converted on load).
#pragma once

#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "io/bytes.h"
#include "io/tokenizer.h"

namespace rlhf::io {

struct GgufFile;

/// Token types (GGUF's tokenizer.ggml.token_type values).
enum class TokenType : int32_t {
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,
  kUserDefined = 4,
  kUnused = 5,
  kByte = 6,
};

/// A score-based vocabulary: piece text (with ' ' for '▁'), score, type.
struct ScoreVocab {
  std::vector<std::string> pieces;
  std::vector<float> scores;
  std::vector<TokenType> types;
  int32_t bos_id = 1, eos_id = 2, unk_id = 0, pad_id = -1;
  bool add_space_prefix = true;
  std::string chat_template;  ///< Jinja text (GGUF tokenizer.chat_template), "" when none
};

/// The tokenizer; see the file comment. Control and user-defined tokens (and, for llama2.c files,
/// "<unk>", "<s>", "</s>") written in the text are encoded as their ids, as Hugging Face's Llama
/// tokenizer does; each stretch of text between them gets its own dummy prefix.
class ScoreTokenizer final : public Tokenizer {
 public:
  /// `kind` is "llama2c" or "gguf"; `files` what files() returns; `label` for name().
  ScoreTokenizer(ScoreVocab vocab, std::string kind, std::vector<TokenizerFile> files,
                 std::string label);

  std::vector<int32_t> encode(std::string_view text, bool add_bos, bool add_eos) const override;
  /// Concatenates the pieces, <0xXX> pieces as their byte, and drops the one leading space of the
  /// first piece (SentencePiece's dummy prefix). Special tokens render as "<unk>", "<s>", "</s>"
  /// (or their GGUF text) when not skipped.
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens = true) const override;
  int32_t bos_id() const override { return v_.bos_id; }
  int32_t eos_id() const override { return v_.eos_id; }
  int32_t pad_id() const override { return v_.pad_id >= 0 ? v_.pad_id : v_.unk_id; }
  int64_t vocab_size() const override { return static_cast<int64_t>(v_.pieces.size()); }
  bool is_special(int32_t id) const override;
  std::string name() const override { return label_; }
  std::string kind() const override { return kind_; }
  std::vector<TokenizerFile> files() const override { return files_; }
  int32_t token_to_id(std::string_view token) const override;
  std::string id_to_token(int32_t id) const override;
  std::string chat_template() const override { return v_.chat_template; }

  const ScoreVocab& vocab() const { return v_; }

 private:
  void encode_text(std::string_view text, std::vector<int32_t>& out) const;

  ScoreVocab v_;
  std::string kind_, label_;
  std::vector<TokenizerFile> files_;
  std::unordered_map<std::string, int32_t> index_;
  std::vector<std::pair<std::string, int32_t>> specials_;  // text form → id, longest first
  int32_t byte_ids_[256];
};

/// Parses a llama2.c tokenizer.bin: int32 max_token_length, then, until the end of the file,
/// entries (float score, int32 length, bytes). Checks every length against the remaining bytes and
/// against max_token_length (<= 1 MiB), and requires at least 3 entries (<unk>, <s>, </s>).
/// Ids 0, 1, 2 are <unk>, BOS, EOS; <0xXX> pieces are byte tokens.
ScoreVocab parse_llama2c_tokenizer(const Blob& blob);

/// The ScoreTokenizer of a llama2.c tokenizer.bin blob (file name = the blob's base name).
std::unique_ptr<ScoreTokenizer> load_llama2c_tokenizer(const Blob& blob);

/// The tokenizer embedded in a GGUF file: tokenizer.ggml.model "llama" → ScoreTokenizer; "gpt2" →
/// a byte-level BPE (io/hf_tokenizer.h); a tokenizer.huggingface.json key (written by export_gguf
/// when the tokenizer.ggml.* keys cannot express a tokenizer exactly) → that tokenizer.json;
/// the byte vocabulary export_gguf writes for ByteTokenizer (<0x00>..<0xFF>, <s>, </s>, <pad>) →
/// ByteTokenizer. Returns null when the file has no tokenizer.ggml.tokens.
/// Throws rlhf::Error when the vocabulary is inconsistent (array lengths differ, bad ids) or the
/// model type is not supported. `gguf_bytes` is the file the tokenizer is stored as (a
/// tokenizer-only GGUF; see gguf_tokenizer_file).
std::unique_ptr<Tokenizer> load_gguf_tokenizer(const GgufFile& f);

/// The tokenizer.ggml.token_type of `f` (kNormal for every token when the key is absent); throws
/// rlhf::Error when its length differs from tokenizer.ggml.tokens' or a value is not 1..6.
std::vector<TokenType> gguf_token_types(const GgufFile& f);

class GgufWriter;
/// Adds every tokenizer.* key of `f` but those in `skip` to `w` with its GGUF type (strings,
/// bools, u32/i32, f32, string/f32/i32 arrays).
void copy_gguf_tokenizer_keys(GgufWriter& w, const GgufFile& f,
                              const std::set<std::string>& skip = {});

/// A GGUF file (bytes) with no tensors that carries only `f`'s tokenizer.* metadata: what a
/// GGUF-vocabulary tokenizer stores in checkpoints as "tokenizer.gguf".
std::string gguf_tokenizer_file(const GgufFile& f);

}  // namespace rlhf::io
