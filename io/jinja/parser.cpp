#include "io/jinja/parser.h"

#include <fmt/format.h>

#include <charconv>
#include <cstdlib>
#include <set>

#include "io/jinja/builtins.h"

namespace rlhf::io::jinja {

namespace {

class Parser {
 public:
  Parser(const Source& src, const std::vector<Token>& tokens) : src_(src), t_(tokens) {}

  Body run() {
    Body body = parse_body({}, 0);
    if (peek().type != Tok::kEof) fail_here("unexpected tag");
    return body;
  }

 private:
  // --- token helpers -----------------------------------------------------------------------------
  const Token& peek(size_t ahead = 0) const { return t_[std::min(i_ + ahead, t_.size() - 1)]; }
  const Token& next() {
    const Token& t = peek();
    if (i_ < t_.size() - 1) ++i_;
    return t;
  }
  bool is_op(const char* op, size_t ahead = 0) const {
    return peek(ahead).type == Tok::kOp && peek(ahead).text == op;
  }
  bool is_name(const char* name, size_t ahead = 0) const {
    return peek(ahead).type == Tok::kName && peek(ahead).text == name;
  }
  [[noreturn]] void fail_here(const std::string& message) const {
    fail_at(src_, peek().pos, message);
  }
  std::string describe(const Token& t) const {
    switch (t.type) {
      case Tok::kEof:
        return "end of template";
      case Tok::kBlockEnd:
        return "end of tag '%}'";
      case Tok::kVarEnd:
        return "'}}'";
      case Tok::kData:
        return "text";
      default:
        return "'" + t.text + "'";
    }
  }
  void expect_op(const char* op) {
    if (!is_op(op)) fail_here(fmt::format("expected '{}', got {}", op, describe(peek())));
    next();
  }
  std::string expect_name(const char* what) {
    if (peek().type != Tok::kName)
      fail_here(fmt::format("expected {}, got {}", what, describe(peek())));
    return next().text;
  }
  void expect(Tok type, const char* what) {
    if (peek().type != type) fail_here(fmt::format("expected {}, got {}", what, describe(peek())));
    next();
  }

  struct DepthGuard {
    Parser& p;
    explicit DepthGuard(Parser& parser) : p(parser) {
      if (++p.depth_ > kMaxNesting)
        p.fail_here(fmt::format("the template nests deeper than {} levels", kMaxNesting));
    }
    ~DepthGuard() { --p.depth_; }
  };

  static ExprPtr make(Expr::Kind kind, size_t pos) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->pos = pos;
    return e;
  }
  static ExprPtr binary(Expr::Kind kind, const std::string& op, ExprPtr a, ExprPtr b) {
    auto e = make(kind, a->pos);
    e->name = op;
    e->args.push_back(std::move(a));
    e->args.push_back(std::move(b));
    return e;
  }

  // --- statements --------------------------------------------------------------------------------

  // Statements up to a block tag named in `stop` (left unconsumed) or the end of the template.
  Body parse_body(const std::set<std::string>& stop, size_t opened_at) {
    DepthGuard guard(*this);
    Body body;
    while (true) {
      const Token& t = peek();
      if (t.type == Tok::kEof) {
        if (!stop.empty())
          fail_at(src_, opened_at,
                  fmt::format("this block is never closed ({{% {} %}} missing)", *stop.rbegin()));
        return body;
      }
      if (t.type == Tok::kData) {
        auto s = std::make_unique<Stmt>();
        s->kind = Stmt::Kind::kText;
        s->pos = t.pos;
        s->text = t.text;
        body.push_back(std::move(s));
        next();
      } else if (t.type == Tok::kVarBegin) {
        auto s = std::make_unique<Stmt>();
        s->kind = Stmt::Kind::kOutput;
        s->pos = next().pos;
        s->expr = parse_expression();
        expect(Tok::kVarEnd, "'}}'");
        body.push_back(std::move(s));
      } else if (t.type == Tok::kBlockBegin) {
        if (peek(1).type == Tok::kName && stop.count(peek(1).text)) return body;
        body.push_back(parse_statement());
      } else {
        fail_here("unexpected " + describe(t));
      }
    }
  }

  // The end tag `{% name %}` of a block.
  void end_tag(const char* name) {
    expect(Tok::kBlockBegin, "'{%'");
    if (!is_name(name)) fail_here(fmt::format("expected {{% {} %}}", name));
    next();
    expect(Tok::kBlockEnd, "'%}'");
  }

  StmtPtr parse_statement() {
    const size_t pos = next().pos;  // {%
    const std::string tag = expect_name("a tag name");
    auto s = std::make_unique<Stmt>();
    s->pos = pos;
    if (tag == "if") {
      parse_if(*s);
    } else if (tag == "for") {
      parse_for(*s);
    } else if (tag == "set") {
      parse_set(*s);
    } else if (tag == "macro") {
      parse_macro(*s);
    } else if (tag == "with") {
      parse_with(*s);
    } else if (tag == "generation") {
      s->kind = Stmt::Kind::kScope;
      expect(Tok::kBlockEnd, "'%}'");
      s->body = parse_body({"endgeneration"}, pos);
      end_tag("endgeneration");
    } else if (tag == "break" || tag == "continue") {
      if (loop_depth_ == 0) fail_at(src_, pos, fmt::format("'{}' outside a for loop", tag));
      s->kind = tag == "break" ? Stmt::Kind::kBreak : Stmt::Kind::kContinue;
      expect(Tok::kBlockEnd, "'%}'");
    } else {
      static const std::set<std::string> kKnown = {"include",    "extends", "block",  "import",
                                                   "from",       "call",    "filter", "do",
                                                   "autoescape", "trans",   "raw"};
      fail_at(src_, pos,
              kKnown.count(tag) ? fmt::format("the '{}' tag is not supported", tag)
                                : fmt::format("unknown tag '{}'", tag));
    }
    return s;
  }

  void parse_if(Stmt& s) {
    s.kind = Stmt::Kind::kIf;
    ExprPtr cond = parse_expression();
    expect(Tok::kBlockEnd, "'%}'");
    while (true) {
      Body body = parse_body({"elif", "else", "endif"}, s.pos);
      s.branches.emplace_back(std::move(cond), std::move(body));
      next();  // {%
      const std::string kw = next().text;
      if (kw == "endif") break;
      if (kw == "elif") {
        cond = parse_expression();
      } else {
        cond = nullptr;
        expect(Tok::kBlockEnd, "'%}'");
        s.branches.emplace_back(nullptr, parse_body({"endif"}, s.pos));
        end_tag("endif");
        return;
      }
      expect(Tok::kBlockEnd, "'%}'");
    }
    expect(Tok::kBlockEnd, "'%}'");
  }

  std::vector<std::string> parse_targets() {
    std::vector<std::string> names;
    const bool paren = is_op("(");
    if (paren) next();
    do {
      names.push_back(expect_name("a variable name"));
    } while (is_op(",") && (next(), peek().type == Tok::kName));
    if (paren) expect_op(")");
    return names;
  }

  void parse_for(Stmt& s) {
    s.kind = Stmt::Kind::kFor;
    s.targets = parse_targets();
    if (!is_name("in")) fail_here("expected 'in' in the for loop");
    next();
    s.expr = parse_expression(/*with_condition=*/false);
    if (is_name("if")) {
      next();
      s.filter = parse_expression();
    }
    if (is_name("recursive")) fail_here("recursive for loops are not supported");
    expect(Tok::kBlockEnd, "'%}'");
    ++loop_depth_;
    s.body = parse_body({"else", "endfor"}, s.pos);
    --loop_depth_;
    if (is_name("else", 1)) {
      next();
      next();
      expect(Tok::kBlockEnd, "'%}'");
      s.else_body = parse_body({"endfor"}, s.pos);
    }
    end_tag("endfor");
  }

  void parse_set(Stmt& s) {
    s.kind = Stmt::Kind::kSet;
    if (peek().type == Tok::kName && is_op(".", 1)) {
      s.targets.push_back(next().text);
      next();
      s.attr = expect_name("an attribute name");
    } else {
      s.targets = parse_targets();
    }
    if (peek().type == Tok::kBlockEnd && s.attr.empty() && s.targets.size() == 1) {
      next();
      s.kind = Stmt::Kind::kSetBlock;
      s.body = parse_body({"endset"}, s.pos);
      end_tag("endset");
      return;
    }
    if (is_op("|")) fail_here("filters on a {% set %} block are not supported");
    expect_op("=");
    s.expr = parse_tuple_or_expression();
    expect(Tok::kBlockEnd, "'%}'");
  }

  void parse_macro(Stmt& s) {
    s.kind = Stmt::Kind::kMacro;
    s.text = expect_name("the macro's name");
    expect_op("(");
    while (!is_op(")")) {
      s.targets.push_back(expect_name("a parameter name"));
      if (is_op("=")) {
        next();
        s.values.push_back(parse_expression());
      } else {
        s.values.push_back(nullptr);
      }
      if (!is_op(",")) break;
      next();
    }
    expect_op(")");
    expect(Tok::kBlockEnd, "'%}'");
    const int saved = loop_depth_;
    loop_depth_ = 0;
    s.body = parse_body({"endmacro"}, s.pos);
    loop_depth_ = saved;
    end_tag("endmacro");
  }

  void parse_with(Stmt& s) {
    s.kind = Stmt::Kind::kWith;
    while (peek().type != Tok::kBlockEnd) {
      s.targets.push_back(expect_name("a variable name"));
      expect_op("=");
      s.values.push_back(parse_expression());
      if (!is_op(",")) break;
      next();
    }
    expect(Tok::kBlockEnd, "'%}'");
    s.body = parse_body({"endwith"}, s.pos);
    end_tag("endwith");
  }

  // --- expressions -------------------------------------------------------------------------------

  // `a, b` without brackets (a tuple), as {% set x = a, b %} allows.
  ExprPtr parse_tuple_or_expression() {
    ExprPtr first = parse_expression();
    if (!is_op(",")) return first;
    auto t = make(Expr::Kind::kTuple, first->pos);
    t->args.push_back(std::move(first));
    while (is_op(",")) {
      next();
      if (peek().type == Tok::kBlockEnd) break;
      t->args.push_back(parse_expression());
    }
    return t;
  }

  ExprPtr parse_expression(bool with_condition = true) {
    DepthGuard guard(*this);
    return with_condition ? parse_condition() : parse_or();
  }

  ExprPtr parse_condition() {
    ExprPtr e = parse_or();
    while (is_name("if")) {
      next();
      auto c = make(Expr::Kind::kCond, e->pos);
      c->args.push_back(std::move(e));
      c->args.push_back(parse_or());
      if (is_name("else")) {
        next();
        c->args.push_back(parse_condition());
      } else {
        c->args.push_back(nullptr);
      }
      e = std::move(c);
    }
    return e;
  }

  ExprPtr parse_or() {
    ExprPtr e = parse_and();
    while (is_name("or")) {
      next();
      e = binary(Expr::Kind::kOr, "or", std::move(e), parse_and());
    }
    return e;
  }

  ExprPtr parse_and() {
    ExprPtr e = parse_not();
    while (is_name("and")) {
      next();
      e = binary(Expr::Kind::kAnd, "and", std::move(e), parse_not());
    }
    return e;
  }

  ExprPtr parse_not() {
    if (is_name("not")) {
      DepthGuard guard(*this);
      auto e = make(Expr::Kind::kNot, next().pos);
      e->args.push_back(parse_not());
      return e;
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    ExprPtr e = parse_math1();
    bool compared = false;
    while (true) {
      std::string op;
      if (peek().type == Tok::kOp &&
          (peek().text == "==" || peek().text == "!=" || peek().text == "<" ||
           peek().text == "<=" || peek().text == ">" || peek().text == ">=")) {
        op = next().text;
      } else if (is_name("in")) {
        next();
        op = "in";
      } else if (is_name("not") && is_name("in", 1)) {
        next();
        next();
        op = "not in";
      } else {
        return e;
      }
      if (compared) fail_here("chained comparisons (a < b < c) are not supported");
      compared = true;
      e = binary(Expr::Kind::kBinary, op, std::move(e), parse_math1());
    }
  }

  ExprPtr parse_math1() {
    ExprPtr e = parse_concat();
    while (is_op("+") || is_op("-")) {
      const std::string op = next().text;
      e = binary(Expr::Kind::kBinary, op, std::move(e), parse_concat());
    }
    return e;
  }

  ExprPtr parse_concat() {
    ExprPtr e = parse_math2();
    while (is_op("~")) {
      next();
      e = binary(Expr::Kind::kBinary, "~", std::move(e), parse_math2());
    }
    return e;
  }

  ExprPtr parse_math2() {
    ExprPtr e = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const std::string op = next().text;
      e = binary(Expr::Kind::kBinary, op, std::move(e), parse_pow());
    }
    return e;
  }

  ExprPtr parse_pow() {
    ExprPtr e = parse_unary(true);
    while (is_op("**")) {
      next();
      e = binary(Expr::Kind::kBinary, "**", std::move(e), parse_unary(true));
    }
    return e;
  }

  ExprPtr parse_unary(bool with_filter) {
    DepthGuard guard(*this);
    ExprPtr e;
    if (is_op("-") || is_op("+")) {
      const Token& t = next();
      e = make(t.text == "-" ? Expr::Kind::kNeg : Expr::Kind::kPos, t.pos);
      e->args.push_back(parse_unary(false));
    } else {
      e = parse_primary();
    }
    e = parse_postfix(std::move(e));
    if (with_filter) e = parse_filters(std::move(e));
    return e;
  }

  ExprPtr parse_primary() {
    const Token& t = peek();
    switch (t.type) {
      case Tok::kName:
        return parse_name();
      case Tok::kString: {
        auto e = make(Expr::Kind::kLiteral, t.pos);
        std::string s;
        while (peek().type == Tok::kString) s += next().text;  // adjacent literals join
        e->literal = s;
        return e;
      }
      case Tok::kInt:
      case Tok::kFloat:
        return parse_number();
      case Tok::kOp:
        if (t.text == "(") return parse_paren();
        if (t.text == "[") return parse_list();
        if (t.text == "{") return parse_dict();
        break;
      default:
        break;
    }
    fail_here("expected an expression, got " + describe(t));
  }

  ExprPtr parse_name() {
    const Token& t = next();
    auto e = make(Expr::Kind::kLiteral, t.pos);
    if (t.text == "true" || t.text == "True") {
      e->literal = true;
    } else if (t.text == "false" || t.text == "False") {
      e->literal = false;
    } else if (t.text == "none" || t.text == "None") {
      e->literal = nullptr;
    } else {
      e->kind = Expr::Kind::kName;
      e->name = t.text;
    }
    return e;
  }

  ExprPtr parse_number() {
    const Token& t = next();
    auto e = make(Expr::Kind::kLiteral, t.pos);
    if (t.type == Tok::kFloat) {
      e->literal = std::strtod(t.text.c_str(), nullptr);  // 1e999 is inf, as in Python
      return e;
    }
    int64_t v = 0;
    auto r = std::from_chars(t.text.data(), t.text.data() + t.text.size(), v);
    if (r.ec != std::errc()) fail_at(src_, t.pos, "integer literal out of the 64-bit range");
    e->literal = v;
    return e;
  }

  ExprPtr parse_paren() {
    const size_t pos = next().pos;
    auto t = make(Expr::Kind::kTuple, pos);
    bool comma = false;
    while (!is_op(")")) {
      t->args.push_back(parse_expression());
      if (!is_op(",")) break;
      next();
      comma = true;
    }
    expect_op(")");
    if (t->args.size() == 1 && !comma) return std::move(t->args[0]);
    return t;
  }

  ExprPtr parse_list() {
    auto l = make(Expr::Kind::kList, next().pos);
    while (!is_op("]")) {
      l->args.push_back(parse_expression());
      if (!is_op(",")) break;
      next();
    }
    expect_op("]");
    return l;
  }

  ExprPtr parse_dict() {
    auto d = make(Expr::Kind::kDict, next().pos);
    while (!is_op("}")) {
      d->args.push_back(parse_expression());
      expect_op(":");
      d->args.push_back(parse_expression());
      if (!is_op(",")) break;
      next();
    }
    expect_op("}");
    return d;
  }

  ExprPtr parse_postfix(ExprPtr e) {
    while (true) {
      if (is_op(".")) {
        next();
        if (peek().type == Tok::kInt) {
          auto item = make(Expr::Kind::kItem, e->pos);
          item->args.push_back(std::move(e));
          item->args.push_back(parse_number());
          e = std::move(item);
          continue;
        }
        auto a = make(Expr::Kind::kAttr, e->pos);
        a->name = expect_name("an attribute name");
        a->args.push_back(std::move(e));
        e = std::move(a);
      } else if (is_op("[")) {
        e = parse_subscript(std::move(e));
      } else if (is_op("(")) {
        e = parse_call(std::move(e));
      } else {
        return e;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr e) {
    next();  // [
    ExprPtr parts[3];
    if (!is_op(":")) parts[0] = parse_expression();
    if (!is_op(":")) {
      expect_op("]");
      auto item = make(Expr::Kind::kItem, e->pos);
      item->args.push_back(std::move(e));
      item->args.push_back(std::move(parts[0]));
      return item;
    }
    next();  // first ':'
    if (!is_op("]") && !is_op(":")) parts[1] = parse_expression();
    if (is_op(":")) {
      next();
      if (!is_op("]")) parts[2] = parse_expression();
    }
    expect_op("]");
    auto s = make(Expr::Kind::kSlice, e->pos);
    s->args.push_back(std::move(e));
    for (auto& p : parts) s->args.push_back(std::move(p));
    return s;
  }

  // e(args...): a call of what e evaluates to (a macro, a method, a global function).
  ExprPtr parse_call(ExprPtr e) {
    auto c = make(Expr::Kind::kCall, e->pos);
    c->args.push_back(std::move(e));
    parse_call_args(*c);
    return c;
  }

  // (args..., name=value...) into e.args (after what is already there) and e.kwargs.
  void parse_call_args(Expr& e) {
    expect_op("(");
    while (!is_op(")")) {
      if (is_op("*") || is_op("**")) fail_here("*args and **kwargs in calls are not supported");
      if (peek().type == Tok::kName && is_op("=", 1)) {
        std::string key = next().text;
        next();
        e.kwargs.emplace_back(std::move(key), parse_expression());
      } else {
        if (!e.kwargs.empty()) fail_here("a positional argument after a keyword argument");
        e.args.push_back(parse_expression());
      }
      if (!is_op(",")) break;
      next();
    }
    expect_op(")");
  }

  ExprPtr parse_filters(ExprPtr e) {
    while (true) {
      if (is_op("|")) {
        next();
        const size_t pos = peek().pos;
        auto f = make(Expr::Kind::kFilter, pos);
        f->name = expect_name("a filter name");
        if (!is_filter(f->name)) fail_at(src_, pos, fmt::format("unknown filter '{}'", f->name));
        f->args.push_back(std::move(e));
        if (is_op("(")) parse_call_args(*f);
        e = std::move(f);
      } else if (is_name("is")) {
        e = parse_test(std::move(e));
      } else if (is_op("(")) {
        e = parse_call(std::move(e));
      } else {
        return e;
      }
    }
  }

  ExprPtr parse_test(ExprPtr e) {
    next();  // is
    auto t = make(Expr::Kind::kTest, peek().pos);
    if (is_name("not")) {
      next();
      t->negated = true;
    }
    const size_t pos = peek().pos;
    // Names that are also keywords (Jinja's tests "none", "true", "false", "in").
    if (peek().type != Tok::kName) fail_here("expected a test name, got " + describe(peek()));
    t->name = next().text;
    if (!is_test(t->name)) fail_at(src_, pos, fmt::format("unknown test '{}'", t->name));
    t->args.push_back(std::move(e));
    if (is_op("(")) {
      parse_call_args(*t);
    } else if ((peek().type == Tok::kName || peek().type == Tok::kString ||
                peek().type == Tok::kInt || peek().type == Tok::kFloat || is_op("(") ||
                is_op("[") || is_op("{")) &&
               !is_name("else") && !is_name("or") && !is_name("and")) {
      if (is_name("is")) fail_here("tests cannot be chained with 'is'");
      t->args.push_back(parse_postfix(parse_primary()));  // `x is divisibleby 3`
    }
    if (!t->kwargs.empty()) fail_at(src_, pos, "tests take no keyword arguments");
    return t;
  }

  const Source& src_;
  const std::vector<Token>& t_;
  size_t i_ = 0;
  int depth_ = 0;
  int loop_depth_ = 0;
};

}  // namespace

Body parse(const Source& src, const std::vector<Token>& tokens) {
  return Parser(src, tokens).run();
}

}  // namespace rlhf::io::jinja
