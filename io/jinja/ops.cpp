// Python's operators on template values (io/jinja/builtins.h: binary_op, unary_op, to_int).
#include <fmt/format.h>

#include <cmath>
#include <limits>

#include "io/jinja/builtins.h"

namespace rlhf::io::jinja {

namespace {

bool is_num(const Value& v) {
  return v.is_data() && (v.data.is_number() || v.data.is_boolean());
}

struct Num {
  bool is_float;
  int64_t i;
  double d;
};

Num num(const Json& j) {
  if (j.is_boolean()) return {false, j.get<bool>() ? 1 : 0, 0};
  if (j.is_number_float()) return {true, 0, j.get<double>()};
  if (j.is_number_unsigned() && j.get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max()))
    fail("integers beyond 64 bits are not supported");
  return {false, j.get<int64_t>(), 0};
}

double as_double(const Num& n) {
  return n.is_float ? n.d : static_cast<double>(n.i);
}

[[noreturn]] void type_error(const std::string& op, const Value& a, const Value& b) {
  if (a.is_undefined() || b.is_undefined()) {
    const Value& u = a.is_undefined() ? a : b;
    fail(fmt::format("'{}' is undefined", u.name.empty() ? "value" : u.name));
  }
  fail(fmt::format("unsupported operand types for {}: '{}' and '{}'", op, type_name(a),
                   type_name(b)));
}

void check_overflow(bool overflow) {
  if (overflow) fail("integer overflow (beyond 64 bits)");
}

Value arithmetic(const std::string& op, const Num& x, const Num& y) {
  const bool fl = x.is_float || y.is_float;
  int64_t r = 0;
  if (op == "/") {
    if (as_double(y) == 0) fail("division by zero");
    return Value(Json(as_double(x) / as_double(y)));
  }
  if (op == "//" || op == "%") {
    if (fl) {
      const double a = as_double(x), b = as_double(y);
      if (b == 0) fail("division by zero");
      if (op == "//") return Value(Json(std::floor(a / b)));
      double m = std::fmod(a, b);
      if (m != 0 && ((m < 0) != (b < 0))) m += b;
      return Value(Json(m));
    }
    if (y.i == 0) fail("division by zero");
    if (x.i == std::numeric_limits<int64_t>::min() && y.i == -1)
      fail("integer overflow (beyond 64 bits)");
    int64_t q = x.i / y.i, m = x.i % y.i;
    if (m != 0 && ((m < 0) != (y.i < 0))) {
      --q;
      m += y.i;
    }
    return Value(Json(op == "//" ? q : m));
  }
  if (op == "**") {
    if (fl || y.i < 0) return Value(Json(std::pow(as_double(x), as_double(y))));
    int64_t acc = 1;
    for (int64_t k = 0; k < y.i; ++k) {
      check_overflow(__builtin_mul_overflow(acc, x.i, &acc));
      if (acc == 0 || acc == 1) break;
      if (acc == -1) {
        acc = (y.i - k - 1) % 2 == 0 ? -1 : 1;
        break;
      }
    }
    return Value(Json(acc));
  }
  if (fl) {
    const double a = as_double(x), b = as_double(y);
    return Value(Json(op == "+" ? a + b : op == "-" ? a - b : a * b));
  }
  if (op == "+") {
    check_overflow(__builtin_add_overflow(x.i, y.i, &r));
  } else if (op == "-") {
    check_overflow(__builtin_sub_overflow(x.i, y.i, &r));
  } else {
    check_overflow(__builtin_mul_overflow(x.i, y.i, &r));
  }
  return Value(Json(r));
}

Value repeat(const Json& seq, int64_t n) {
  if (n <= 0) return Value(seq.is_string() ? Json("") : Json::array());
  const size_t unit = seq.is_string() ? seq.get_ref<const std::string&>().size() : seq.size();
  if (unit != 0 && static_cast<uint64_t>(n) > kMaxValueBytes / unit)
    fail(fmt::format("the repeated value would exceed {} bytes", kMaxValueBytes));
  if (seq.is_string()) {
    std::string out;
    for (int64_t k = 0; k < n; ++k) out += seq.get_ref<const std::string&>();
    return Value(Json(std::move(out)));
  }
  Json out = Json::array();
  for (int64_t k = 0; k < n; ++k)
    for (const Json& e : seq) out.push_back(e);
  return Value(std::move(out));
}

// Python's < for numbers, strings and lists (lexicographic); -1, 0, 1.
int compare(const std::string& op, const Value& a, const Value& b) {
  if (is_num(a) && is_num(b)) {
    const Num x = num(a.data), y = num(b.data);
    if (!x.is_float && !y.is_float) return x.i < y.i ? -1 : x.i > y.i ? 1 : 0;
    const double p = as_double(x), q = as_double(y);
    if (std::isnan(p) || std::isnan(q)) fail("comparisons with NaN are not supported");
    return p < q ? -1 : p > q ? 1 : 0;
  }
  if (a.is_string() && b.is_string()) {
    const int c =
        a.data.get_ref<const std::string&>().compare(b.data.get_ref<const std::string&>());
    return c < 0 ? -1 : c > 0 ? 1 : 0;
  }
  if (a.is_data() && b.is_data() && a.data.is_array() && b.data.is_array()) {
    for (size_t i = 0; i < a.data.size() && i < b.data.size(); ++i) {
      const Value x(a.data[i]), y(b.data[i]);
      if (!equals(x, y)) return compare(op, x, y);
    }
    return a.data.size() < b.data.size() ? -1 : a.data.size() > b.data.size() ? 1 : 0;
  }
  fail(fmt::format("'{}' is not supported between '{}' and '{}'", op, type_name(a), type_name(b)));
}

bool contains(const Value& item, const Value& seq) {
  if (seq.is_undefined()) return false;
  if (!seq.is_data()) fail(fmt::format("'in' on a {} is not supported", type_name(seq)));
  const Json& s = seq.data;
  if (s.is_string()) {
    if (!item.is_string())
      fail(fmt::format("'in <string>' requires string as left operand, not {}", type_name(item)));
    return s.get_ref<const std::string&>().find(item.data.get_ref<const std::string&>()) !=
           std::string::npos;
  }
  if (s.is_array()) {
    for (const Json& e : s)
      if (equals(item, Value(e))) return true;
    return false;
  }
  if (s.is_object()) return item.is_string() && s.contains(item.data.get<std::string>());
  fail(fmt::format("argument of type '{}' is not iterable", type_name(seq)));
}

}  // namespace

int64_t to_int(const Value& v, const char* what) {
  if (is_num(v)) {
    const Num n = num(v.data);
    if (!n.is_float) return n.i;
    if (!std::isfinite(n.d) || std::fabs(n.d) >= 9.2e18)
      fail(fmt::format("{}: {} does not fit an integer", what, py_float(n.d)));
    return static_cast<int64_t>(n.d);
  }
  fail(fmt::format("{}: expected an integer, got {}", what, type_name(v)));
}

Value binary_op(const std::string& op, const Value& a, const Value& b) {
  if (op == "~") {
    std::string s = to_str(a) + to_str(b);
    if (s.size() > kMaxValueBytes)
      fail(fmt::format("a string would exceed {} bytes", kMaxValueBytes));
    return Value(Json(std::move(s)));
  }
  if (op == "==") return Value(Json(equals(a, b)));
  if (op == "!=") return Value(Json(!equals(a, b)));
  if (a.generator || b.generator) {
    if (op == "in" && !a.generator) return Value(Json(contains(a, Value(generator_items(b)))));
    if (op == "not in" && !a.generator) return Value(Json(!contains(a, Value(generator_items(b)))));
    fail(fmt::format("'{}' on a generator (map, select, ... without | list) is not supported", op));
  }
  if (op == "in") return Value(Json(contains(a, b)));
  if (op == "not in") return Value(Json(!contains(a, b)));
  if (op == "<" || op == "<=" || op == ">" || op == ">=") {
    if (a.is_undefined() || b.is_undefined()) type_error(op, a, b);
    const int c = compare(op, a, b);
    return Value(Json(op == "<" ? c < 0 : op == "<=" ? c <= 0 : op == ">" ? c > 0 : c >= 0));
  }
  if (is_num(a) && is_num(b)) return arithmetic(op, num(a.data), num(b.data));
  if (op == "+" && a.is_data() && b.is_data()) {
    if (a.data.is_string() && b.data.is_string()) {
      // Markup + str escapes the plain side (markupsafe's __add__ / __radd__).
      const bool markup = a.markup || b.markup;
      const std::string x =
          markup && !a.markup ? html_escape(a.data.get<std::string>()) : a.data.get<std::string>();
      const std::string y =
          markup && !b.markup ? html_escape(b.data.get<std::string>()) : b.data.get<std::string>();
      if (x.size() + y.size() > kMaxValueBytes)
        fail(fmt::format("a string would exceed {} bytes", kMaxValueBytes));
      Value r(Json(x + y));
      r.markup = markup;
      return r;
    }
    if (a.data.is_array() && b.data.is_array()) {
      if (a.data.size() + b.data.size() > kMaxValueBytes)
        fail(fmt::format("a list would exceed {} elements", kMaxValueBytes));
      Json out = a.data;
      for (const Json& e : b.data) out.push_back(e);
      return Value(std::move(out));
    }
  }
  if (op == "*" && a.is_data() && b.is_data()) {
    if ((a.data.is_string() || a.data.is_array()) && is_num(b) && !num(b.data).is_float)
      return repeat(a.data, num(b.data).i);
    if ((b.data.is_string() || b.data.is_array()) && is_num(a) && !num(a.data).is_float)
      return repeat(b.data, num(a.data).i);
  }
  if (op == "%" && a.is_string())
    fail("printf-style string formatting ('...' % x) is not supported");
  type_error(op, a, b);
}

Value unary_op(bool negate, const Value& v) {
  if (!is_num(v)) {
    if (v.is_undefined()) fail(fmt::format("'{}' is undefined", v.name));
    fail(fmt::format("bad operand type for unary {}: '{}'", negate ? '-' : '+', type_name(v)));
  }
  const Num n = num(v.data);
  if (n.is_float) return Value(Json(negate ? -n.d : n.d));
  if (negate && n.i == std::numeric_limits<int64_t>::min())
    fail("integer overflow (beyond 64 bits)");
  return Value(Json(negate ? -n.i : n.i));
}

}  // namespace rlhf::io::jinja
