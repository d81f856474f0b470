// Internal to the Hugging Face tokenizer (io/hf_tokenizer.cpp, io/hf_tokenizer_parse.cpp): the
// pipeline's state (HfTokenizer::Impl: vocabulary, merges, normalizer, pre-tokenizer, decoder,
// added tokens, post-processor), the text helpers it runs on, and the parsers that build each
// stage from tokenizer.json. Not part of the io API.
#pragma once

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "io/hf_tokenizer.h"
#include "io/regex.h"
#include "io/text_util.h"

namespace rlhf::io {

namespace hf {

using json = nlohmann::json;

/// Largest token id a tokenizer.json may use.
inline constexpr int64_t kMaxVocab = int64_t{1} << 24;

/// GPT-2's reversible byte → printable character map (bytes_to_unicode): printable Latin-1 bytes
/// map to themselves, the other 68 to U+0100 onwards, in byte order.
struct ByteMap {
  std::string to_char[256];                   ///< UTF-8 of the character for each byte
  std::unordered_map<uint32_t, int> to_byte;  ///< code point → byte
  ByteMap();
};
/// The one ByteMap.
const ByteMap& byte_map();

/// Decodes one UTF-8 character at s[i] (len from utf8_char_len) to its code point; an invalid
/// byte gives 0x110000 + byte (never in the byte map).
uint32_t code_point(std::string_view s, size_t i, size_t len);
/// s with every occurrence of `from` replaced by `to` (s itself when `from` is empty).
std::string replace_all(std::string_view s, std::string_view from, std::string_view to);
/// ASCII whitespace.
bool is_space(unsigned char c);
/// A word character as HF's single_word matching sees it: alphanumeric, '_' or non-ASCII.
bool is_word(unsigned char c);

/// j[key]; throws rlhf::Error "<where>: missing '<key>'" when absent.
const json& member(const json& j, const char* key, const std::string& where);
/// j[key] as a string, `def` when absent or null; throws rlhf::Error when not a string.
std::string str_member(const json& j, const char* key, const std::string& where,
                       const std::string& def = "");
/// j[key] as a bool, `def` when absent or not a boolean.
bool bool_member(const json& j, const char* key, bool def);
/// "<s>" or {"content": "<s>", ...} or null → the token text ("" for none).
std::string token_name(const json& j);

/// How a Split pre-tokenizer keeps its delimiters (HF tokenizers' SplitDelimiterBehavior).
enum class Behavior { kIsolated, kRemoved, kMergedWithPrevious, kMergedWithNext, kContiguous };
/// The Behavior named s; throws rlhf::Error naming `where` for another name.
Behavior behavior_from(const std::string& s, const std::string& where);

/// A pre-token: its text and whether it starts at offset 0 of the original input.
struct Piece {
  std::string text;
  bool at_start = false;
};

}  // namespace hf

// The pipeline below runs on these (only files that include this internal header see them).
using hf::Behavior;
using hf::byte_map;
using hf::code_point;
using hf::is_space;
using hf::is_word;
using hf::Piece;
using hf::replace_all;

// The tokenizer's pipeline, as tokenizer.json describes it.
struct HfTokenizer::Impl {
  struct NormStep {
    enum Kind { kPrepend, kReplace, kIdentity, kStrip } kind;
    std::string a, b;
    bool left = false, right = false;
  };
  struct PreStep {
    enum Kind { kByteLevel, kSplit, kMetaspace } kind;
    bool add_prefix_space = false;
    std::shared_ptr<Regex> re;  // Split, Digits, ByteLevel with use_regex
    Behavior behavior = Behavior::kIsolated;
    bool invert = false;
    std::string replacement;                // Metaspace
    std::string prepend_scheme = "always";  // Metaspace
    bool split = true;                      // Metaspace
  };
  struct DecStep {
    enum Kind { kByteLevel, kReplace, kByteFallback, kFuse, kStrip, kMetaspace } kind;
    std::string a, b;
    int64_t start = 0, stop = 0;
    bool prepend = true;
  };
  struct Added {
    std::string content, match;
    int32_t id = -1;
    bool special = false, lstrip = false, rstrip = false, normalized = false, single_word = false;
  };

  std::string source;
  std::unordered_map<std::string, int32_t> vocab;
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merges;  // (a, b) → (rank, new id)
  bool byte_fallback = false, fuse_unk = false, ignore_merges = false;
  int32_t unk_id = -1;
  int32_t byte_ids[256];
  std::vector<NormStep> norm;
  std::vector<PreStep> pre;
  std::vector<DecStep> dec;
  bool has_decoder = false;
  std::vector<Added> added_raw, added_norm;  // longest match first
  std::unordered_map<std::string, int32_t> added_index;
  std::unordered_set<int32_t> special_ids;
  std::vector<int32_t> prefix, suffix;
  bool have_template = false;

  static uint64_t key(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }

  /// s through the normalizer steps, in order.
  std::string normalize(std::string_view s) const;

  // Splits `text` on the added tokens `list` (leftmost, then longest); segments carry their offset.
  struct Seg {
    std::string_view text;
    int32_t id;
    size_t offset;
  };
  std::vector<Seg> split_added(std::string_view text, const std::vector<Added>& list) const;
  /// text through the pre-tokenizer steps: the pieces BPE encodes one by one.
  std::vector<Piece> pretokenize(std::string text, bool at_start) const;
  /// Byte-pair encodes one pre-token (merges by rank; byte fallback / unk as configured).
  void bpe(std::string_view word, std::vector<int32_t>& out) const;
};

namespace hf {

/// The parsers of tokenizer.json's stages (HF tokenizers' JSON schema), each appending to m;
/// `src` names the file in errors. Unsupported types and malformed entries throw rlhf::Error
/// naming the stage and the type.
/// model.merges ("a b" strings or [a, b] pairs) into m.merges (m.vocab must be filled).
void parse_merges(HfTokenizer::Impl& m, const json& model, const std::string& src);
/// "normalizer" (Sequence, Prepend, Replace with a string pattern, NFC, Strip) into m.norm.
void parse_normalizer(HfTokenizer::Impl& m, const json& n, const std::string& src);
/// "pre_tokenizer" (Sequence, ByteLevel, Split, Metaspace, Digits) into m.pre; returns whether
/// a ByteLevel step was seen.
bool parse_pre_tokenizer(HfTokenizer::Impl& m, const json& p, const std::string& src);
/// "decoder" (Sequence, ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace) into m.dec.
void parse_decoder(HfTokenizer::Impl& m, const json& d, const std::string& src);
/// "post_processor" (Sequence, ByteLevel, TemplateProcessing) into m.prefix / m.suffix; special
/// token ids must be below vocab_size.
void parse_post_processor(HfTokenizer::Impl& m, const json& p, const std::string& src,
                          int64_t vocab_size);

}  // namespace hf
}  // namespace rlhf::io
