// Attribute and item access, the Python methods of str, dict and list that chat templates call,
// and the global functions (io/jinja/builtins.h: get_attr, get_item, get_slice,
// global_functions).
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cstring>

#include "io/jinja/builtins.h"

namespace rlhf::io::jinja {

namespace {

// --- argument helpers ----------------------------------------------------------------------------

// Positional argument i, or the keyword `name`, or unset.
std::optional<Value> arg(const std::vector<Value>& args, const Kwargs& kwargs, size_t i,
                         const char* name) {
  if (i < args.size()) return args[i];
  for (const auto& [k, v] : kwargs)
    if (k == name) return v;
  return std::nullopt;
}

void check_arity(const char* fn, const std::vector<Value>& args, const Kwargs& kwargs,
                 size_t max_args, std::initializer_list<const char*> names) {
  if (args.size() > max_args)
    fail(fmt::format("{}() takes at most {} arguments, got {}", fn, max_args, args.size()));
  for (const auto& kv : kwargs)
    if (std::find_if(names.begin(), names.end(), [&](const char* n) { return kv.first == n; }) ==
        names.end())
      fail(fmt::format("{}() got an unexpected keyword argument '{}'", fn, kv.first));
}

const std::string& str_arg(const Value& v, const char* fn) {
  if (!v.is_string()) fail(fmt::format("{}: expected a string argument, got {}", fn, type_name(v)));
  return v.data.get_ref<const std::string&>();
}

// An optional string argument where None means unset (str.strip(None), str.split(None)).
std::optional<std::string> opt_str(const std::optional<Value>& v, const char* fn) {
  if (!v || v->is_none()) return std::nullopt;
  return str_arg(*v, fn);
}

Json string_list(const std::vector<std::string>& parts) {
  Json out = Json::array();
  for (const std::string& p : parts) out.push_back(p);
  return out;
}

// --- str methods ---------------------------------------------------------------------------------

bool affix_match(const std::string& s, const Value& affix, bool prefix, const char* fn) {
  auto one = [&](const std::string& a) { return prefix ? s.starts_with(a) : s.ends_with(a); };
  if (affix.is_data() && affix.data.is_array()) {
    for (const Json& a : affix.data)
      if (one(str_arg(Value(a), fn))) return true;
    return false;
  }
  return one(str_arg(affix, fn));
}

std::string replace_all(const std::string& s, const std::string& from, const std::string& to,
                        int64_t count) {
  std::string out;
  if (from.empty()) {  // Python inserts `to` around every character
    const std::vector<size_t> cp = code_points(s);
    for (size_t i = 0; i + 1 < cp.size(); ++i) {
      if (count < 0 || static_cast<int64_t>(i) < count) out += to;
      out += s.substr(cp[i], cp[i + 1] - cp[i]);
    }
    if (count < 0 || static_cast<int64_t>(cp.size()) - 1 < count) out += to;
    return out;
  }
  size_t pos = 0;
  int64_t n = 0;
  while (count < 0 || n < count) {
    const size_t f = s.find(from, pos);
    if (f == std::string::npos) break;
    out.append(s, pos, f - pos);
    out += to;
    pos = f + from.size();
    ++n;
    if (out.size() > kMaxValueBytes) fail("replace: the result is too large");
  }
  out.append(s, pos);
  return out;
}

Value str_method(const std::string& s, const std::string& name, const std::vector<Value>& args,
                 const Kwargs& kwargs) {
  const std::string fn = "str." + name;
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    check_arity(fn.c_str(), args, kwargs, 1, {});
    return Value(Json(py_strip(s, opt_str(arg(args, kwargs, 0, ""), fn.c_str()), name != "rstrip",
                               name != "lstrip")));
  }
  if (name == "split") {
    check_arity(fn.c_str(), args, kwargs, 2, {"sep", "maxsplit"});
    const auto max = arg(args, kwargs, 1, "maxsplit");
    return Value(string_list(py_split(s, opt_str(arg(args, kwargs, 0, "sep"), fn.c_str()),
                                      max ? to_int(*max, fn.c_str()) : -1)));
  }
  if (name == "startswith" || name == "endswith") {
    check_arity(fn.c_str(), args, kwargs, 1, {});
    if (args.empty()) fail(fn + "() takes exactly one argument");
    return Value(Json(affix_match(s, args[0], name == "startswith", fn.c_str())));
  }
  if (name == "upper" || name == "lower" || name == "title" || name == "capitalize") {
    check_arity(fn.c_str(), args, kwargs, 0, {});
    return Value(Json(case_map(s, name == "title" ? "str.title" : name.c_str())));
  }
  if (name == "replace") {
    check_arity(fn.c_str(), args, kwargs, 3, {"count"});
    if (args.size() < 2) fail(fn + "() takes at least 2 arguments");
    const auto count = arg(args, kwargs, 2, "count");
    return Value(Json(replace_all(s, str_arg(args[0], fn.c_str()), str_arg(args[1], fn.c_str()),
                                  count ? to_int(*count, fn.c_str()) : -1)));
  }
  if (name == "find" || name == "count") {
    check_arity(fn.c_str(), args, kwargs, 1, {});
    if (args.empty()) fail(fn + "() takes exactly one argument");
    const std::string& sub = str_arg(args[0], fn.c_str());
    if (name == "find") {
      const size_t f = s.find(sub);
      return Value(Json(f == std::string::npos
                            ? int64_t{-1}
                            : static_cast<int64_t>(code_point_count(s.substr(0, f)))));
    }
    if (sub.empty()) return Value(Json(static_cast<int64_t>(code_point_count(s) + 1)));
    int64_t n = 0;
    for (size_t p = s.find(sub); p != std::string::npos; p = s.find(sub, p + sub.size())) ++n;
    return Value(Json(n));
  }
  if (name == "join") {
    check_arity(fn.c_str(), args, kwargs, 1, {});
    if (args.empty() || !args[0].is_data() || !args[0].data.is_array())
      fail(fn + "() takes a list");
    std::string out;
    for (size_t i = 0; i < args[0].data.size(); ++i)
      out += (i ? s : "") + str_arg(Value(args[0].data[i]), fn.c_str());
    return Value(Json(std::move(out)));
  }
  if (name == "isdigit" || name == "isspace" || name == "isalpha") {
    check_arity(fn.c_str(), args, kwargs, 0, {});
    if (s.empty()) return Value(Json(false));
    for (unsigned char c : s) {
      if (c >= 0x80) fail(fn + "() on non-ASCII text is not supported");
      const bool ok = name == "isdigit"   ? std::isdigit(c)
                      : name == "isspace" ? std::isspace(c)
                                          : std::isalpha(c);
      if (!ok) return Value(Json(false));
    }
    return Value(Json(true));
  }
  fail(fmt::format("the string method '{}' is not supported", name));
}

constexpr std::array<const char*, 16> kStrMethods = {
    "strip", "lstrip",     "rstrip",  "split", "startswith", "endswith", "upper",   "lower",
    "title", "capitalize", "replace", "find",  "count",      "join",     "isdigit", "isspace"};

// --- dict and list methods -----------------------------------------------------------------------

Value dict_method(const Json& d, const std::string& name, const std::vector<Value>& args,
                  const Kwargs& kwargs) {
  const std::string fn = "dict." + name;
  if (name == "items" || name == "keys" || name == "values") {
    check_arity(fn.c_str(), args, kwargs, 0, {});
    Json out = Json::array();
    for (auto it = d.begin(); it != d.end(); ++it) {
      if (name == "items") out.push_back(Json::array({it.key(), it.value()}));
      if (name == "keys") out.push_back(it.key());
      if (name == "values") out.push_back(it.value());
    }
    return Value(std::move(out));
  }
  if (name == "get") {
    check_arity(fn.c_str(), args, kwargs, 2, {});
    if (args.empty()) fail("dict.get() takes a key");
    if (args[0].is_string()) {
      auto it = d.find(args[0].data.get<std::string>());
      if (it != d.end()) return Value(*it);
    }
    return args.size() > 1 ? args[1] : Value(Json(nullptr));
  }
  fail(fmt::format("the dict method '{}' is not supported", name));
}

Value list_method(const Json& l, const std::string& name, const std::vector<Value>& args,
                  const Kwargs& kwargs) {
  const std::string fn = "list." + name;
  check_arity(fn.c_str(), args, kwargs, 1, {});
  if (args.empty()) fail(fn + "() takes exactly one argument");
  int64_t n = 0;
  for (size_t i = 0; i < l.size(); ++i) {
    if (!equals(Value(l[i]), args[0])) continue;
    if (name == "index") return Value(Json(static_cast<int64_t>(i)));
    ++n;
  }
  if (name == "index") fail(fmt::format("list.index(x): {} is not in the list", to_str(args[0])));
  return Value(Json(n));
}

bool one_of(const std::string& name, std::initializer_list<const char*> names) {
  return std::any_of(names.begin(), names.end(), [&](const char* n) { return name == n; });
}

Value bound(const std::string& type, const std::string& name, Json self) {
  return Value::function(
      type + "." + name,
      [type, name, self = std::move(self)](const std::vector<Value>& args, const Kwargs& kwargs) {
        if (type == "str")
          return str_method(self.get_ref<const std::string&>(), name, args, kwargs);
        if (type == "dict") return dict_method(self, name, args, kwargs);
        return list_method(self, name, args, kwargs);
      });
}

}  // namespace

Value get_attr(const Value& obj, const std::string& name) {
  if (obj.is_undefined())
    fail(fmt::format("'{}' is undefined (reading its attribute '{}')",
                     obj.name.empty() ? "value" : obj.name, name));
  if (obj.generator) return Value::undefined("generator." + name);
  if (obj.kind == Value::Kind::kNamespace) {
    auto it = obj.ns->find(name);
    return it != obj.ns->end() ? Value(*it) : Value::undefined(name);
  }
  if (!obj.is_data()) return Value::undefined(name);
  const Json& j = obj.data;
  if (j.is_string()) {
    if (std::find_if(kStrMethods.begin(), kStrMethods.end(),
                     [&](const char* m) { return name == m; }) != kStrMethods.end())
      return bound("str", name, j);
    return Value::undefined("str." + name);
  }
  if (j.is_object()) {
    if (one_of(name, {"items", "keys", "values", "get"})) return bound("dict", name, j);
    if (one_of(name, {"pop", "popitem", "setdefault", "update", "clear", "copy", "fromkeys"}))
      return Value::undefined("dict." + name + " (not supported)");
    auto it = j.find(name);
    return it != j.end() ? Value(*it) : Value::undefined(name);
  }
  if (j.is_array()) {
    if (one_of(name, {"index", "count"})) return bound("list", name, j);
    return Value::undefined(
        "list." + name +
        (one_of(name, {"append", "extend", "insert", "pop", "remove", "reverse", "sort", "clear"})
             ? " (not supported)"
             : ""));
  }
  return Value::undefined(name);
}

Value get_item(const Value& obj, const Value& key) {
  if (obj.is_undefined())
    fail(fmt::format("'{}' is undefined (reading an item of it)",
                     obj.name.empty() ? "value" : obj.name));
  if (obj.generator) return Value::undefined("an item of a generator");
  if (obj.is_data() && key.is_data() && (key.data.is_number_integer() || key.data.is_boolean())) {
    const Json& j = obj.data;
    const int64_t k = to_int(key, "an index");
    if (j.is_array() || j.is_string()) {
      std::vector<size_t> cp;
      if (j.is_string()) cp = code_points(j.get_ref<const std::string&>());
      const int64_t n = static_cast<int64_t>(j.is_array() ? j.size() : cp.size() - 1);
      const int64_t i = k < 0 ? k + n : k;
      if (i < 0 || i >= n) return Value::undefined(fmt::format("index {}", k));
      if (j.is_array()) return Value(j[static_cast<size_t>(i)]);
      const size_t u = static_cast<size_t>(i);
      return Value(Json(j.get_ref<const std::string&>().substr(cp[u], cp[u + 1] - cp[u])));
    }
  }
  if (key.is_string()) {
    const std::string& k = key.data.get_ref<const std::string&>();
    if (obj.is_data() && obj.data.is_object()) {
      auto it = obj.data.find(k);
      if (it != obj.data.end()) return Value(*it);
    }
    return get_attr(obj, k);
  }
  return Value::undefined("item " + to_str(key));
}

Value get_slice(const Value& obj, const Value& start, const Value& stop, const Value& step) {
  if (!obj.is_data() || obj.generator || !(obj.data.is_array() || obj.data.is_string()))
    fail(fmt::format("cannot slice a {}", type_name(obj)));
  const Json& j = obj.data;
  std::vector<size_t> cp;
  if (j.is_string()) cp = code_points(j.get_ref<const std::string&>());
  const int64_t n = static_cast<int64_t>(j.is_array() ? j.size() : cp.size() - 1);
  auto unset = [](const Value& v) { return v.is_undefined() || v.is_none(); };
  const int64_t st = unset(step) ? 1 : to_int(step, "a slice step");
  if (st == 0) fail("slice step cannot be zero");
  // Python's slice.indices(n).
  auto bound_index = [&](const Value& v, int64_t dflt) {
    if (unset(v)) return dflt;
    int64_t i = to_int(v, "a slice index");
    if (i < 0) i = std::max<int64_t>(i + n, st < 0 ? -1 : 0);
    return std::min<int64_t>(i, st < 0 ? n - 1 : n);
  };
  const int64_t b = bound_index(start, st < 0 ? n - 1 : 0);
  const int64_t e = bound_index(stop, st < 0 ? -1 : n);
  Json out = j.is_array() ? Json::array() : Json("");
  std::string s;
  for (int64_t i = b; st > 0 ? i < e : i > e; i += st) {
    const auto u = static_cast<size_t>(i);
    if (j.is_array()) {
      out.push_back(j[u]);
    } else {
      s.append(j.get_ref<const std::string&>(), cp[u], cp[u + 1] - cp[u]);
    }
  }
  return j.is_array() ? Value(std::move(out)) : Value(Json(std::move(s)));
}

// --- globals -------------------------------------------------------------------------------------

namespace {

Value range_fn(const std::vector<Value>& args, const Kwargs& kwargs) {
  check_arity("range", args, kwargs, 3, {});
  if (args.empty()) fail("range() takes at least 1 argument");
  int64_t start = 0, stop = 0, step = 1;
  if (args.size() == 1) {
    stop = to_int(args[0], "range");
  } else {
    start = to_int(args[0], "range");
    stop = to_int(args[1], "range");
    if (args.size() == 3) step = to_int(args[2], "range");
  }
  if (step == 0) fail("range() step must not be zero");
  // Jinja's sandbox refuses ranges longer than MAX_RANGE = 100000.
  const double len = std::ceil((static_cast<double>(stop) - static_cast<double>(start)) /
                               static_cast<double>(step));
  if (len > 100000) fail("range() is too big (the sandbox allows 100000 items)");
  Json out = Json::array();
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) out.push_back(i);
  return Value(std::move(out));
}

// dict(mapping?, **kwargs) and namespace(mapping?, **kwargs): the keys in call order.
Json mapping_of(const char* fn, const std::vector<Value>& args, const Kwargs& kwargs) {
  if (args.size() > 1) fail(fmt::format("{}() takes at most one positional argument", fn));
  Json out = Json::object();
  if (!args.empty()) {
    if (!args[0].is_data() || !args[0].data.is_object())
      fail(fmt::format("{}(): the positional argument must be a dict", fn));
    out = args[0].data;
  }
  for (const auto& [k, v] : kwargs) {
    if (!v.is_data()) fail(fmt::format("{}(): a {} value is not supported", fn, type_name(v)));
    out[k] = v.data;
  }
  return out;
}

}  // namespace

std::vector<std::pair<std::string, Value>> global_functions(std::time_t now) {
  std::vector<std::pair<std::string, Value>> g;
  g.emplace_back("range", Value::function("range", range_fn));
  g.emplace_back("dict", Value::function("dict", [](const auto& args, const auto& kwargs) {
                   return Value(mapping_of("dict", args, kwargs));
                 }));
  g.emplace_back(
      "namespace", Value::function("namespace", [](const auto& args, const auto& kwargs) {
        Json attrs = mapping_of("namespace", args, kwargs);
        for (auto it = attrs.begin(); it != attrs.end(); ++it)
          if (it.key().starts_with("_"))
            fail(fmt::format("namespace attributes cannot start with '_' (got '{}')", it.key()));
        return Value::namespace_of(std::move(attrs));
      }));
  g.emplace_back("raise_exception",
                 Value::function("raise_exception", [](const auto& args, const auto& kwargs) {
                   check_arity("raise_exception", args, kwargs, 1, {});
                   if (args.empty()) fail("raise_exception() takes a message");
                   throw Raised(to_str(args[0]));
                   return Value();
                 }));
  g.emplace_back("strftime_now",
                 Value::function("strftime_now", [now](const auto& args, const auto& kwargs) {
                   check_arity("strftime_now", args, kwargs, 1, {});
                   if (args.empty()) fail("strftime_now() takes a format");
                   const std::string& f = str_arg(args[0], "strftime_now");
                   std::tm local{};
                   localtime_r(&now, &local);
                   std::string buf(256 + f.size() * 8, '\0');
                   buf.resize(std::strftime(buf.data(), buf.size(), f.c_str(), &local));
                   return Value(Json(std::move(buf)));
                 }));
  return g;
}

}  // namespace rlhf::io::jinja
