// The values a chat template computes with (io/jinja): JSON data (nlohmann::ordered_json, keys in
// insertion order as Python dicts keep them), Jinja's Undefined, namespace() objects (shared and
// mutable, as Python objects are) and callables (globals, macros, bound methods). The helpers give
// these values Python's meaning, since transformers renders templates with Jinja2 on Python
// objects: str() and repr(), truth, ==, json.dumps, and string indexing by code point.
#pragma once

#include <nlohmann/json.hpp>

#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace rlhf::io::jinja {

using Json = nlohmann::ordered_json;

/// A failure while rendering, without a template position yet: the evaluator adds the line and
/// column of the innermost expression or statement it was evaluating (located() then holds).
class Failure : public std::runtime_error {
 public:
  explicit Failure(const std::string& message) : std::runtime_error(message) {}
  bool located = false;
};

/// Throws Failure(message).
[[noreturn]] void fail(const std::string& message);

struct Value;
/// Keyword arguments of a call, in call order.
using Kwargs = std::vector<std::pair<std::string, Value>>;
/// A callable: positional and keyword arguments in, a value out; throws Failure.
using Function = std::function<Value(const std::vector<Value>& args, const Kwargs& kwargs)>;

/// One template value. Copies of a namespace share its object (Jinja's namespace is a reference).
struct Value {
  enum class Kind { kUndefined, kData, kNamespace, kFunction };
  Kind kind = Kind::kUndefined;
  Json data;                           // kData
  std::shared_ptr<Json> ns;            // kNamespace: a JSON object, shared by every copy
  std::shared_ptr<const Function> fn;  // kFunction
  std::string name;                    // kUndefined: what was looked up; kFunction: its name
  bool tuple = false;  // kData: a tuple literal (a list that prints as "(a, b)"; not kept nested)
  // kData: the generator that Jinja's map, select, reject, selectattr, rejectattr and unique
  // return: iterable (list, join, first, for), always true, and an error where Python's
  // generator fails or prints its address (len, last, tojson, str, indexing).
  bool generator = false;
  std::shared_ptr<bool> spent;
  // kData string: Jinja's Markup (from | safe or | escape): `+` with a plain string escapes that
  // string's & < > " ' (markupsafe), and the result is Markup again.
  bool markup = false;  // generator: iterated once already (then it yields nothing)

  Value() = default;
  Value(Json j) : kind(Kind::kData), data(std::move(j)) {}  // NOLINT: implicit by design
  static Value undefined(std::string what);
  static Value function(std::string name, Function f);
  static Value namespace_of(Json object);

  bool is_undefined() const { return kind == Kind::kUndefined; }
  bool is_data() const { return kind == Kind::kData; }
  bool is_string() const { return is_data() && data.is_string(); }
  bool is_none() const { return is_data() && data.is_null(); }
  /// The JSON of a data value; throws Failure naming `what` for the other kinds.
  const Json& json(const char* what) const;
};

/// The items of a generator the first time it is iterated, none after (Python generators are
/// exhausted by one pass; copies of the value share that state).
const Json& generator_items(const Value& v);

/// markupsafe.escape of a plain string: & < > " ' as &amp; &lt; &gt; &#34; &#39;.
std::string html_escape(const std::string& s);

/// Python's bool(): Undefined, None, False, 0, "", [] and {} are false.
bool truthy(const Value& v);
/// Python's str() as Jinja prints a value: Undefined → "", None → "None", True → "True", floats
/// as repr(), lists and dicts as repr().
std::string to_str(const Value& v);
/// Python's repr() of JSON data ('single-quoted' strings, True/False/None, {'k': v}).
std::string repr(const Json& j);
/// Python's repr() of a float: the shortest round-trip digits, "1.0", "1e-05", "1e+16", "inf".
std::string py_float(double d);
/// Python's ==: numbers compare by value across int, float and bool; dicts regardless of order;
/// Undefined equals only Undefined; a namespace or function only itself.
bool equals(const Value& a, const Value& b);
/// "string", "int", "list", "dict", "undefined", ... (Python's type names, for messages).
std::string type_name(const Value& v);

/// json.dumps(j, ensure_ascii, indent, separators, sort_keys) as Python writes it; indent < 0 is
/// Python's None (one line, ", " and ": "), >= 0 a new line per item with that many spaces
/// (indent_str, when set, is used instead, as json.dumps(indent="\t")).
struct JsonDumpOptions {
  bool ensure_ascii = false;
  int indent = -1;
  std::optional<std::string> indent_str;
  std::optional<std::pair<std::string, std::string>> separators;
  bool sort_keys = false;
};
std::string dump_json(const Json& j, const JsonDumpOptions& o);

/// Byte offsets of each code point of UTF-8 `s`, plus s.size() at the end (Python indexes
/// strings by code point). Invalid bytes count as one code point each.
std::vector<size_t> code_points(const std::string& s);
/// The number of code points of `s`.
size_t code_point_count(const std::string& s);
/// Python's str.strip/lstrip/rstrip: `chars` unset strips Unicode white space (str.isspace),
/// else any of the code points of *chars.
std::string py_strip(const std::string& s, const std::optional<std::string>& chars, bool left,
                     bool right);
/// Python's str.split(sep, maxsplit): sep unset splits on runs of white space and drops empty
/// parts; maxsplit < 0 is no limit. Throws Failure for an empty separator.
std::vector<std::string> py_split(const std::string& s, const std::optional<std::string>& sep,
                                  int64_t maxsplit);
/// Case mapping as Python's str methods and Jinja's filters do it: `what` is "upper", "lower",
/// "capitalize", "title" (Jinja's filter: words start after white space or - ( { [ <) or
/// "str.title" (words start after a character without case). Covers ASCII, Latin-1, Latin
/// Extended-A, basic Greek and Cyrillic; throws Failure naming `what` for a letter outside them or
/// whose Python mapping is not one code point (ß, final sigma, ...).
std::string case_map(const std::string& s, const char* what);
/// Appends code point `cp` to `out` in UTF-8.
void append_code_point(uint32_t cp, std::string& out);

}  // namespace rlhf::io::jinja
