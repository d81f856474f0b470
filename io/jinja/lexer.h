// Jinja lexer (io/jinja): template text → tokens, with the whitespace rules transformers compiles
// chat templates with (jinja2.Environment(trim_blocks=True, lstrip_blocks=True), newlines
// normalised to "\n", one trailing newline dropped): `{%-`/`-%}` (and `{{-`, `-}}`, `{#-`, `-#}`)
// strip all white space on that side, a block or comment tag eats the newline after it, and the
// spaces and tabs before a block or comment tag alone on its line are dropped (`{%+` keeps them).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "io/jinja/value.h"

namespace rlhf::io::jinja {

enum class Tok {
  kData,        // text outside tags (text: the text, after whitespace control)
  kVarBegin,    // {{
  kVarEnd,      // }}
  kBlockBegin,  // {%
  kBlockEnd,    // %}
  kName,        // identifier or keyword (text)
  kString,      // string literal (text: its value, escapes decoded)
  kInt,         // integer literal (text: its digits, '_' removed)
  kFloat,       // float literal (text: as written, '_' removed)
  kOp,          // operator or punctuation (text)
  kEof,
};

struct Token {
  Tok type;
  std::string text;
  size_t pos;  // byte offset in the normalised source
};

/// A template's source after newline normalisation, with line/column lookup for messages.
class Source {
 public:
  /// Normalises "\r\n" and "\r" to "\n" and drops one trailing newline, as Jinja does.
  explicit Source(const std::string& text);
  const std::string& text() const { return text_; }
  /// "line L, column C" (both 1-based; the column counts bytes) of byte offset `pos`.
  std::string where(size_t pos) const;
  /// "line L, column C: <message> (near `<the template text around pos>`)".
  std::string locate(size_t pos, const std::string& message) const;

 private:
  std::string text_;
  std::vector<size_t> line_starts_;
};

/// The tokens of `src`, ending with kEof. A `{% raw %}...{% endraw %}` section comes out as one
/// kData token. Throws Failure (located) for an unclosed tag, comment or string, or a character
/// that starts no token.
std::vector<Token> tokenize(const Source& src);

/// Throws Failure(src.locate(pos, message)), marked located.
[[noreturn]] void fail_at(const Source& src, size_t pos, const std::string& message);

}  // namespace rlhf::io::jinja
