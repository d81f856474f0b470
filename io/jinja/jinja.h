// A Jinja2 template engine for Hugging Face chat templates (io/jinja): the subset of Jinja2 that
// chat templates use, rendering byte for byte as transformers' apply_chat_template does (Jinja2
// 3.1 in an ImmutableSandboxedEnvironment with trim_blocks and lstrip_blocks, plus transformers'
// globals raise_exception, strftime_now, namespace, dict and its tojson filter).
//
// Supported: {{ }}, {% if/elif/else %}, {% for %} (tuple targets, `if` filter, else, loop.index,
// index0, revindex, revindex0, first, last, length, previtem, nextitem, break/continue),
// {% set %} (names, tuples, ns.attr, blocks), {% macro %}, {% with %}, {% generation %}, {% raw %},
// comments, whitespace control; literals, lists, tuples, dicts, attribute/item access, slices,
// Python's operators, `x if c else y`, the filters and tests of io/jinja/builtins.cpp, and the
// str/dict methods chat templates call (strip, split, startswith, items, get, ...). Anything
// else fails with an rlhf::Error naming the template line and column; nothing is silently
// rendered differently. Untrusted templates are bounded: nesting depth, steps, value and output
// sizes.
#pragma once

#include <ctime>
#include <memory>
#include <string>

#include "core/error.h"
#include "io/jinja/value.h"

namespace rlhf::io::jinja {

/// raise_exception(message) in the template: what() is the template's own message.
class TemplateRaised : public rlhf::Error {
 public:
  explicit TemplateRaised(const std::string& message) : rlhf::Error(message, "jinja") {}
};

/// Limits and the clock of one render.
struct RenderOptions {
  std::time_t now = 0;             // strftime_now's time (local time zone); 0: the current time
  int64_t max_steps = 50'000'000;  // evaluated nodes (plus 1 per 64 bytes of built strings)
  size_t max_output = size_t{64} << 20;  // bytes of rendered text
};

struct Parsed;

/// A parsed template; render() is const and may run concurrently from several threads.
class Template {
 public:
  /// Parses `source`. Throws rlhf::Error "line L, column C: <what> (near `...`)" for a syntax
  /// error or an unsupported construct.
  explicit Template(const std::string& source);
  ~Template();
  Template(const Template&) = delete;
  Template& operator=(const Template&) = delete;

  /// Renders with the variables of the JSON object `context` (and the globals range, namespace,
  /// dict, raise_exception, strftime_now, which the context's keys shadow). Throws TemplateRaised
  /// for raise_exception, rlhf::Error "line L, column C: <what>" for any other failure.
  std::string render(const Json& context, const RenderOptions& options = {}) const;

 private:
  std::unique_ptr<Parsed> parsed_;
};

}  // namespace rlhf::io::jinja
