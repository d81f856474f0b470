#include "io/jinja/lexer.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

namespace rlhf::io::jinja {

// --- Source --------------------------------------------------------------------------------------

Source::Source(const std::string& text) {
  text_.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '\r') {
      text_ += '\n';
      if (i + 1 < text.size() && text[i + 1] == '\n') ++i;
    } else {
      text_ += text[i];
    }
  }
  if (!text_.empty() && text_.back() == '\n') text_.pop_back();  // keep_trailing_newline=False
  line_starts_.push_back(0);
  for (size_t i = 0; i < text_.size(); ++i)
    if (text_[i] == '\n') line_starts_.push_back(i + 1);
}

std::string Source::locate(size_t pos, const std::string& message) const {
  pos = std::min(pos, text_.size());
  const size_t line = static_cast<size_t>(
      std::upper_bound(line_starts_.begin(), line_starts_.end(), pos) - line_starts_.begin());
  const size_t start = line_starts_[line - 1];
  size_t end = text_.find('\n', start);
  if (end == std::string::npos) end = text_.size();
  // At most 30 bytes before and 50 after the position, cut at UTF-8 character boundaries.
  size_t from = pos > start + 30 ? pos - 30 : start;
  size_t to = std::min(end, pos + 50);
  auto continuation = [&](size_t i) {
    return (static_cast<unsigned char>(text_[i]) & 0xc0) == 0x80;
  };
  while (from > start && from < text_.size() && continuation(from)) --from;
  while (to < end && continuation(to)) ++to;
  std::string near = text_.substr(from, to - from);
  near = (from > start ? "..." : "") + near + (to < end ? "..." : "");
  return fmt::format("line {}, column {}: {} (near `{}`)", line, pos - start + 1, message, near);
}

void fail_at(const Source& src, size_t pos, const std::string& message) {
  Failure f(src.locate(pos, message));
  f.located = true;
  throw f;
}

// --- tokens inside a tag -------------------------------------------------------------------------

namespace {

bool is_name_start(char c) {
  return std::isalpha(static_cast<unsigned char>(c)) || c == '_';
}
bool is_name_char(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
}
bool is_digit(char c) {
  return c >= '0' && c <= '9';
}
bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\f' || c == '\v';
}

class TagLexer {
 public:
  TagLexer(const Source& src, std::vector<Token>& out) : src_(src), s_(src.text()), out_(out) {}

  // Lexes the tokens of a tag from `pos` up to its end marker ("}}" or "%}", optionally preceded
  // by '-' or, for blocks, '+'); returns the position just after the marker and sets strip_after
  // ('-') / keep_newline ('+').
  size_t lex_tag(size_t pos, bool block, size_t tag_start, bool& strip_after, bool& keep_newline) {
    const char* end = block ? "%}" : "}}";
    std::vector<char> open;  // brackets: an end marker inside them does not close the tag
    while (true) {
      while (pos < s_.size() && is_space(s_[pos])) ++pos;
      if (pos >= s_.size())
        fail_at(src_, tag_start, block ? "unclosed block tag: no '%}'" : "unclosed '{{': no '}}'");
      if (open.empty()) {
        if (s_.compare(pos, 3, std::string("-") + end) == 0 ||
            (block && s_.compare(pos, 3, std::string("+") + end) == 0)) {
          strip_after = s_[pos] == '-';
          keep_newline = s_[pos] == '+';
          return pos + 3;
        }
        if (s_.compare(pos, 2, end) == 0) return pos + 2;
      }
      pos = lex_token(pos, open);
    }
  }

 private:
  size_t lex_token(size_t pos, std::vector<char>& open) {
    const char c = s_[pos];
    if (is_name_start(c)) {
      size_t e = pos;
      while (e < s_.size() && is_name_char(s_[e])) ++e;
      out_.push_back({Tok::kName, s_.substr(pos, e - pos), pos});
      return e;
    }
    if (is_digit(c)) return lex_number(pos);
    if (c == '\'' || c == '"') return lex_string(pos);
    static const char* const kTwo[] = {"//", "**", "==", "!=", ">=", "<="};
    for (const char* op : kTwo)
      if (s_.compare(pos, 2, op) == 0) {
        out_.push_back({Tok::kOp, op, pos});
        return pos + 2;
      }
    if (std::strchr("+-/*%~[](){}.,:|=<>;", c) == nullptr || c == '\0')
      fail_at(src_, pos, fmt::format("unexpected character '{}' in a tag", c));
    if (c == '(' || c == '[' || c == '{') open.push_back(c);
    if (c == ')' || c == ']' || c == '}') {
      const char want = c == ')' ? '(' : c == ']' ? '[' : '{';
      if (open.empty() || open.back() != want)
        fail_at(src_, pos, fmt::format("unbalanced '{}'", c));
      open.pop_back();
    }
    out_.push_back({Tok::kOp, std::string(1, c), pos});
    return pos + 1;
  }

  size_t lex_digits(size_t pos, std::string& text) {
    while (pos < s_.size() && (is_digit(s_[pos]) ||
                               (s_[pos] == '_' && pos + 1 < s_.size() && is_digit(s_[pos + 1])))) {
      if (s_[pos] != '_') text += s_[pos];
      ++pos;
    }
    return pos;
  }

  size_t lex_number(size_t start) {
    std::string text;
    size_t pos = lex_digits(start, text);
    bool is_float = false;
    if (pos + 1 < s_.size() && s_[pos] == '.' && is_digit(s_[pos + 1])) {
      text += '.';
      pos = lex_digits(pos + 1, text);
      is_float = true;
    }
    if (pos < s_.size() && (s_[pos] == 'e' || s_[pos] == 'E')) {
      size_t p = pos + 1;
      std::string exp = "e";
      if (p < s_.size() && (s_[p] == '+' || s_[p] == '-')) exp += s_[p++];
      if (p < s_.size() && is_digit(s_[p])) {
        pos = lex_digits(p, exp);
        text += exp;
        is_float = true;
      }
    }
    out_.push_back({is_float ? Tok::kFloat : Tok::kInt, text, start});
    return pos;
  }

  // A string literal, decoded as Python's unicode-escape does (unknown escapes stay as written).
  size_t lex_string(size_t start) {
    const char q = s_[start];
    std::string v;
    size_t pos = start + 1;
    while (true) {
      if (pos >= s_.size()) fail_at(src_, start, "unclosed string literal");
      const char c = s_[pos];
      if (c == q) break;
      if (c != '\\') {
        v += c;
        ++pos;
        continue;
      }
      if (pos + 1 >= s_.size()) fail_at(src_, start, "unclosed string literal");
      pos = lex_escape(pos, v);
    }
    out_.push_back({Tok::kString, v, start});
    return pos + 1;
  }

  size_t lex_escape(size_t pos, std::string& v) {
    const char e = s_[pos + 1];
    static const char kFrom[] = "nrtabfv\\'\"\n";
    static const char kTo[] = "\n\r\t\a\b\f\v\\'\"";
    if (const char* p = std::strchr(kFrom, e); p != nullptr && e != '\0') {
      if (e != '\n') v += kTo[p - kFrom];  // backslash-newline: a line continuation
      return pos + 2;
    }
    if (e == 'x' || e == 'u' || e == 'U') {
      const size_t n = e == 'x' ? 2 : e == 'u' ? 4 : 8;
      uint32_t cp = 0;
      for (size_t k = 0; k < n; ++k) {
        const size_t i = pos + 2 + k;
        if (i >= s_.size() || !std::isxdigit(static_cast<unsigned char>(s_[i])))
          fail_at(src_, pos, fmt::format("truncated \\{} escape in a string literal", e));
        cp = cp * 16 + static_cast<uint32_t>(std::stoi(std::string(1, s_[i]), nullptr, 16));
      }
      if (cp > 0x10ffff) fail_at(src_, pos, "\\U escape beyond U+10FFFF in a string literal");
      append_code_point(cp, v);
      return pos + 2 + n;
    }
    if (e >= '0' && e <= '7') {
      uint32_t cp = 0;
      size_t i = pos + 1;
      for (; i < s_.size() && i < pos + 4 && s_[i] >= '0' && s_[i] <= '7'; ++i)
        cp = cp * 8 + static_cast<uint32_t>(s_[i] - '0');
      append_code_point(cp, v);
      return i;
    }
    if (e == 'N') fail_at(src_, pos, "\\N{...} escapes are not supported in string literals");
    v += '\\';  // unknown escape: kept
    return pos + 1;
  }

  const Source& src_;
  const std::string& s_;
  std::vector<Token>& out_;
};

// Python's str.rstrip() for the text before a "{%-"-style tag (ASCII and the white space bytes
// Jinja's \s matches in practice).
std::string rstrip_all(const std::string& t) {
  size_t e = t.size();
  while (e > 0 && (is_space(t[e - 1]) || t[e - 1] == '\r')) --e;
  return t.substr(0, e);
}

}  // namespace

// --- the template --------------------------------------------------------------------------------

namespace {

class Lexer {
 public:
  explicit Lexer(const Source& src) : src_(src), s_(src.text()), tags_(src, out_) {}

  std::vector<Token> run() {
    size_t pos = 0;
    bool line_starting = true;  // the previous tag ended with a newline it consumed
    bool strip_next = false;    // the previous tag ended with '-'
    while (pos < s_.size()) {
      size_t start = next_tag(pos);
      std::string text = s_.substr(pos, start - pos);
      if (strip_next) text.erase(0, leading_space(text));
      strip_next = false;
      if (start == s_.size()) {
        emit_data(text, pos);
        break;
      }
      const char kind = s_[start + 1];
      const char sign = start + 2 < s_.size() ? s_[start + 2] : '\0';
      if (sign == '-') {
        text = rstrip_all(text);
      } else if (sign != '+' && kind != '{') {
        // lstrip_blocks: white space alone between the line start and a block/comment tag.
        const size_t l = text.rfind('\n') + 1;  // npos + 1 == 0
        if ((l > 0 || line_starting) && l < text.size() &&
            text.find_first_not_of(" \t\f\v", l) == std::string::npos)
          text.erase(l);
      }
      emit_data(text, pos);
      size_t after = start + 2 + (sign == '-' || sign == '+' ? 1 : 0);
      bool strip_after = false, keep_newline = false;
      if (kind == '#') {
        after = comment_end(start, after, strip_after, keep_newline);
      } else {
        const size_t first = out_.size();
        out_.push_back({kind == '%' ? Tok::kBlockBegin : Tok::kVarBegin, "", start});
        after = tags_.lex_tag(after, kind == '%', start, strip_after, keep_newline);
        out_.push_back({kind == '%' ? Tok::kBlockEnd : Tok::kVarEnd, "", after});
        if (kind == '%' && out_.size() == first + 3 && out_[first + 1].text == "raw" &&
            out_[first + 1].type == Tok::kName) {
          out_.resize(first);
          after = raw_block(start, after, strip_after, keep_newline);
        }
      }
      // trim_blocks: a block or comment tag eats the newline right after it.
      if (strip_after) {
        strip_next = true;
      } else if (kind != '{' && !keep_newline && after < s_.size() && s_[after] == '\n') {
        ++after;
      }
      line_starting = after > 0 && s_[after - 1] == '\n';
      pos = after;
    }
    out_.push_back({Tok::kEof, "", s_.size()});
    return std::move(out_);
  }

 private:
  size_t next_tag(size_t pos) const {
    while (true) {
      const size_t b = s_.find('{', pos);
      if (b == std::string::npos || b + 1 >= s_.size()) return s_.size();
      const char k = s_[b + 1];
      if (k == '{' || k == '%' || k == '#') return b;
      pos = b + 1;
    }
  }

  static size_t leading_space(const std::string& t) {
    size_t i = 0;
    while (i < t.size() && (is_space(t[i]) || t[i] == '\r')) ++i;
    return i;
  }

  void emit_data(const std::string& text, size_t pos) {
    if (!text.empty()) out_.push_back({Tok::kData, text, pos});
  }

  size_t comment_end(size_t start, size_t from, bool& strip_after, bool& keep_newline) {
    const size_t e = s_.find("#}", from);
    if (e == std::string::npos) fail_at(src_, start, "unclosed comment: no '#}'");
    strip_after = e > from && s_[e - 1] == '-';
    keep_newline = e > from && s_[e - 1] == '+';
    return e + 2;
  }

  // {% raw %}...{% endraw %}: the text between, verbatim (whitespace control on both tags).
  size_t raw_block(size_t start, size_t body, bool& strip_after, bool& keep_newline) {
    size_t search = body;
    while (true) {
      const size_t t = s_.find("{%", search);
      if (t == std::string::npos) fail_at(src_, start, "{% raw %} without {% endraw %}");
      size_t p = t + 2;
      const bool strip_before = p < s_.size() && s_[p] == '-';
      if (p < s_.size() && (s_[p] == '-' || s_[p] == '+')) ++p;
      while (p < s_.size() && is_space(s_[p])) ++p;
      if (s_.compare(p, 6, "endraw") != 0) {
        search = t + 2;
        continue;
      }
      p += 6;
      while (p < s_.size() && is_space(s_[p])) ++p;
      strip_after = s_.compare(p, 3, "-%}") == 0;
      keep_newline = s_.compare(p, 3, "+%}") == 0;
      const size_t close = p + (strip_after || keep_newline ? 1 : 0);
      if (s_.compare(close, 2, "%}") != 0) fail_at(src_, t, "malformed {% endraw %}");
      size_t b = body;
      if (!strip_after && s_[body - 3] == '-') b += leading_space(s_.substr(body, t - body));
      std::string text = s_.substr(b, t - b);
      if (strip_before) text = rstrip_all(text);
      emit_data(text, b);
      return close + 2;
    }
  }

  const Source& src_;
  const std::string& s_;
  std::vector<Token> out_;
  TagLexer tags_;
};

}  // namespace

std::vector<Token> tokenize(const Source& src) {
  return Lexer(src).run();
}

}  // namespace rlhf::io::jinja
