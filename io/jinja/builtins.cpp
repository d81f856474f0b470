// Jinja's filters and tests as chat templates use them (io/jinja/builtins.h), following jinja2 3.1
// (jinja2/filters.py, jinja2/tests.py) and transformers' tojson (json.dumps with
// ensure_ascii=False by default).
#include "io/jinja/builtins.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <map>

namespace rlhf::io::jinja {

namespace {

struct Call {
  const std::string& name;
  const std::vector<Value>& args;  // after the filtered value
  const Kwargs& kwargs;

  // Positional argument i or keyword `key`; unset when neither is given.
  std::optional<Value> get(size_t i, const char* key) const {
    if (i < args.size()) return args[i];
    for (const auto& [k, v] : kwargs)
      if (k == key) return v;
    return std::nullopt;
  }
  void check(size_t max_args, std::initializer_list<const char*> keys) const {
    if (args.size() > max_args)
      fail(fmt::format("filter '{}' takes at most {} arguments, got {}", name, max_args,
                       args.size()));
    for (const auto& kv : kwargs)
      if (std::find_if(keys.begin(), keys.end(), [&](const char* n) { return kv.first == n; }) ==
          keys.end())
        fail(fmt::format("filter '{}' got an unexpected keyword argument '{}'", name, kv.first));
  }
  bool flag(size_t i, const char* key, bool dflt) const {
    const auto v = get(i, key);
    return v ? truthy(*v) : dflt;
  }
};

const Json& data_of(const Value& v, const std::string& filter) {
  return v.json(("filter '" + filter + "'").c_str());
}

std::vector<Value> items_of(const Value& v, const std::string& filter) {
  std::vector<Value> out;
  if (v.is_undefined()) return out;
  const Json& j = v.generator ? generator_items(v) : data_of(v, filter);
  if (j.is_array()) {
    for (const Json& e : j) out.emplace_back(e);
  } else if (j.is_object()) {
    for (auto it = j.begin(); it != j.end(); ++it) out.emplace_back(Json(it.key()));
  } else if (j.is_string()) {
    const std::string& s = j.get_ref<const std::string&>();
    const std::vector<size_t> cp = code_points(s);
    for (size_t i = 0; i + 1 < cp.size(); ++i)
      out.emplace_back(Json(s.substr(cp[i], cp[i + 1] - cp[i])));
  } else {
    fail(fmt::format("filter '{}': a {} is not iterable", filter, type_name(v)));
  }
  return out;
}

Json list_of(const std::vector<Value>& items, const std::string& filter) {
  Json out = Json::array();
  for (const Value& v : items) out.push_back(data_of(v, filter));
  return out;
}

// The generator Jinja's map/select/reject/unique return (see Value::generator).
Value generator_of(const std::vector<Value>& items, const std::string& filter) {
  Value v(list_of(items, filter));
  v.generator = true;
  v.spent = std::make_shared<bool>(false);
  return v;
}

// Python's len()-needing and printing uses of a generator fail (a TypeError in Python).
void no_generator(const Value& v, const std::string& filter) {
  if (v.generator)
    fail(fmt::format("filter '{}': a generator (map, select, ... without | list) has no {}", filter,
                     filter == "tojson" ? "JSON form" : "length or end"));
}

// An attribute path "a.b" (Jinja's make_attrgetter; digits index lists).
Value attribute_path(const Value& v, const std::string& path) {
  Value cur = v;
  size_t pos = 0;
  while (true) {
    const size_t dot = path.find('.', pos);
    const std::string part = path.substr(pos, dot == std::string::npos ? dot : dot - pos);
    const bool digits = !part.empty() && std::all_of(part.begin(), part.end(), [](char ch) {
      return ch >= '0' && ch <= '9';
    });
    int64_t index = 0;
    const bool is_index =
        digits && std::from_chars(part.data(), part.data() + part.size(), index).ec == std::errc();
    cur = is_index ? get_item(cur, Value(Json(index))) : get_item(cur, Value(Json(part)));
    if (dot == std::string::npos) return cur;
    pos = dot + 1;
  }
}

// --- the filters ---------------------------------------------------------------------------------

Value f_tojson(const Value& v, const Call& c) {
  c.check(4, {"ensure_ascii", "indent", "separators", "sort_keys"});
  no_generator(v, c.name);
  if (!v.is_data()) fail(fmt::format("Object of type {} is not JSON serializable", type_name(v)));
  JsonDumpOptions o;
  o.ensure_ascii = c.flag(0, "ensure_ascii", false);
  if (auto indent = c.get(1, "indent"); indent && !indent->is_none()) {
    if (indent->is_string()) {
      o.indent_str = indent->data.get<std::string>();
    } else {
      o.indent = static_cast<int>(std::clamp<int64_t>(to_int(*indent, "tojson indent"), 0, 64));
    }
  }
  if (auto sep = c.get(2, "separators"); sep && !sep->is_none()) {
    if (!sep->is_data() || !sep->data.is_array() || sep->data.size() != 2 ||
        !sep->data[0].is_string() || !sep->data[1].is_string())
      fail("tojson: separators must be a pair of strings");
    o.separators = std::make_pair(sep->data[0].get<std::string>(), sep->data[1].get<std::string>());
  }
  o.sort_keys = c.flag(3, "sort_keys", false);
  std::string out = dump_json(v.data, o);
  if (out.size() > kMaxValueBytes) fail("tojson: the text is too large");
  return Value(Json(std::move(out)));
}

Value f_length(const Value& v, const Call& c) {
  c.check(0, {});
  no_generator(v, c.name);
  if (v.is_undefined()) return Value(Json(0));
  const Json& j = data_of(v, c.name);
  if (j.is_string()) return Value(Json(code_point_count(j.get_ref<const std::string&>())));
  if (j.is_array() || j.is_object()) return Value(Json(j.size()));
  fail(fmt::format("object of type '{}' has no len()", type_name(v)));
}

Value f_first_last(const Value& v, const Call& c) {
  c.check(0, {});
  if (c.name == "last") no_generator(v, c.name);
  const std::vector<Value> items = items_of(v, c.name);
  if (items.empty()) return Value::undefined(c.name == "first" ? "first item" : "last item");
  return c.name == "first" ? items.front() : items.back();
}

Value f_join(const Value& v, const Call& c) {
  c.check(2, {"d", "attribute"});
  const auto sep = c.get(0, "d");
  const auto attr = c.get(1, "attribute");
  std::string out;
  bool first = true;
  for (const Value& item : items_of(v, c.name)) {
    if (!first) out += sep ? to_str(*sep) : "";
    out += to_str(attr && !attr->is_none() ? attribute_path(item, to_str(*attr)) : item);
    first = false;
    if (out.size() > kMaxValueBytes) fail("join: the text is too large");
  }
  return Value(Json(std::move(out)));
}

Value f_default(const Value& v, const Call& c) {
  c.check(2, {"default_value", "boolean"});
  const bool boolean = c.flag(1, "boolean", false);
  if (v.is_undefined() || (boolean && !truthy(v))) {
    const auto d = c.get(0, "default_value");
    return d ? *d : Value(Json(""));
  }
  return v;
}

Value f_items(const Value& v, const Call& c) {
  c.check(0, {});
  Json out = Json::array();
  if (v.is_undefined()) return Value(std::move(out));
  const Json& j = data_of(v, c.name);
  if (!j.is_object())
    fail(fmt::format("filter 'items': can only get items from a mapping, got {}", type_name(v)));
  for (auto it = j.begin(); it != j.end(); ++it) out.push_back(Json::array({it.key(), it.value()}));
  return Value(std::move(out));
}

Value f_int_float(const Value& v, const Call& c) {
  const bool is_int = c.name == "int";
  c.check(is_int ? 2 : 1, {"default", "base"});
  const auto dflt = c.get(0, "default");
  const Value fallback = dflt ? *dflt : Value(is_int ? Json(0) : Json(0.0));
  if (v.is_data() && (v.data.is_number() || v.data.is_boolean())) {
    if (is_int) return Value(Json(to_int(v, "int")));
    return Value(
        Json(v.data.is_boolean() ? (v.data.get<bool>() ? 1.0 : 0.0) : v.data.get<double>()));
  }
  if (!v.is_string()) return fallback;
  const std::string s = py_strip(v.data.get<std::string>(), std::nullopt, true, true);
  const auto base = c.get(1, "base");
  const int b = base ? static_cast<int>(to_int(*base, "int base")) : 10;
  if (b < 2 || b > 36) fail("int: base must be in 2..36");
  try {
    size_t used = 0;
    if (is_int) {
      const int64_t i = std::stoll(s, &used, b);
      if (used == s.size()) return Value(Json(i));
      if (b != 10) return fallback;
    }
    const double d = std::stod(s, &used);
    if (used != s.size() || s.find_first_of("xXpP") != std::string::npos) return fallback;
    return is_int ? Value(Json(to_int(Value(Json(d)), "int"))) : Value(Json(d));
  } catch (const std::logic_error&) {
    return fallback;
  }
}

Value f_case(const Value& v, const Call& c) {
  c.check(0, {});
  return Value(Json(case_map(to_str(v), c.name.c_str())));
}

Value f_trim(const Value& v, const Call& c) {
  c.check(1, {"chars"});
  const auto chars = c.get(0, "chars");
  std::optional<std::string> set;
  if (chars && !chars->is_none()) set = to_str(*chars);
  return Value(Json(py_strip(to_str(v), set, true, true)));
}

// Python's str.splitlines (the separators ASCII and Unicode line breaks).
std::vector<std::string> split_lines(const std::string& s) {
  std::vector<std::string> lines;
  const std::vector<size_t> cp = code_points(s);
  size_t start = 0;
  for (size_t k = 0; k + 1 < cp.size(); ++k) {
    const std::string ch = s.substr(cp[k], cp[k + 1] - cp[k]);
    const bool brk = ch == "\n" || ch == "\r" || ch == "\v" || ch == "\f" || ch == "\x1c" ||
                     ch == "\x1d" || ch == "\x1e" || ch == "\xc2\x85" || ch == "\xe2\x80\xa8" ||
                     ch == "\xe2\x80\xa9";
    if (!brk) continue;
    lines.push_back(s.substr(start, cp[k] - start));
    start = cp[k + 1];
    if (ch == "\r" && k + 2 < cp.size() && s[cp[k + 1]] == '\n') {
      ++k;
      start = cp[k + 1];
    }
  }
  if (start < s.size()) lines.push_back(s.substr(start));
  return lines;
}

Value f_indent(const Value& v, const Call& c) {
  c.check(3, {"width", "first", "blank"});
  const auto width = c.get(0, "width");
  std::string ind;
  if (width && width->is_string()) {
    ind = width->data.get<std::string>();
  } else {
    ind.assign(
        static_cast<size_t>(std::clamp<int64_t>(width ? to_int(*width, "indent") : 4, 0, 256)),
        ' ');
  }
  const bool first = c.flag(1, "first", false), blank = c.flag(2, "blank", false);
  std::vector<std::string> lines = split_lines(to_str(v) + "\n");
  std::string out;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (i > 0) {
      out += '\n';
      if (blank || !lines[i].empty()) out += ind;
    }
    out += lines[i];
    if (out.size() > kMaxValueBytes) fail("indent: the text is too large");
  }
  return Value(Json(first ? ind + out : out));
}

Value f_list(const Value& v, const Call& c) {
  c.check(0, {});
  return Value(list_of(items_of(v, c.name), c.name));
}

Value f_reverse(const Value& v, const Call& c) {
  c.check(0, {});
  std::vector<Value> items = items_of(v, c.name);
  std::reverse(items.begin(), items.end());
  if (v.is_string()) {
    std::string s;
    for (const Value& x : items) s += x.data.get<std::string>();
    return Value(Json(std::move(s)));
  }
  return Value(list_of(items, c.name));
}

Value f_replace(const Value& v, const Call& c) {
  c.check(3, {"old", "new", "count"});
  const auto old_s = c.get(0, "old"), new_s = c.get(1, "new"), count = c.get(2, "count");
  if (!old_s || !new_s) fail("filter 'replace' takes old and new");
  const Value m = get_attr(Value(Json(to_str(v))), "replace");
  std::vector<Value> args = {Value(Json(to_str(*old_s))), Value(Json(to_str(*new_s)))};
  if (count && !count->is_none()) args.push_back(*count);
  return (*m.fn)(args, {});
}

// Keys that compare as Jinja's sort/unique do: lower-cased strings unless case_sensitive.
Value sort_key(const Value& item, const std::optional<Value>& attribute, bool case_sensitive) {
  Value k = attribute && !attribute->is_none() ? attribute_path(item, to_str(*attribute)) : item;
  if (!case_sensitive && k.is_string())
    k = Value(Json(case_map(k.data.get<std::string>(), "lower")));
  return k;
}

Value f_unique(const Value& v, const Call& c) {
  c.check(2, {"case_sensitive", "attribute"});
  const bool cs = c.flag(0, "case_sensitive", false);
  const auto attr = c.get(1, "attribute");
  std::vector<Value> seen, out;
  for (const Value& item : items_of(v, c.name)) {
    const Value k = sort_key(item, attr, cs);
    if (std::any_of(seen.begin(), seen.end(), [&](const Value& s) { return equals(s, k); }))
      continue;
    seen.push_back(k);
    out.push_back(item);
  }
  return generator_of(out, c.name);
}

Value f_sort(const Value& v, const Call& c) {
  c.check(3, {"reverse", "case_sensitive", "attribute"});
  const bool rev = c.flag(0, "reverse", false), cs = c.flag(1, "case_sensitive", false);
  const auto attr = c.get(2, "attribute");
  std::vector<std::pair<Value, Value>> keyed;
  for (const Value& item : items_of(v, c.name)) keyed.emplace_back(sort_key(item, attr, cs), item);
  std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& a, const auto& b) {
    return truthy(binary_op("<", rev ? b.first : a.first, rev ? a.first : b.first));
  });
  std::vector<Value> out;
  for (auto& kv : keyed) out.push_back(kv.second);
  return Value(list_of(out, c.name));
}

Value f_map(const Value& v, const Call& c) {
  std::vector<Value> out;
  if (!truthy(v)) return generator_of(out, c.name);  // Jinja: `if value:` before iterating
  const auto attr = c.get(static_cast<size_t>(-1), "attribute");
  if (attr) {
    if (!c.args.empty()) fail("filter 'map' takes either a filter name or attribute=");
    const auto dflt = c.get(static_cast<size_t>(-1), "default");
    for (const Value& item : items_of(v, c.name)) {
      Value x = attribute_path(item, to_str(*attr));
      out.push_back(x.is_undefined() && dflt ? *dflt : x);
    }
  } else {
    if (c.args.empty() || !c.args[0].is_string())
      fail("filter 'map' needs a filter name or attribute=");
    const std::string f = c.args[0].data.get<std::string>();
    if (!is_filter(f)) fail(fmt::format("filter 'map': unknown filter '{}'", f));
    const std::vector<Value> rest(c.args.begin() + 1, c.args.end());
    for (const Value& item : items_of(v, c.name))
      out.push_back(apply_filter(f, item, rest, c.kwargs));
  }
  return generator_of(out, c.name);
}

// select / reject / selectattr / rejectattr.
Value f_select(const Value& v, const Call& c) {
  const bool by_attr = c.name.ends_with("attr");
  const bool keep = c.name.starts_with("select");
  if (!c.kwargs.empty()) fail(fmt::format("filter '{}' takes no keyword arguments", c.name));
  size_t i = 0;
  std::string attr;
  if (by_attr) {
    if (c.args.empty()) fail(fmt::format("filter '{}' needs an attribute name", c.name));
    attr = to_str(c.args[i++]);
  }
  std::optional<std::string> test;
  if (i < c.args.size()) {
    test = to_str(c.args[i++]);
    if (!is_test(*test)) fail(fmt::format("filter '{}': unknown test '{}'", c.name, *test));
  }
  const std::vector<Value> test_args(c.args.begin() + static_cast<long>(i), c.args.end());
  std::vector<Value> out;
  if (!truthy(v)) return generator_of(out, c.name);  // Jinja: `if value:` before iterating
  for (const Value& item : items_of(v, c.name)) {
    const Value x = by_attr ? attribute_path(item, attr) : item;
    const bool ok = test ? apply_test(*test, x, test_args) : truthy(x);
    if (ok == keep) out.push_back(item);
  }
  return generator_of(out, c.name);
}

Value f_misc(const Value& v, const Call& c) {
  if (c.name == "string") {
    c.check(0, {});
    return Value(Json(to_str(v)));
  }
  if (c.name == "safe" || c.name == "escape" || c.name == "e") {
    c.check(0, {});
    if (v.markup) return v;
    Value m(Json(c.name == "safe" ? to_str(v) : html_escape(to_str(v))));
    m.markup = true;
    return m;
  }
  if (c.name == "attr") {
    c.check(1, {});
    if (c.args.empty()) fail("filter 'attr' takes a name");
    // Python's getattr only: a dict's keys are not its attributes.
    Value a = get_attr(v, to_str(c.args[0]));
    if (v.is_data() && v.data.is_object() && a.kind != Value::Kind::kFunction)
      return Value::undefined(to_str(c.args[0]));
    return a;
  }
  if (c.name == "abs") {
    c.check(0, {});
    const Value neg = unary_op(true, v);
    return truthy(binary_op("<", v, Value(Json(0)))) ? neg : v;
  }
  // dictsort: a dict's [key, value] pairs sorted by key (case-insensitive by default).
  c.check(3, {"case_sensitive", "by", "reverse"});
  const bool cs = c.flag(0, "case_sensitive", false), rev = c.flag(2, "reverse", false);
  const auto by = c.get(1, "by");
  const bool by_value = by && to_str(*by) == "value";
  Json pairs = f_items(v, Call{c.name, {}, {}}).data;
  std::vector<Value> items;
  for (const Json& p : pairs) items.emplace_back(p);
  std::stable_sort(items.begin(), items.end(), [&](const Value& a, const Value& b) {
    const Value ka = sort_key(Value(a.data[by_value ? 1 : 0]), std::nullopt, cs);
    const Value kb = sort_key(Value(b.data[by_value ? 1 : 0]), std::nullopt, cs);
    return truthy(binary_op("<", rev ? kb : ka, rev ? ka : kb));
  });
  return Value(list_of(items, c.name));
}

using FilterFn = Value (*)(const Value&, const Call&);

const std::map<std::string, FilterFn>& filters() {
  static const std::map<std::string, FilterFn> m = {
      {"tojson", f_tojson},    {"length", f_length},     {"count", f_length},
      {"first", f_first_last}, {"last", f_first_last},   {"join", f_join},
      {"default", f_default},  {"d", f_default},         {"items", f_items},
      {"int", f_int_float},    {"float", f_int_float},   {"upper", f_case},
      {"lower", f_case},       {"capitalize", f_case},   {"title", f_case},
      {"trim", f_trim},        {"indent", f_indent},     {"list", f_list},
      {"reverse", f_reverse},  {"replace", f_replace},   {"unique", f_unique},
      {"sort", f_sort},        {"map", f_map},           {"select", f_select},
      {"reject", f_select},    {"selectattr", f_select}, {"rejectattr", f_select},
      {"string", f_misc},      {"safe", f_misc},         {"escape", f_misc},
      {"e", f_misc},           {"attr", f_misc},         {"abs", f_misc},
      {"dictsort", f_misc},
  };
  return m;
}

// --- the tests -----------------------------------------------------------------------------------

bool is_number(const Value& v) {
  return v.is_data() && (v.data.is_number() || v.data.is_boolean());
}

bool compare_test(const std::string& name, const Value& v, const std::vector<Value>& args) {
  if (args.size() != 1) fail(fmt::format("test '{}' takes one argument", name));
  static const std::map<std::string, std::string> ops = {
      {"eq", "=="}, {"equalto", "=="}, {"==", "=="},      {"ne", "!="},
      {"!=", "!="}, {"lt", "<"},       {"lessthan", "<"}, {"<", "<"},
      {"le", "<="}, {"<=", "<="},      {"gt", ">"},       {"greaterthan", ">"},
      {">", ">"},   {"ge", ">="},      {">=", ">="},      {"in", "in"}};
  return truthy(binary_op(ops.at(name), v, args[0]));
}

}  // namespace

bool is_filter(const std::string& name) {
  return filters().count(name) > 0;
}

bool is_test(const std::string& name) {
  static const char* const kTests[] = {
      "defined",     "undefined", "none",        "string", "mapping", "iterable", "number",
      "sequence",    "boolean",   "true",        "false",  "integer", "float",    "callable",
      "odd",         "even",      "divisibleby", "eq",     "equalto", "==",       "ne",
      "!=",          "lt",        "lessthan",    "<",      "le",      "<=",       "gt",
      "greaterthan", ">",         "ge",          ">=",     "in",      "lower",    "upper",
      "sameas",      "escaped"};
  return std::any_of(std::begin(kTests), std::end(kTests),
                     [&](const char* t) { return name == t; });
}

Value apply_filter(const std::string& name, const Value& base, const std::vector<Value>& args,
                   const Kwargs& kwargs) {
  auto it = filters().find(name);
  if (it == filters().end()) fail(fmt::format("unknown filter '{}'", name));
  return it->second(base, Call{name, args, kwargs});
}

bool apply_test(const std::string& name, const Value& v, const std::vector<Value>& args) {
  const Json* j = v.is_data() ? &v.data : nullptr;
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "string") return v.is_string();
  if (name == "mapping") return j && j->is_object();
  // Jinja's Undefined iterates (as empty) and has a length, so it is iterable and a sequence.
  if (name == "iterable" || name == "sequence")
    return v.is_undefined() || (j && (j->is_string() || j->is_array() || j->is_object()));
  if (name == "number") return is_number(v);
  if (name == "boolean") return j && j->is_boolean();
  if (name == "true") return j && j->is_boolean() && j->get<bool>();
  if (name == "false") return j && j->is_boolean() && !j->get<bool>();
  if (name == "integer") return j && j->is_number_integer();
  if (name == "float") return j && j->is_number_float();
  if (name == "callable") return v.kind == Value::Kind::kFunction;
  if (name == "escaped") return false;
  if (name == "odd" || name == "even") {
    const int64_t i = to_int(v, name.c_str());
    return (i % 2 != 0) == (name == "odd");
  }
  if (name == "divisibleby") {
    if (args.size() != 1) fail("test 'divisibleby' takes one argument");
    const int64_t d = to_int(args[0], "divisibleby");
    if (d == 0) fail("divisibleby 0");
    return to_int(v, "divisibleby") % d == 0;
  }
  if (name == "lower" || name == "upper") {
    const std::string s = to_str(v);
    bool cased = false;
    for (unsigned char ch : s) {
      if (ch >= 0x80) fail(fmt::format("test '{}' on non-ASCII text is not supported", name));
      if (std::isalpha(ch)) {
        cased = true;
        if ((name == "lower") != (std::islower(ch) != 0)) return false;
      }
    }
    return cased;
  }
  if (name == "sameas") {
    if (args.size() != 1) fail("test 'sameas' takes one argument");
    const Value& o = args[0];
    if (v.is_none() || o.is_none()) return v.is_none() && o.is_none();
    if (j && j->is_boolean()) return o.is_data() && o.data.is_boolean() && equals(v, o);
    if (v.kind == Value::Kind::kNamespace || v.kind == Value::Kind::kFunction) return equals(v, o);
    fail("test 'sameas' is supported for none, booleans, namespaces and functions only");
  }
  return compare_test(name, v, args);
}

}  // namespace rlhf::io::jinja
