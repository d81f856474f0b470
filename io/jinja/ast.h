// The syntax tree of a Jinja template (io/jinja): expressions and statements, each with the byte
// offset in the normalised source where it starts (for messages).
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "io/jinja/value.h"

namespace rlhf::io::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind {
    kLiteral,  // literal
    kList,     // [args...]
    kTuple,    // (args...,): a list at run time
    kDict,     // {args[0]: args[1], ...}
    kName,     // name
    kAttr,     // args[0].name
    kItem,     // args[0][args[1]]
    kSlice,    // args[0][args[1]:args[2]:args[3]] (null parts omitted)
    kCall,     // args[0](args[1:]..., kwargs...)
    kFilter,   // args[0] | name(args[1:]..., kwargs...)
    kTest,     // args[0] is [not] name(args[1:]...)
    kNot,      // not args[0]
    kNeg,      // -args[0]
    kPos,      // +args[0]
    kBinary,   // args[0] <name> args[1]: + - * / // % ** ~ == != < <= > >= in "not in"
    kAnd,      // args[0] and args[1]
    kOr,       // args[0] or args[1]
    kCond,     // args[0] if args[1] else args[2] (args[2] null: undefined)
  };
  Kind kind;
  size_t pos;
  Json literal;
  std::string name;
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  bool negated = false;  // kTest: "is not"
};

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

struct Stmt {
  enum class Kind {
    kText,      // text
    kOutput,    // {{ expr }}
    kIf,        // branches: (condition, body); a null condition is the else branch
    kFor,       // for targets in expr [if filter]: body [else: else_body]
    kSet,       // set targets = expr, or set targets[0].attr = expr (attr non-empty)
    kSetBlock,  // set targets[0] %}body{% endset
    kMacro,     // macro name(params = defaults): body
    kWith,      // with targets = values: body
    kScope,     // generation (transformers' AssistantTracker): body rendered as is
    kBreak,
    kContinue,
  };
  Kind kind;
  size_t pos;
  std::string text;                                // kText: the text; kMacro: the macro's name
  ExprPtr expr;                                    // kOutput, kFor (iterable), kSet (value)
  ExprPtr filter;                                  // kFor: the `if` condition
  std::vector<std::pair<ExprPtr, Body>> branches;  // kIf
  std::vector<std::string> targets;                // kFor, kSet, kSetBlock; kMacro params
  std::string attr;                                // kSet: namespace attribute
  std::vector<ExprPtr> values;                     // kMacro: defaults (null: none); kWith: values
  Body body, else_body;
};

}  // namespace rlhf::io::jinja
