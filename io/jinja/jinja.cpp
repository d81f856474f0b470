#include "io/jinja/jinja.h"

#include <fmt/format.h>

#include <unordered_map>

#include "io/jinja/ast.h"
#include "io/jinja/builtins.h"
#include "io/jinja/lexer.h"
#include "io/jinja/parser.h"

namespace rlhf::io::jinja {

struct Parsed {
  explicit Parsed(const std::string& text) : src(text) {}
  Source src;
  Body body;
};

namespace {

// The data of `v` for a list, dict or namespace; throws Failure for the other kinds.
Json to_data(const Value& v, const char* where) {
  if (v.is_data() && !v.generator) return v.data;
  if (v.is_undefined())
    fail(fmt::format("'{}' is undefined (in {})", v.name.empty() ? "value" : v.name, where));
  fail(fmt::format("a {} cannot be stored in {} (not supported)", type_name(v), where));
}

// The items a for loop visits: list elements, dict keys, string characters; none for Undefined.
std::vector<Value> iteration_items(const Value& v) {
  std::vector<Value> items;
  if (v.is_undefined()) return items;
  if (!v.is_data()) fail(fmt::format("'{}' object is not iterable", type_name(v)));
  const Json& j = v.generator ? generator_items(v) : v.data;
  if (j.is_array()) {
    for (const Json& e : j) items.emplace_back(e);
  } else if (j.is_object()) {
    for (auto it = j.begin(); it != j.end(); ++it) items.emplace_back(Json(it.key()));
  } else if (j.is_string()) {
    const std::string& s = j.get_ref<const std::string&>();
    const std::vector<size_t> cp = code_points(s);
    for (size_t i = 0; i + 1 < cp.size(); ++i)
      items.emplace_back(Json(s.substr(cp[i], cp[i + 1] - cp[i])));
  } else {
    fail(fmt::format("'{}' object is not iterable", type_name(v)));
  }
  return items;
}

class Renderer {
 public:
  Renderer(const Source& src, const RenderOptions& o) : src_(src), o_(o), steps_(o.max_steps) {}

  std::string render(const Body& body, const Json& context) {
    scopes_.resize(2);  // globals, the template's own variables
    for (auto& [name, fn] : global_functions(o_.now)) scopes_[0][name] = fn;
    if (!context.is_object()) fail("the template context must be a JSON object");
    for (auto it = context.begin(); it != context.end(); ++it)
      scopes_[0][it.key()] = Value(it.value());
    std::string out;
    exec(body, out);
    return out;
  }

 private:
  enum class Flow { kNormal, kBreak, kContinue };
  using Scope = std::unordered_map<std::string, Value>;

  // --- bookkeeping -------------------------------------------------------------------------------

  void step(int64_t n = 1) {
    steps_ -= n;
    if (steps_ < 0)
      fail(fmt::format("the template took more than {} steps (a runaway loop?)", o_.max_steps));
  }

  void emit(std::string& out, const std::string& text) {
    step(static_cast<int64_t>(text.size() / 64));
    if (out.size() + text.size() > o_.max_output)
      fail(fmt::format("the rendered text exceeds {} bytes", o_.max_output));
    out += text;
  }

  template <typename F>
  auto at(size_t pos, F&& f) -> decltype(f()) {
    try {
      return f();
    } catch (Failure& e) {
      if (!e.located) fail_at(src_, pos, e.what());
      throw;
    } catch (const nlohmann::json::exception& e) {  // a type this engine did not expect
      fail_at(src_, pos, fmt::format("unsupported value ({})", e.what()));
    }
  }

  const Value* find(const std::string& name) const {
    for (size_t i = scopes_.size(); i-- > frame_;) {
      auto it = scopes_[i].find(name);
      if (it != scopes_[i].end()) return &it->second;
    }
    for (size_t i : {size_t{1}, size_t{0}}) {
      if (i >= frame_) continue;
      auto it = scopes_[i].find(name);
      if (it != scopes_[i].end()) return &it->second;
    }
    return nullptr;
  }

  void assign(const std::string& name, Value v) { scopes_.back()[name] = std::move(v); }

  void bind(const std::vector<std::string>& targets, const Value& v) {
    if (targets.size() == 1) {
      assign(targets[0], v);
      return;
    }
    const std::vector<Value> items = iteration_items(v);
    if (v.is_undefined() || v.data.is_object() || items.size() != targets.size())
      fail(fmt::format("cannot unpack {} into {} names", repr(to_data(v, "an unpacking")),
                       targets.size()));
    for (size_t i = 0; i < targets.size(); ++i) assign(targets[i], items[i]);
  }

  // --- statements --------------------------------------------------------------------------------

  Flow exec(const Body& body, std::string& out) {
    for (const StmtPtr& s : body) {
      const Flow f = at(s->pos, [&] { return exec_stmt(*s, out); });
      if (f != Flow::kNormal) return f;
    }
    return Flow::kNormal;
  }

  Flow exec_stmt(const Stmt& s, std::string& out) {
    step();
    switch (s.kind) {
      case Stmt::Kind::kText:
        emit(out, s.text);
        return Flow::kNormal;
      case Stmt::Kind::kOutput:
        emit(out, to_str(eval(*s.expr)));
        return Flow::kNormal;
      case Stmt::Kind::kIf:
        for (const auto& [cond, body] : s.branches)
          if (!cond || truthy(eval(*cond))) return exec(body, out);
        return Flow::kNormal;
      case Stmt::Kind::kFor:
        exec_for(s, out);
        return Flow::kNormal;
      case Stmt::Kind::kSet:
        exec_set(s);
        return Flow::kNormal;
      case Stmt::Kind::kSetBlock: {
        std::string text;
        exec_scoped(s.body, text);
        assign(s.targets[0], Value(Json(std::move(text))));
        return Flow::kNormal;
      }
      case Stmt::Kind::kMacro:
        define_macro(s);
        return Flow::kNormal;
      case Stmt::Kind::kWith: {
        Scope scope;
        for (size_t i = 0; i < s.targets.size(); ++i) scope[s.targets[i]] = eval(*s.values[i]);
        scopes_.push_back(std::move(scope));
        const Flow f = exec(s.body, out);
        scopes_.pop_back();
        return f;
      }
      case Stmt::Kind::kScope:
        return exec_scoped(s.body, out);
      case Stmt::Kind::kBreak:
        return Flow::kBreak;
      case Stmt::Kind::kContinue:
        return Flow::kContinue;
    }
    return Flow::kNormal;
  }

  Flow exec_scoped(const Body& body, std::string& out) {
    scopes_.emplace_back();
    const Flow f = exec(body, out);
    scopes_.pop_back();
    return f;
  }

  void exec_set(const Stmt& s) {
    Value v = eval(*s.expr);
    if (s.attr.empty()) {
      bind(s.targets, v);
      return;
    }
    const Value* ns = find(s.targets[0]);
    if (!ns || ns->kind != Value::Kind::kNamespace)
      fail(fmt::format("cannot assign attribute '{}' on '{}': not a namespace()", s.attr,
                       s.targets[0]));
    if (s.attr.starts_with("_"))
      fail(fmt::format("namespace attributes cannot start with '_' (got '{}')", s.attr));
    (*ns->ns)[s.attr] = to_data(v, "a namespace attribute");
  }

  void exec_for(const Stmt& s, std::string& out) {
    std::vector<Value> items = iteration_items(eval(*s.expr));
    scopes_.emplace_back();
    if (s.filter) {  // `for x in xs if cond`: the loop sees the items that pass
      std::vector<Value> kept;
      for (Value& item : items) {
        scopes_.back().clear();
        bind(s.targets, item);
        if (truthy(eval(*s.filter))) kept.push_back(std::move(item));
      }
      items = std::move(kept);
    }
    const size_t n = items.size();
    for (size_t i = 0; i < n; ++i) {
      step();
      Scope& scope = scopes_.back();
      scope.clear();  // each iteration starts afresh, as in Jinja
      Json loop = {
          {"index", i + 1},  {"index0", i},        {"revindex", n - i}, {"revindex0", n - i - 1},
          {"first", i == 0}, {"last", i + 1 == n}, {"length", n},       {"depth", 1},
          {"depth0", 0}};
      if (i > 0 && items[i - 1].is_data()) loop["previtem"] = items[i - 1].data;
      if (i + 1 < n && items[i + 1].is_data()) loop["nextitem"] = items[i + 1].data;
      scope["loop"] = Value(std::move(loop));
      bind(s.targets, items[i]);
      if (exec(s.body, out) == Flow::kBreak) break;
    }
    scopes_.back().clear();
    if (n == 0) exec(s.else_body, out);
    scopes_.pop_back();
  }

  void define_macro(const Stmt& s) {
    const Stmt* m = &s;
    assign(s.text,
           Value::function(s.text, [this, m](const std::vector<Value>& args, const Kwargs& kwargs) {
             return Value(Json(call_macro(*m, args, kwargs)));
           }));
  }

  std::string call_macro(const Stmt& m, const std::vector<Value>& args, const Kwargs& kwargs) {
    if (args.size() > m.targets.size())
      fail(fmt::format("macro '{}' takes {} arguments, got {}", m.text, m.targets.size(),
                       args.size()));
    if (++macro_depth_ > 64) fail("macros nest deeper than 64 calls");
    Scope scope;
    for (size_t i = 0; i < m.targets.size(); ++i) {
      if (i < args.size()) {
        scope[m.targets[i]] = args[i];
      } else if (m.values[i]) {
        scope[m.targets[i]] = eval(*m.values[i]);
      } else {
        scope[m.targets[i]] = Value::undefined(m.targets[i]);
      }
    }
    for (const auto& [key, v] : kwargs) {
      auto it = std::find(m.targets.begin(), m.targets.end(), key);
      if (it == m.targets.end()) fail(fmt::format("macro '{}' has no parameter '{}'", m.text, key));
      scope[key] = v;
    }
    const size_t saved_frame = frame_;
    scopes_.push_back(std::move(scope));
    frame_ = scopes_.size() - 1;
    std::string out;
    try {
      exec(m.body, out);
    } catch (...) {
      scopes_.resize(frame_);
      frame_ = saved_frame;
      --macro_depth_;
      throw;
    }
    scopes_.resize(frame_);
    frame_ = saved_frame;
    --macro_depth_;
    return out;
  }

  // --- expressions -------------------------------------------------------------------------------

  Value eval(const Expr& e) {
    return at(e.pos, [&] { return eval_node(e); });
  }

  Value eval_node(const Expr& e) {
    step();
    switch (e.kind) {
      case Expr::Kind::kLiteral:
        return Value(e.literal);
      case Expr::Kind::kName: {
        const Value* v = find(e.name);
        return v ? *v : Value::undefined(e.name);
      }
      case Expr::Kind::kList:
      case Expr::Kind::kTuple: {
        Json list = Json::array();
        for (const ExprPtr& a : e.args) list.push_back(to_data(eval(*a), "a list"));
        Value v(std::move(list));
        v.tuple = e.kind == Expr::Kind::kTuple;
        return v;
      }
      case Expr::Kind::kDict:
        return eval_dict(e);
      case Expr::Kind::kAttr:
        return get_attr(eval(*e.args[0]), e.name);
      case Expr::Kind::kItem:
        return get_item(eval(*e.args[0]), eval(*e.args[1]));
      case Expr::Kind::kSlice: {
        auto part = [&](size_t i) { return e.args[i] ? eval(*e.args[i]) : Value(); };
        return get_slice(eval(*e.args[0]), part(1), part(2), part(3));
      }
      case Expr::Kind::kCall:
        return eval_call(e);
      case Expr::Kind::kFilter: {
        Value base = eval(*e.args[0]);
        std::vector<Value> args;
        Kwargs kwargs;
        eval_args(e, args, kwargs);
        return apply_filter(e.name, base, args, kwargs);
      }
      case Expr::Kind::kTest: {
        Value v = eval(*e.args[0]);
        std::vector<Value> args;
        Kwargs kwargs;
        eval_args(e, args, kwargs);
        return Value(Json(apply_test(e.name, v, args) != e.negated));
      }
      case Expr::Kind::kNot:
        return Value(Json(!truthy(eval(*e.args[0]))));
      case Expr::Kind::kNeg:
      case Expr::Kind::kPos:
        return unary_op(e.kind == Expr::Kind::kNeg, eval(*e.args[0]));
      case Expr::Kind::kBinary: {
        Value r = binary_op(e.name, eval(*e.args[0]), eval(*e.args[1]));
        if (r.is_string())
          step(static_cast<int64_t>(r.data.get_ref<const std::string&>().size() / 64));
        return r;
      }
      case Expr::Kind::kAnd: {
        Value a = eval(*e.args[0]);
        return truthy(a) ? eval(*e.args[1]) : a;
      }
      case Expr::Kind::kOr: {
        Value a = eval(*e.args[0]);
        return truthy(a) ? a : eval(*e.args[1]);
      }
      case Expr::Kind::kCond:
        if (truthy(eval(*e.args[1]))) return eval(*e.args[0]);
        return e.args[2] ? eval(*e.args[2]) : Value::undefined("the else branch");
    }
    return Value();
  }

  Value eval_dict(const Expr& e) {
    Json d = Json::object();
    for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
      Value k = eval(*e.args[i]);
      if (!k.is_string()) fail("dict keys other than strings are not supported");
      d[k.data.get<std::string>()] = to_data(eval(*e.args[i + 1]), "a dict");
    }
    return Value(std::move(d));
  }

  // Positional arguments after args[0] and the keyword arguments of a call, filter or test.
  void eval_args(const Expr& e, std::vector<Value>& args, Kwargs& kwargs) {
    for (size_t i = 1; i < e.args.size(); ++i) args.push_back(eval(*e.args[i]));
    for (const auto& [key, x] : e.kwargs) kwargs.emplace_back(key, eval(*x));
  }

  Value eval_call(const Expr& e) {
    const Value callee = eval(*e.args[0]);
    if (callee.kind != Value::Kind::kFunction) {
      if (callee.is_undefined())
        fail(fmt::format("'{}' is undefined (not a known function)", callee.name));
      fail(fmt::format("a {} is not callable", type_name(callee)));
    }
    std::vector<Value> args;
    Kwargs kwargs;
    eval_args(e, args, kwargs);
    return (*callee.fn)(args, kwargs);
  }

  const Source& src_;
  const RenderOptions& o_;
  int64_t steps_;
  std::vector<Scope> scopes_;
  size_t frame_ = 0;  // scopes below this index (other than 0 and 1) are hidden: a macro's frame
  int macro_depth_ = 0;
};

}  // namespace

Template::Template(const std::string& source) : parsed_(std::make_unique<Parsed>(source)) {
  try {
    parsed_->body = parse(parsed_->src, tokenize(parsed_->src));
  } catch (const Failure& f) {
    throw rlhf::Error(f.what(), "jinja");
  }
}

Template::~Template() = default;

std::string Template::render(const Json& context, const RenderOptions& options) const {
  RenderOptions o = options;
  if (o.now == 0) o.now = std::time(nullptr);
  try {
    return Renderer(parsed_->src, o).render(parsed_->body, context);
  } catch (const Raised& r) {
    throw TemplateRaised(r.what());
  } catch (const Failure& f) {
    throw rlhf::Error(f.what(), "jinja");
  }
}

}  // namespace rlhf::io::jinja
