#include "io/jinja/value.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>

namespace rlhf::io::jinja {

void fail(const std::string& message) {
  throw Failure(message);
}

Value Value::undefined(std::string what) {
  Value v;
  v.name = std::move(what);
  return v;
}

Value Value::function(std::string name, Function f) {
  Value v;
  v.kind = Kind::kFunction;
  v.name = std::move(name);
  v.fn = std::make_shared<const Function>(std::move(f));
  return v;
}

Value Value::namespace_of(Json object) {
  Value v;
  v.kind = Kind::kNamespace;
  v.ns = std::make_shared<Json>(std::move(object));
  return v;
}

const Json& Value::json(const char* what) const {
  if (kind == Kind::kData) return data;
  if (kind == Kind::kUndefined)
    fail(fmt::format("{}: '{}' is undefined", what, name.empty() ? "value" : name));
  fail(fmt::format("{}: a {} is not data", what, type_name(*this)));
}

std::string html_escape(const std::string& s) {
  std::string out;
  for (char ch : s) {
    switch (ch) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&#34;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += ch;
    }
  }
  return out;
}

const Json& generator_items(const Value& v) {
  static const Json kEmpty = Json::array();
  if (*v.spent) return kEmpty;
  *v.spent = true;
  return v.data;
}

bool truthy(const Value& v) {
  switch (v.kind) {
    case Value::Kind::kUndefined:
      return false;
    case Value::Kind::kNamespace:
    case Value::Kind::kFunction:
      return true;
    case Value::Kind::kData:
      break;
  }
  if (v.generator) return true;
  const Json& j = v.data;
  if (j.is_null()) return false;
  if (j.is_boolean()) return j.get<bool>();
  if (j.is_number_float()) return j.get<double>() != 0.0;
  if (j.is_number()) return j.get<int64_t>() != 0;
  if (j.is_string()) return !j.get_ref<const std::string&>().empty();
  return !j.empty();  // array, object
}

// --- Python formatting ---------------------------------------------------------------------------

std::string py_float(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  if (d == 0) return std::signbit(d) ? "-0.0" : "0.0";
  // Shortest round-trip digits and exponent, laid out as Python's float_repr_style 'short':
  // scientific when the exponent is < -4 or >= 16, else positional.
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string sci(buf, r.ptr);
  const bool neg = sci[0] == '-';
  if (neg) sci.erase(0, 1);
  const size_t e = sci.find('e');
  std::string digits = sci.substr(0, e);
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  const int exp = std::stoi(sci.substr(e + 1));
  std::string out;
  if (exp < -4 || exp >= 16) {
    out = digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    out += fmt::format("e{}{:02d}", exp < 0 ? '-' : '+', std::abs(exp));
  } else if (exp < 0) {
    out = "0." + std::string(static_cast<size_t>(-exp - 1), '0') + digits;
  } else {
    const size_t point = static_cast<size_t>(exp) + 1;
    if (digits.size() <= point) {
      out = digits + std::string(point - digits.size(), '0') + ".0";
    } else {
      out = digits.substr(0, point) + "." + digits.substr(point);
    }
  }
  return neg ? "-" + out : out;
}

namespace {

// Python repr of a str: single quotes unless the text has ' and no ", backslash escapes.
std::string repr_string(const std::string& s) {
  const bool has_single = s.find('\'') != std::string::npos;
  const bool has_double = s.find('"') != std::string::npos;
  const char q = has_single && !has_double ? '"' : '\'';
  std::string out(1, q);
  for (unsigned char c : s) {
    if (c == q || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7f) {
      out += fmt::format("\\x{:02x}", c);
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + q;
}

std::string number_str(const Json& j) {
  if (j.is_number_float()) return py_float(j.get<double>());
  if (j.is_number_unsigned()) return std::to_string(j.get<uint64_t>());
  return std::to_string(j.get<int64_t>());
}

}  // namespace

std::string repr(const Json& j) {
  if (j.is_null()) return "None";
  if (j.is_boolean()) return j.get<bool>() ? "True" : "False";
  if (j.is_number()) return number_str(j);
  if (j.is_string()) return repr_string(j.get_ref<const std::string&>());
  std::string out;
  if (j.is_array()) {
    out = "[";
    for (size_t i = 0; i < j.size(); ++i) out += (i ? ", " : "") + repr(j[i]);
    return out + "]";
  }
  out = "{";
  bool first = true;
  for (const auto& [k, v] : j.items()) {
    out += (first ? "" : ", ") + repr_string(k) + ": " + repr(v);
    first = false;
  }
  return out + "}";
}

std::string to_str(const Value& v) {
  switch (v.kind) {
    case Value::Kind::kUndefined:
      return "";
    case Value::Kind::kNamespace:
      return "<Namespace " + repr(*v.ns) + ">";
    case Value::Kind::kFunction:
      return "<function " + v.name + ">";
    case Value::Kind::kData:
      break;
  }
  if (v.data.is_string()) return v.data.get<std::string>();
  if (v.generator) fail("printing a generator (map, select, ... without | list) is not supported");
  if (v.tuple && v.data.is_array()) {
    std::string out = "(";
    for (size_t i = 0; i < v.data.size(); ++i) out += (i ? ", " : "") + repr(v.data[i]);
    return out + (v.data.size() == 1 ? ",)" : ")");
  }
  return repr(v.data);
}

std::string type_name(const Value& v) {
  switch (v.kind) {
    case Value::Kind::kUndefined:
      return "undefined";
    case Value::Kind::kNamespace:
      return "namespace";
    case Value::Kind::kFunction:
      return "function";
    case Value::Kind::kData:
      break;
  }
  if (v.generator) return "generator";
  const Json& j = v.data;
  if (j.is_null()) return "NoneType";
  if (j.is_boolean()) return "bool";
  if (j.is_number_float()) return "float";
  if (j.is_number()) return "int";
  if (j.is_string()) return "str";
  if (j.is_array()) return "list";
  return "dict";
}

// --- equality ------------------------------------------------------------------------------------

namespace {

bool json_equals(const Json& a, const Json& b) {
  if (a.is_boolean() || b.is_boolean()) {  // True == 1, False == 0.0
    if (!(a.is_number() || a.is_boolean()) || !(b.is_number() || b.is_boolean())) return false;
    auto as_num = [](const Json& j) { return j.is_boolean() ? Json(j.get<bool>() ? 1 : 0) : j; };
    return json_equals(as_num(a), as_num(b));
  }
  if (a.is_number()) {
    if (!b.is_number()) return false;
    if (a.is_number_float() || b.is_number_float()) return a.get<double>() == b.get<double>();
    if (a.is_number_unsigned() || b.is_number_unsigned()) {
      if ((a.is_number_integer() && !a.is_number_unsigned() && a.get<int64_t>() < 0) ||
          (b.is_number_integer() && !b.is_number_unsigned() && b.get<int64_t>() < 0))
        return false;
      return a.get<uint64_t>() == b.get<uint64_t>();
    }
    return a.get<int64_t>() == b.get<int64_t>();
  }
  if (a.type() != b.type()) return false;
  if (a.is_array()) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i)
      if (!json_equals(a[i], b[i])) return false;
    return true;
  }
  if (a.is_object()) {
    if (a.size() != b.size()) return false;
    for (const auto& [k, v] : a.items()) {
      auto it = b.find(k);
      if (it == b.end() || !json_equals(v, *it)) return false;
    }
    return true;
  }
  return a == b;  // null, string
}

}  // namespace

bool equals(const Value& a, const Value& b) {
  if (a.kind != b.kind || a.generator || b.generator) return false;
  switch (a.kind) {
    case Value::Kind::kUndefined:
      return true;
    case Value::Kind::kNamespace:
      return a.ns == b.ns;
    case Value::Kind::kFunction:
      return a.fn == b.fn;
    case Value::Kind::kData:
      break;
  }
  return json_equals(a.data, b.data);
}

// --- json.dumps ----------------------------------------------------------------------------------

namespace {

// Decodes one UTF-8 code point at s[i] (advancing i); an invalid byte is returned as itself.
uint32_t decode_utf8(const std::string& s, size_t& i) {
  const auto c = static_cast<unsigned char>(s[i]);
  int n = c < 0x80 ? 0 : (c >> 5) == 6 ? 1 : (c >> 4) == 14 ? 2 : (c >> 3) == 30 ? 3 : -1;
  if (n < 0 || i + static_cast<size_t>(n) >= s.size() + (n == 0 ? 1 : 0)) {
    ++i;
    return c;
  }
  uint32_t cp = n == 0 ? c : c & (0x3f >> n);
  for (int k = 1; k <= n; ++k) {
    const auto cc = static_cast<unsigned char>(s[i + static_cast<size_t>(k)]);
    if ((cc & 0xc0) != 0x80) {
      ++i;
      return c;
    }
    cp = (cp << 6) | (cc & 0x3f);
  }
  i += static_cast<size_t>(n) + 1;
  return cp;
}

}  // namespace

void append_code_point(uint32_t cp, std::string& out) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xc0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xe0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  } else {
    out += static_cast<char>(0xf0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3f));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  }
}

namespace {

void dump_string(const std::string& s, bool ensure_ascii, std::string& out) {
  out += '"';
  size_t i = 0;
  while (i < s.size()) {
    const size_t start = i;
    const uint32_t cp = decode_utf8(s, i);
    switch (cp) {
      case '"':
        out += "\\\"";
        continue;
      case '\\':
        out += "\\\\";
        continue;
      case '\n':
        out += "\\n";
        continue;
      case '\r':
        out += "\\r";
        continue;
      case '\t':
        out += "\\t";
        continue;
      case '\b':
        out += "\\b";
        continue;
      case '\f':
        out += "\\f";
        continue;
      default:
        break;
    }
    if (cp < 0x20 || (ensure_ascii && cp >= 0x7f)) {
      if (cp >= 0x10000) {
        const uint32_t v = cp - 0x10000;
        out += fmt::format("\\u{:04x}\\u{:04x}", 0xd800 + (v >> 10), 0xdc00 + (v & 0x3ff));
      } else {
        out += fmt::format("\\u{:04x}", cp);
      }
    } else {
      out.append(s, start, i - start);
    }
  }
  out += '"';
}

struct Dumper {
  const JsonDumpOptions& o;
  std::string item_sep, key_sep, indent_unit;
  bool indented;

  explicit Dumper(const JsonDumpOptions& opts) : o(opts) {
    indented = opts.indent_str.has_value() || opts.indent >= 0;
    if (indented) indent_unit = opts.indent_str ? *opts.indent_str : std::string(opts.indent, ' ');
    item_sep = opts.separators ? opts.separators->first : (indented ? "," : ", ");
    key_sep = opts.separators ? opts.separators->second : ": ";
  }

  void newline(int depth, std::string& out) const {
    if (!indented) return;
    out += '\n';
    for (int d = 0; d < depth; ++d) out += indent_unit;
  }

  void dump(const Json& j, int depth, std::string& out) const {
    if (j.is_null()) {
      out += "null";
    } else if (j.is_boolean()) {
      out += j.get<bool>() ? "true" : "false";
    } else if (j.is_number_float()) {
      const double d = j.get<double>();
      out += std::isnan(d)   ? "NaN"
             : std::isinf(d) ? (d > 0 ? "Infinity" : "-Infinity")
                             : py_float(d);
    } else if (j.is_number()) {
      out += number_str(j);
    } else if (j.is_string()) {
      dump_string(j.get_ref<const std::string&>(), o.ensure_ascii, out);
    } else if (j.is_array()) {
      if (j.empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (size_t i = 0; i < j.size(); ++i) {
        if (i) out += item_sep;
        newline(depth + 1, out);
        dump(j[i], depth + 1, out);
      }
      newline(depth, out);
      out += ']';
    } else {
      dump_object(j, depth, out);
    }
  }

  void dump_object(const Json& j, int depth, std::string& out) const {
    if (j.empty()) {
      out += "{}";
      return;
    }
    std::vector<std::pair<const std::string*, const Json*>> items;
    for (auto it = j.begin(); it != j.end(); ++it) items.emplace_back(&it.key(), &it.value());
    if (o.sort_keys)
      std::stable_sort(items.begin(), items.end(),
                       [](const auto& a, const auto& b) { return *a.first < *b.first; });
    out += '{';
    for (size_t i = 0; i < items.size(); ++i) {
      if (i) out += item_sep;
      newline(depth + 1, out);
      dump_string(*items[i].first, o.ensure_ascii, out);
      out += key_sep;
      dump(*items[i].second, depth + 1, out);
    }
    newline(depth, out);
    out += '}';
  }
};

}  // namespace

std::string dump_json(const Json& j, const JsonDumpOptions& o) {
  std::string out;
  Dumper(o).dump(j, 0, out);
  return out;
}

// --- strings -------------------------------------------------------------------------------------

std::vector<size_t> code_points(const std::string& s) {
  std::vector<size_t> offsets;
  offsets.reserve(s.size() + 1);
  size_t i = 0;
  while (i < s.size()) {
    offsets.push_back(i);
    decode_utf8(s, i);
  }
  offsets.push_back(s.size());
  return offsets;
}

size_t code_point_count(const std::string& s) {
  size_t n = 0, i = 0;
  while (i < s.size()) {
    decode_utf8(s, i);
    ++n;
  }
  return n;
}

namespace {

// Python's str.isspace for one code point.
bool is_py_space(uint32_t c) {
  return (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f ||
         c == 0x205f || c == 0x3000;
}

}  // namespace

std::string py_strip(const std::string& s, const std::optional<std::string>& chars, bool left,
                     bool right) {
  std::vector<uint32_t> set;
  if (chars)
    for (size_t i = 0; i < chars->size();) set.push_back(decode_utf8(*chars, i));
  auto strip_it = [&](uint32_t c) {
    return chars ? std::find(set.begin(), set.end(), c) != set.end() : is_py_space(c);
  };
  const std::vector<size_t> cp = code_points(s);
  size_t b = 0, e = cp.size() - 1;  // code point indices [b, e)
  auto at = [&](size_t k) {
    size_t i = cp[k];
    return decode_utf8(s, i);
  };
  if (left)
    while (b < e && strip_it(at(b))) ++b;
  if (right)
    while (e > b && strip_it(at(e - 1))) --e;
  return s.substr(cp[b], cp[e] - cp[b]);
}

std::vector<std::string> py_split(const std::string& s, const std::optional<std::string>& sep,
                                  int64_t maxsplit) {
  std::vector<std::string> parts;
  if (sep) {
    if (sep->empty()) fail("split: empty separator");
    size_t pos = 0;
    while (maxsplit < 0 || static_cast<int64_t>(parts.size()) < maxsplit) {
      const size_t f = s.find(*sep, pos);
      if (f == std::string::npos) break;
      parts.push_back(s.substr(pos, f - pos));
      pos = f + sep->size();
    }
    parts.push_back(s.substr(pos));
    return parts;
  }
  // Runs of white space; past maxsplit, the rest is kept as is after its leading white space.
  size_t i = 0;
  while (true) {
    size_t j = i;
    while (j < s.size()) {  // skip white space
      size_t k = j;
      if (!is_py_space(decode_utf8(s, k))) break;
      j = k;
    }
    if (j >= s.size()) break;
    if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) >= maxsplit) {
      parts.push_back(s.substr(j));
      break;
    }
    size_t k = j;
    while (k < s.size()) {
      size_t m = k;
      if (is_py_space(decode_utf8(s, m))) break;
      k = m;
    }
    parts.push_back(s.substr(j, k - j));
    i = k;
  }
  return parts;
}

namespace {

// Code points with case mappings (Latin-1 to Armenian, Georgian, Cherokee, Latin extended
// additional and Greek extended, Glagolitic to Coptic, Cyrillic extended, full-width Latin, the
// supplementary cased scripts).
bool has_case(uint32_t c) {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= 0xb5 && c <= 0x58f) ||
         (c >= 0x10a0 && c <= 0x10ff) || (c >= 0x13a0 && c <= 0x13ff) ||
         (c >= 0x1c80 && c <= 0x1cbf) || (c >= 0x1e00 && c <= 0x1fff) ||
         (c >= 0x2160 && c <= 0x2188) || (c >= 0x24b6 && c <= 0x24e9) ||
         (c >= 0x2c00 && c <= 0x2d2f) || (c >= 0xa640 && c <= 0xa7ff) ||
         (c >= 0xab70 && c <= 0xabbf) || (c >= 0xfb00 && c <= 0xfb17) ||
         (c >= 0xff21 && c <= 0xff5a) || (c >= 0x10400 && c <= 0x1e95f);
}

// Pairs where the upper case is even and the lower case the next (odd) code point, or the
// reverse.
bool in_even_pairs(uint32_t c) {
  return (c >= 0x100 && c <= 0x12f) || (c >= 0x132 && c <= 0x137) || (c >= 0x14a && c <= 0x177) ||
         (c >= 0x460 && c <= 0x481) || (c >= 0x48a && c <= 0x4bf) || (c >= 0x4d0 && c <= 0x52f);
}
bool in_odd_pairs(uint32_t c) {
  return (c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17e) || (c >= 0x4c1 && c <= 0x4ce);
}

// The one-code-point upper or lower case of c (c itself when it has none) for ASCII, Latin-1,
// Latin Extended-A, basic Greek and Cyrillic, as Python's str.upper/str.lower map them; nullopt
// where Python's mapping is longer than one code point, depends on context (final sigma) or lies
// in a script this table does not cover.
std::optional<uint32_t> map_case(uint32_t c, bool upper) {
  if (c < 0x80) {
    if (upper && c >= 'a' && c <= 'z') return c - 32;
    if (!upper && c >= 'A' && c <= 'Z') return c + 32;
    return c;
  }
  if (!has_case(c)) return c;
  if (c >= 0xc0 && c <= 0xfe && c != 0xd7 && c != 0xf7 && c != 0xdf) {
    const bool is_upper = c < 0xe0;
    return is_upper == upper ? c : (upper ? c - 32 : c + 32);
  }
  if (c == 0xdf) return upper ? std::nullopt : std::optional<uint32_t>(c);  // ß → SS
  if (c == 0xff) return upper ? 0x178u : c;
  if (c == 0x178) return upper ? c : 0xffu;
  if (c == 0x131) return upper ? uint32_t{'I'} : c;
  if (c == 0x17f) return upper ? uint32_t{'S'} : c;
  if (c == 0x138) return c;  // ĸ has no case
  if (in_even_pairs(c) || in_odd_pairs(c)) {
    const bool is_upper = (c % 2 == 0) == in_even_pairs(c);
    return is_upper == upper ? c : (upper ? c - 1 : c + 1);
  }
  if ((c >= 0x391 && c <= 0x3a9 && c != 0x3a2 && c != 0x3a3) ||
      (c >= 0x3b1 && c <= 0x3c9 && c != 0x3c2)) {
    const bool is_upper = c <= 0x3a9;
    return is_upper == upper ? c : (upper ? c - 32 : c + 32);
  }
  if (c == 0x3a3) return upper ? std::optional<uint32_t>(c) : std::nullopt;  // Σ: σ or final ς
  if (c == 0x3c2) return upper ? 0x3a3u : c;
  if ((c >= 0x400 && c <= 0x42f) || (c >= 0x430 && c <= 0x45f)) {
    const bool is_upper = c <= 0x42f;
    const uint32_t delta = (c >= 0x400 && c <= 0x40f) || (c >= 0x450) ? 80 : 32;
    return is_upper == upper ? c : (upper ? c - delta : c + delta);
  }
  return std::nullopt;
}

}  // namespace

std::string case_map(const std::string& s, const char* what) {
  const std::string_view w = what;
  std::string out;
  bool word_start = true;
  size_t i = 0;
  for (size_t n = 0; i < s.size(); ++n) {
    const uint32_t c = decode_utf8(s, i);
    bool up = w == "upper";
    if (w == "capitalize") up = n == 0;
    if (w == "title" || w == "str.title") up = word_start;
    const std::optional<uint32_t> m = map_case(c, up);
    if (!m) fail(fmt::format("{}: the case mapping of U+{:04X} is not supported", what, c));
    append_code_point(*m, out);
    // Jinja's title filter starts a word after - ( { [ < or white space; str.title() after any
    // character without case.
    word_start = w == "title" ? (c < 0x80 && std::strchr("-({[< \t\n\r\f\v", static_cast<int>(c)) &&
                                 c != 0) ||
                                    is_py_space(c)
                              : !has_case(c);
  }
  return out;
}

}  // namespace rlhf::io::jinja
