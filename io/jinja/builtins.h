// Jinja's built-in filters, tests, globals and the Python methods of str, list and dict that chat
// templates call (io/jinja), with the behaviour they have under transformers (jinja2 3.1 in an
// ImmutableSandboxedEnvironment, transformers' own tojson, raise_exception, strftime_now, dict
// and namespace).
#pragma once

#include <ctime>
#include <optional>
#include <string>
#include <vector>

#include "io/jinja/value.h"

namespace rlhf::io::jinja {

/// Raised by the template's raise_exception(message): the message as the template wrote it.
class Raised : public std::runtime_error {
 public:
  explicit Raised(const std::string& message) : std::runtime_error(message) {}
};

/// Whether `name` is a filter / a test this engine has (the parser rejects others).
bool is_filter(const std::string& name);
bool is_test(const std::string& name);

/// Applies filter `name` to `base`. Throws Failure for bad arguments or types.
Value apply_filter(const std::string& name, const Value& base, const std::vector<Value>& args,
                   const Kwargs& kwargs);
/// Applies test `name` (`v is name(args)`).
bool apply_test(const std::string& name, const Value& v, const std::vector<Value>& args);

/// obj.name as Jinja's sandboxed getattr gives it: a method of str/list/dict bound to obj (dict
/// methods win over keys, as in Python), else a dict key, a namespace attribute, or Undefined
/// (data without that attribute, None included). Throws Failure on Undefined obj and for the
/// mutating methods the sandbox forbids.
Value get_attr(const Value& obj, const std::string& name);
/// obj[key]: list and string by index (negative from the end, code points for strings), dict by
/// key, then the attribute `key` (Jinja's getitem); Undefined when absent.
Value get_item(const Value& obj, const Value& key);
/// obj[start:stop:step] for lists and strings (Python's slice rules; unset parts are Undefined).
Value get_slice(const Value& obj, const Value& start, const Value& stop, const Value& step);

/// The global functions: range, namespace, dict, raise_exception, strftime_now (formatting
/// `now`, local time), as Value::function objects by name.
std::vector<std::pair<std::string, Value>> global_functions(std::time_t now);

/// Python's int(x) for a filter or range argument; throws Failure naming `what`.
int64_t to_int(const Value& v, const char* what);

/// `a op b` for op in + - * / // % ** ~ == != < <= > >= in, "not in", with Python's semantics
/// (int arithmetic checked for overflow, str and list + and * , Undefined an error except for ~,
/// == and in). Results larger than kMaxValueBytes throw Failure.
Value binary_op(const std::string& op, const Value& a, const Value& b);
/// -v (negate = true) or +v for numbers.
Value unary_op(bool negate, const Value& v);

/// The largest string or list a template may build (bytes, or elements for lists): 16 MiB.
inline constexpr size_t kMaxValueBytes = size_t{16} << 20;

}  // namespace rlhf::io::jinja
