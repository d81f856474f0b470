// Unicode regular expressions for tokenizer pre-tokenizers (GPT-2 / Llama-3 / Qwen2 split
// patterns with \p{L}, \p{N}, lookahead), through PCRE2 (Debian libpcre2-dev). Without PCRE2 in
// the build (RLHF_HAVE_PCRE2 undefined), constructing a Regex throws rlhf::Error.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

namespace rlhf::io {

/// True when this build has PCRE2 (tokenizers with regex pre-tokenizers work).
bool regex_available();

/// A compiled pattern (UTF-8, Unicode properties; invalid UTF-8 in the subject never matches but
/// is not an error). Immutable and thread-safe after construction.
class Regex {
 public:
  /// Compiles `pattern`; throws rlhf::Error naming `source` and the position of a syntax error, or
  /// when PCRE2 is not available.
  Regex(const std::string& pattern, const std::string& source);

  /// Calls fn(begin, end) with the byte range of every non-overlapping, non-empty match in `s`,
  /// left to right.
  void for_each_match(std::string_view s, const std::function<void(size_t, size_t)>& fn) const;

  const std::string& pattern() const { return pattern_; }

 private:
  std::string pattern_, source_;
  std::shared_ptr<void> code_;  // pcre2_code_8
};

/// Escapes `literal` so that it matches itself as a PCRE2 pattern.
std::string regex_escape(std::string_view literal);

}  // namespace rlhf::io
