// Jinja parser (io/jinja): tokens → syntax tree, with Jinja2's grammar and operator precedence
// (jinja2/parser.py: `x if c else y` < or < and < not < comparisons and `in` < + - < ~ < * / // %
// < ** < unary - + < postfix . [] () and the filters `|` and tests `is`, which bind tightest).
#pragma once

#include <vector>

#include "io/jinja/ast.h"
#include "io/jinja/lexer.h"

namespace rlhf::io::jinja {

/// The deepest nesting of expressions and blocks a template may have (a bound on the parser's and
/// the evaluator's recursion, for untrusted templates).
inline constexpr int kMaxNesting = 200;

/// Parses the tokens of `src` (from tokenize). Throws Failure (located: line and column) for a
/// syntax error, an unknown filter or test (as Jinja does when it compiles), and any tag or syntax
/// this engine does not support (include, extends, block, import, call, filter blocks, recursive
/// loops, *args).
Body parse(const Source& src, const std::vector<Token>& tokens);

}  // namespace rlhf::io::jinja
