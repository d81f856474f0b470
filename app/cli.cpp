#include "app/cli.h"
#include "app/openrlhf_names.h"
#include "app/trl_names.h"

#include <toml++/toml.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <tuple>
#include <type_traits>
#include <utility>

#include "core/log.h"

namespace rlhf::app {

namespace {

/// The numbers inside a value (one for scalars, two for adam_betas, none for strings/bools).
std::vector<double> numbers_of(const OptionValue& v) {
  return std::visit(
      [](const auto& x) -> std::vector<double> {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, int> || std::is_same_v<T, int64_t> ||
                      std::is_same_v<T, double>) {
          return {static_cast<double>(x)};
        } else if constexpr (std::is_same_v<T, std::array<double, 2>>) {
          return {x[0], x[1]};
        } else {
          return {};
        }
      },
      v);
}

/// A check on every number of the value: fails with "must be <text>".
Check numeric_check(std::string text, std::function<bool(double)> ok) {
  Check c;
  c.text = text;
  c.fn = [text, ok = std::move(ok)](const OptionValue& v) -> std::string {
    for (double x : numbers_of(v))
      if (!ok(x)) return fmt::format("must be {}", text);
    return "";
  };
  return c;
}

/// Edit distance with adjacent transpositions (optimal string alignment), for "did you mean".
size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    for (size_t j = 1; j <= b.size(); ++j) {
      d[i][j] = std::min(
          {d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] != b[j - 1] ? 1 : 0)});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  }
  return d[a.size()][b.size()];
}

/// "\nhint: did you mean '<prefix><best>'?" when some candidate is close to `word`, else "".
std::string did_you_mean(const std::string& word, const std::vector<std::string>& candidates,
                         const std::string& prefix = "") {
  const std::string* best = nullptr;
  size_t best_d = std::numeric_limits<size_t>::max();
  for (const std::string& c : candidates) {
    size_t d = edit_distance(word, c);
    if (d < best_d) best_d = d, best = &c;
  }
  if (best == nullptr || best_d > std::max<size_t>(1, word.size() / 3)) return "";
  return fmt::format("\nhint: did you mean '{}{}'?", prefix, *best);
}

/// The alternatives of OptionSpec::target, by index.
enum Kind : size_t { kBool, kInt, kInt64, kDouble, kString, kPair };
using Target = decltype(OptionSpec::target);
static_assert(std::is_same_v<std::variant_alternative_t<kBool, Target>, bool*> &&
              std::is_same_v<std::variant_alternative_t<kInt, Target>, int*> &&
              std::is_same_v<std::variant_alternative_t<kInt64, Target>, int64_t*> &&
              std::is_same_v<std::variant_alternative_t<kDouble, Target>, double*> &&
              std::is_same_v<std::variant_alternative_t<kString, Target>, std::string*> &&
              std::is_same_v<std::variant_alternative_t<kPair, Target>, std::array<double, 2>*>);

const char* describe_kind(size_t kind) {
  switch (kind) {
    case kBool:
      return "true or false";
    case kInt:
    case kInt64:
      return "an integer";
    case kDouble:
      return "a number";
    case kString:
      return "a string";
    default:
      return "an array of 2 numbers";
  }
}

/// A short rendering of a TOML value for messages: 'text', 51.2, true, [0.9, 0.95], a table.
std::string render_node(const toml::node& n) {
  if (auto x = n.as_string()) return fmt::format("'{}'", x->get());
  if (auto x = n.as_integer()) return fmt::format("{}", x->get());
  if (auto x = n.as_floating_point()) return fmt::format("{}", x->get());
  if (auto x = n.as_boolean()) return x->get() ? "true" : "false";
  if (auto x = n.as_array()) {
    std::vector<std::string> items;
    for (const toml::node& e : *x) items.push_back(render_node(e));
    return fmt::format("[{}]", fmt::join(items, ", "));
  }
  if (n.is_table()) return "{...}";
  std::ostringstream os;
  n.visit([&](const auto& v) { os << v; });
  return os.str();
}

/// "a float (51.2)", "a table", ... for type errors.
std::string describe_node(const toml::node& n) {
  const char* kind = "a date/time";
  switch (n.type()) {
    case toml::node_type::table:
      return "a table";
    case toml::node_type::array:
      kind = "an array";
      break;
    case toml::node_type::string:
      kind = "a string";
      break;
    case toml::node_type::integer:
      kind = "an integer";
      break;
    case toml::node_type::floating_point:
      kind = "a float";
      break;
    case toml::node_type::boolean:
      kind = "a boolean";
      break;
    default:
      break;
  }
  return fmt::format("{} ({})", kind, render_node(n));
}

std::string location(const std::string& file, const toml::source_region& src) {
  if (src.begin.line == 0) return file;
  return fmt::format("{}:{}:{}", file, src.begin.line, src.begin.column);
}

/// Converts a TOML value to an option of `kind` (OptionSpec::target's index). Strict: a float is
/// not an integer, an integer is a number. Returns the value, or the reason it does not fit.
std::variant<OptionValue, std::string> value_from_toml(const toml::node& n, size_t kind) {
  auto number = [](const toml::node& x) -> std::optional<double> {
    if (auto i = x.as_integer()) return static_cast<double>(i->get());
    if (auto f = x.as_floating_point()) return f->get();
    return std::nullopt;
  };
  switch (kind) {
    case kBool:
      if (auto b = n.as_boolean()) return OptionValue{b->get()};
      break;
    case kInt:
      if (auto i = n.as_integer()) {
        int64_t v = i->get();
        if (v < std::numeric_limits<int>::min() || v > std::numeric_limits<int>::max())
          return fmt::format("{} is out of range for a 32-bit integer", v);
        return OptionValue{static_cast<int>(v)};
      }
      break;
    case kInt64:
      if (auto i = n.as_integer()) return OptionValue{static_cast<int64_t>(i->get())};
      break;
    case kDouble:
      if (auto x = number(n)) return OptionValue{*x};
      break;
    case kString:
      if (auto s = n.as_string()) return OptionValue{s->get()};
      break;
    case kPair:
      if (auto a = n.as_array(); a && a->size() == 2) {
        auto x0 = number(*a->get(0)), x1 = number(*a->get(1));
        if (x0 && x1) return OptionValue{std::array<double, 2>{*x0, *x1}};
      }
      break;
  }
  std::string why = fmt::format("expected {}, got {}", describe_kind(kind), describe_node(n));
  if (auto f = n.as_floating_point(); f && (kind == kInt || kind == kInt64) &&
                                      std::isfinite(f->get()) && f->get() == std::trunc(f->get()))
    why +=
        fmt::format("\nhint: write integers without a decimal point or exponent: {:.0f}", f->get());
  return why;
}

/// Converts an environment variable's text to an option of `kind`: the value, or the reason.
std::variant<OptionValue, std::string> value_from_text(const std::string& s, size_t kind) {
  auto parse_int = [&](int64_t& out) {
    const char* end = s.data() + s.size();
    auto [p, ec] = std::from_chars(s.data(), end, out);
    return ec == std::errc() && p == end && !s.empty();
  };
  auto parse_double = [](const std::string& t, double& out) {
    char* end = nullptr;
    out = std::strtod(t.c_str(), &end);
    return !t.empty() && end == t.c_str() + t.size();
  };
  int64_t i = 0;
  double d = 0;
  switch (kind) {
    case kBool:
      if (s == "true" || s == "1") return OptionValue{true};
      if (s == "false" || s == "0") return OptionValue{false};
      break;
    case kInt:
      if (parse_int(i) && i >= std::numeric_limits<int>::min() &&
          i <= std::numeric_limits<int>::max())
        return OptionValue{static_cast<int>(i)};
      break;
    case kInt64:
      if (parse_int(i)) return OptionValue{i};
      break;
    case kDouble:
      if (parse_double(s, d)) return OptionValue{d};
      break;
    case kString:
      return OptionValue{s};
    case kPair: {
      std::istringstream is(s);
      std::string a, b, extra;
      double x0 = 0, x1 = 0;
      if (is >> a >> b && !(is >> extra) && parse_double(a, x0) && parse_double(b, x1))
        return OptionValue{std::array<double, 2>{x0, x1}};
      break;
    }
  }
  return fmt::format("expected {}, got '{}'", describe_kind(kind), s);
}

/// Stores `v` (of the target's own type) into the bound field.
void assign(OptionSpec& spec, const OptionValue& v) {
  std::visit(
      [&](auto* field) {
        using T = std::remove_pointer_t<decltype(field)>;
        *field = std::get<T>(v);
      },
      spec.target);
}

/// CLI11 formatter that also shows a flag's default ("--adam_offload=false").
class Formatter : public CLI::Formatter {
 public:
  std::string make_option_opts(const CLI::Option* opt) const override {
    std::string s = CLI::Formatter::make_option_opts(opt);
    if (opt->get_type_size() == 0 && !opt->get_default_str().empty())
      s = "=" + opt->get_default_str() + s;
    return s;
  }
};

}  // namespace

// -------------------------------------------------------------------------------------------------
// Checks

Check gt(double v) {
  return numeric_check(fmt::format("> {}", v), [v](double x) { return x > v; });
}
Check ge(double v) {
  return numeric_check(fmt::format(">= {}", v), [v](double x) { return x >= v; });
}
Check le(double v) {
  return numeric_check(fmt::format("<= {}", v), [v](double x) { return x <= v; });
}
Check below(double v) {
  return numeric_check(fmt::format("< {}", v), [v](double x) { return x < v; });
}
Check range(double lo, double hi) {
  return numeric_check(fmt::format("{}..{}", lo, hi),
                       [lo, hi](double x) { return x >= lo && x <= hi; });
}
Check minus_one_or_ge(int64_t v) {
  return numeric_check(fmt::format("-1 or >= {}", v),
                       [v](double x) { return x == -1 || x >= static_cast<double>(v); });
}
Check one_of_int(std::vector<int64_t> allowed) {
  return numeric_check(fmt::format("{}", fmt::join(allowed, "|")), [allowed](double x) {
    return std::any_of(allowed.begin(), allowed.end(),
                       [x](int64_t a) { return static_cast<double>(a) == x; });
  });
}
Check one_of(std::vector<std::string> allowed) {
  Check c;
  c.text = fmt::format("{}", fmt::join(allowed, "|"));
  c.fn = [allowed](const OptionValue& v) -> std::string {
    const auto* s = std::get_if<std::string>(&v);
    if (s == nullptr || std::find(allowed.begin(), allowed.end(), *s) != allowed.end()) return "";
    return fmt::format("must be one of {}", fmt::join(allowed, ", "));
  };
  return c;
}

// -------------------------------------------------------------------------------------------------
// OptionSpec / OptionSet

OptionSpec& OptionSpec::check(Check c) {
  checks.push_back(std::move(c));
  return *this;
}

OptionSpec& OptionSpec::required() {
  RLHF_ASSERT(std::holds_alternative<std::string*>(target));
  is_required = true;
  return *this;
}

OptionSpec& OptionSpec::env(std::string name) {
  env_name = std::move(name);
  return *this;
}

OptionSpec& OptionSpec::alias(const std::string& name) {
  RLHF_ASSERT(app != nullptr);
  std::visit(
      [&](auto* field) {
        using T = std::remove_pointer_t<decltype(field)>;
        CLI::Option* o = nullptr;
        if constexpr (std::is_same_v<T, bool>) {
          o = app->add_flag("--" + name, *field, description);
        } else {
          o = app->add_option("--" + name, *field, description);
          if constexpr (!std::is_same_v<T, std::array<double, 2>>)
            o->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
        }
        o->group("");  // hidden: the description of the main name mentions it
        alias_cli.push_back(o);
      },
      target);
  aliases.push_back(name);
  return *this;
}

OptionSpec& OptionSpec::implicit(std::string value) {
  implicit_value = std::move(value);
  return *this;
}

OptionValue OptionSpec::value() const {
  return std::visit([](auto* field) { return OptionValue{*field}; }, target);
}

OptionSet::OptionSet(CLI::App* app, std::string command)
    : app_(app), command_(std::move(command)) {}

void OptionSet::ignore(const std::string& name, int nargs, std::string note) {
  Ignored& ig = ignored_.emplace_back();
  ig.name = name;
  ig.note = std::move(note);
  ig.nargs = nargs;
  if (nargs == 0) {
    ig.cli = app_->add_flag("--" + name, ig.flag, ig.note);
  } else {
    ig.cli = app_->add_option("--" + name, ig.values, ig.note)->expected(nargs);
    ig.cli->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  }
  ig.cli->group("");  // hidden: docs/migrating.md lists them
}

const OptionSpec* OptionSet::find(const std::string& key) const {
  for (const OptionSpec& s : specs_)
    if (s.key == key) return &s;
  return nullptr;
}

template <class T>
OptionSpec& OptionSet::add(const std::string& key, T& field, std::string description) {
  RLHF_ASSERT(find(key) == nullptr);
  OptionSpec& spec = specs_.emplace_back();
  spec.key = key;
  spec.description = std::move(description);
  spec.target = &field;
  spec.app = app_;
  const std::string flag = "--" + key;
  if constexpr (std::is_same_v<T, bool>) {
    spec.cli = app_->add_flag(flag, field, spec.description);
    spec.cli->default_str(field ? "true" : "false");
  } else {
    spec.cli = app_->add_option(flag, field, spec.description)->capture_default_str();
    if constexpr (!std::is_same_v<T, std::array<double, 2>>)
      spec.cli->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);  // argparse: last wins
  }
  return spec;
}

template OptionSpec& OptionSet::add<bool>(const std::string&, bool&, std::string);
template OptionSpec& OptionSet::add<int>(const std::string&, int&, std::string);
template OptionSpec& OptionSet::add<int64_t>(const std::string&, int64_t&, std::string);
template OptionSpec& OptionSet::add<double>(const std::string&, double&, std::string);
template OptionSpec& OptionSet::add<std::string>(const std::string&, std::string&, std::string);
template OptionSpec& OptionSet::add<std::array<double, 2>>(const std::string&,
                                                           std::array<double, 2>&, std::string);

// -------------------------------------------------------------------------------------------------
// Parsing

std::string to_string(const OptionValue& v) {
  return std::visit(
      [](const auto& x) -> std::string {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, bool>) {
          return x ? "true" : "false";
        } else if constexpr (std::is_same_v<T, std::string>) {
          return x.empty() ? "\"\"" : x;
        } else if constexpr (std::is_same_v<T, std::array<double, 2>>) {
          return fmt::format("{} {}", x[0], x[1]);
        } else {
          return fmt::format("{}", x);
        }
      },
      v);
}

std::string version_string() {
#ifdef RLHF_CUDA
  const char* backend = "CUDA";
#else
  const char* backend = "CPU only";
#endif
  return fmt::format("rlhf {} ({})", RLHF_VERSION, backend);
}

const CommonArgs& ParsedCommand::common() const {
  return std::visit([](const auto& a) -> const CommonArgs& { return a.common; }, args);
}

namespace {

/// Applies the `--config` file to the options not given on the command line.
void merge_toml(OptionSet& set, const std::string& path) {
  if (!std::filesystem::is_regular_file(path)) usage_fail("--config {}: no such file", path);
  toml::table root;
  try {
    root = toml::parse_file(path);
  } catch (const toml::parse_error& e) {
    usage_fail("{}: TOML syntax error: {}", location(path, e.source()), e.description());
  }
  std::vector<std::string> keys;
  for (const OptionSpec& s : set.specs()) keys.push_back(s.key);

  // Dotted names (OpenRLHF's `actor.adam.lr = 5e-7`) are nested tables in TOML: flatten them.
  std::vector<std::tuple<std::string, const toml::key*, const toml::node*>> entries;
  auto flatten = [&](auto&& self, const toml::table& t, const std::string& prefix) -> void {
    for (auto&& [k, node] : t) {
      const std::string name = prefix + std::string(k.str());
      if (const toml::table* sub = node.as_table(); sub != nullptr && set.find(name) == nullptr)
        self(self, *sub, name + ".");
      else
        entries.emplace_back(name, &k, &node);
    }
  };
  flatten(flatten, root, "");
  for (auto&& [key, kp, np] : entries) {
    const toml::key& k = *kp;
    const toml::node& node = *np;
    const std::string where = location(path, k.source().begin.line ? k.source() : node.source());
    if (key == "config") usage_fail("{}: 'config' cannot be set inside a config file", where);
    OptionSpec* spec = nullptr;
    for (OptionSpec& s : set.specs())
      if (s.key == key || std::find(s.aliases.begin(), s.aliases.end(), key) != s.aliases.end())
        spec = &s;
    if (spec == nullptr) {
      const std::string peer = openrlhf_hint(key, set);
      usage_fail("{}: unknown key '{}' for `rlhf {}`{}", where, key, set.command(),
                 !peer.empty() ? peer : did_you_mean(key, keys));
    }
    auto converted = value_from_toml(node, spec->target.index());
    if (auto* err = std::get_if<std::string>(&converted))
      usage_fail("{}: key '{}': {}", location(path, node.source()), key, *err);
    if (spec->source == OptionSource::kCommandLine) continue;  // the flag wins
    assign(*spec, std::get<OptionValue>(converted));
    spec->source = OptionSource::kConfigFile;
    spec->origin = location(path, node.source());
  }
}

/// Reads options that name an environment variable and are still at their default.
void merge_env(OptionSet& set) {
  for (OptionSpec& spec : set.specs()) {
    if (spec.env_name.empty() || spec.source != OptionSource::kDefault) continue;
    const char* text = std::getenv(spec.env_name.c_str());
    if (text == nullptr || *text == '\0') continue;
    auto converted = value_from_text(text, spec.target.index());
    if (auto* err = std::get_if<std::string>(&converted))
      usage_fail("environment variable {} (for --{}): {}", spec.env_name, spec.key, *err);
    assign(spec, std::get<OptionValue>(converted));
    spec.source = OptionSource::kEnvironment;
    spec.origin = "environment variable " + spec.env_name;
  }
}

/// Runs every check on every option's final value, naming the source that set it.
void run_checks(const OptionSet& set) {
  for (const OptionSpec& spec : set.specs()) {
    const OptionValue v = spec.value();
    for (const Check& c : spec.checks) {
      std::string why = c.fn(v);
      if (why.empty()) continue;
      switch (spec.source) {
        case OptionSource::kCommandLine:
          usage_fail("invalid value for --{}: {} ({})", spec.key, to_string(v), why);
        case OptionSource::kConfigFile:
          usage_fail("{}: invalid value for '{}': {} ({})", spec.origin, spec.key, to_string(v),
                     why);
        case OptionSource::kEnvironment:
          usage_fail("invalid value for --{} from {}: {} ({})", spec.key, spec.origin, to_string(v),
                     why);
        case OptionSource::kDefault:
          usage_fail("internal error: default of --{} is invalid: {} ({})", spec.key, to_string(v),
                     why);
      }
    }
    if (spec.is_required && std::get<std::string>(v).empty())
      usage_fail(
          "--{} is required{}\nhint: give it on the command line or as `{} = ...` in the "
          "--config file",
          spec.key, spec.source == OptionSource::kDefault ? "" : " (got an empty value)", spec.key);
  }
}

/// Help-text decorations: checks, env and required markers go after the description.
void decorate_help(OptionSet& set) {
  for (OptionSpec& spec : set.specs()) {
    std::string d = spec.description;
    for (const Check& c : spec.checks) d += fmt::format(" [{}]", c.text);
    if (!spec.env_name.empty()) d += fmt::format(" (env {})", spec.env_name);
    if (spec.is_required) d += " (required)";
    std::vector<std::string> also;
    for (const std::string& a : spec.aliases)
      if (spec.description.find("--" + a) == std::string::npos) also.push_back("--" + a);
    if (!also.empty()) d += fmt::format(" (also {})", fmt::join(also, ", "));
    spec.cli->description(d);
  }
}

/// TRL's and argparse's habits, rewritten into what CLI11 parses: `--flag true|false` (also
/// True/False, 1/0, yes/no) for a switch becomes `--flag=true|false`, and a bare `--name` of an
/// option with an implicit value (followed by nothing or another `--flag`) becomes
/// `--name=<value>`. `set` is the selected subcommand's options.
std::vector<std::string> normalize_argv(std::vector<std::string> argv, const OptionSet& set) {
  std::set<std::string> switches;
  std::map<std::string, std::string> implicit;
  for (const OptionSpec& spec : set.specs()) {
    std::vector<std::string> names = spec.aliases;
    names.push_back(spec.key);
    for (const std::string& n : names) {
      if (std::holds_alternative<bool*>(spec.target)) switches.insert(n);
      if (!spec.implicit_value.empty()) implicit[n] = spec.implicit_value;
    }
  }
  for (const OptionSet::Ignored& ig : set.ignored())
    if (ig.nargs == 0) switches.insert(ig.name);
  auto bool_word = [](const std::string& w) -> const char* {
    if (w == "true" || w == "True" || w == "TRUE" || w == "1" || w == "yes") return "true";
    if (w == "false" || w == "False" || w == "FALSE" || w == "0" || w == "no") return "false";
    return nullptr;
  };
  std::vector<std::string> out;
  for (size_t i = 0; i < argv.size(); ++i) {
    const std::string& t = argv[i];
    if (i < 2 || t.rfind("--", 0) != 0 || t.find('=') != std::string::npos) {
      out.push_back(t);
      continue;
    }
    const std::string name = t.substr(2);
    const bool has_next = i + 1 < argv.size();
    if (switches.count(name) && has_next && bool_word(argv[i + 1]) != nullptr) {
      out.push_back(t + "=" + bool_word(argv[i + 1]));
      ++i;
    } else if (auto it = implicit.find(name);
               it != implicit.end() && (!has_next || argv[i + 1].rfind("--", 0) == 0)) {
      out.push_back(t + "=" + it->second);
    } else {
      out.push_back(t);
    }
  }
  return out;
}

/// The hint of an unknown option name: OpenRLHF's table, then TRL's, then the closest flag
/// (namespaced names are compared with the command's namespaced aliases only).
std::string unknown_option_hint(const std::string& name, const OptionSet& set) {
  if (std::string h = openrlhf_hint(name, set); !h.empty()) return h;
  if (std::string h = trl_hint(name); !h.empty()) return h;
  std::vector<std::string> names;
  const bool dotted = name.find('.') != std::string::npos;
  for (const OptionSpec& s : set.specs()) {
    if (!dotted) names.push_back(s.key);
    for (const std::string& a : s.aliases)
      if ((a.find('.') != std::string::npos) == dotted) names.push_back(a);
  }
  if (!dotted) names.push_back("config");
  return did_you_mean(name, names, "--");
}

template <size_t I = 0>
void add_commands(CLI::App& app, CommandArgs (&args)[kCommandNames.size()],
                  std::vector<std::unique_ptr<OptionSet>>& sets) {
  if constexpr (I < kCommandNames.size()) {
    static const char* kDescriptions[] = {
        "Supervised fine-tuning / pre-training on JSONL or plain text",
        "Reward-model training on preference pairs",
        "GRPO: group-normalised advantages, no critic",
        "PPO with a critic (GAE)",
        "Sample from a checkpoint",
        "Evaluate a checkpoint: sample, score with a rule reward, accuracy and pass@k",
        "Teacher-forced log-probs and NLL of given responses, or a text's perplexity",
        "Export a model as a Hugging Face folder (safetensors), HDF5 or GGUF",
        "Import a Hugging Face / llama2.c / GGUF model into an HDF5 checkpoint",
        "Benchmarks (JSON lines on stdout)",
    };
    static_assert(std::size(kDescriptions) == kCommandNames.size());
    CLI::App* sub = app.add_subcommand(kCommandNames[I], kDescriptions[I]);
    sub->allow_extras();  // unknown flags are reported by us, with a did-you-mean hint
    args[I].template emplace<I>();
    auto set = std::make_unique<OptionSet>(sub, kCommandNames[I]);
    std::get<I>(args[I]).bind(*set);
    add_openrlhf_names(*set);
    decorate_help(*set);
    sets.push_back(std::move(set));
    add_commands<I + 1>(app, args, sets);
  }
}

}  // namespace

ParsedCommand parse_args(const std::vector<std::string>& argv) {
  CLI::App app{"rlhf: RLHF for Llama-family models in one MPI program (SFT, RM, GRPO, PPO)",
               "rlhf"};
  app.formatter(std::make_shared<Formatter>());
  app.get_formatter()->column_width(40);
  app.set_version_flag("--version", version_string());
  app.require_subcommand(1);

  CommandArgs args[kCommandNames.size()];
  std::vector<std::unique_ptr<OptionSet>> sets;
  add_commands(app, args, sets);

  ParsedCommand out;
  // Give an unknown subcommand a clearer message than CLI11's "arguments were not expected".
  if (argv.size() >= 2 && !argv[1].empty() && argv[1][0] != '-') {
    std::vector<std::string> names(kCommandNames.begin(), kCommandNames.end());
    if (std::find(names.begin(), names.end(), argv[1]) == names.end())
      usage_fail("unknown subcommand '{}'{}", argv[1],
                 did_you_mean(argv[1], names).empty()
                     ? fmt::format("\nhint: the subcommands are {}", fmt::join(names, ", "))
                     : did_you_mean(argv[1], names));
  }

  std::vector<std::string> args_in = argv;
  if (argv.size() >= 2)
    for (const auto& set : sets)
      if (set->command() == argv[1]) args_in = normalize_argv(argv, *set);
  std::vector<std::string> rev(args_in.rbegin(), args_in.rend());
  if (!rev.empty()) rev.pop_back();  // argv[0]
  try {
    app.parse(rev);
  } catch (const CLI::CallForHelp&) {
    out.action = ParsedCommand::Action::kPrintHelp;
    out.text = app.help();
    return out;
  } catch (const CLI::CallForAllHelp&) {
    out.action = ParsedCommand::Action::kPrintHelp;
    out.text = app.help("", CLI::AppFormatMode::All);
    return out;
  } catch (const CLI::CallForVersion&) {
    out.action = ParsedCommand::Action::kPrintVersion;
    out.text = version_string() + "\n";
    return out;
  } catch (const CLI::ParseError& e) {
    const auto subs = app.get_subcommands();
    const std::string cmd = subs.empty() ? "" : " " + subs[0]->get_name();
    usage_fail("{}\nhint: run `rlhf{} --help` for the options", e.what(), cmd);
  }

  size_t index = 0;
  while (index < sets.size() && !sets[index]->app()->parsed()) ++index;
  RLHF_ASSERT(index < sets.size());
  OptionSet& set = *sets[index];

  // Unknown flags and stray arguments.
  // Every unknown flag at once (a script copied from a peer has several), each with its hint;
  // values after an unknown flag are its own, not stray arguments.
  const std::vector<std::string> extras = set.app()->remaining();
  if (!extras.empty()) {
    if (extras.front().rfind("-", 0) != 0)
      usage_fail("unexpected argument '{}' for `rlhf {}` (options are given as --name value)",
                 extras.front(), set.command());
    std::vector<std::string> bad;
    std::string hints;
    for (const std::string& e : extras) {
      if (e.rfind("--", 0) != 0 && !(e.size() == 2 && e[0] == '-' && std::isalpha(e[1]))) continue;
      std::string name = e.substr(e.find_first_not_of('-'));
      name = name.substr(0, name.find('='));
      bad.push_back(e);
      hints += unknown_option_hint(name, set);
    }
    if (bad.size() == 1)
      usage_fail("unknown option '{}' for `rlhf {}`{}", bad[0], set.command(), hints);
    usage_fail("{} unknown options for `rlhf {}`: {}{}", bad.size(), set.command(),
               fmt::join(bad, " "), hints);
  }

  for (OptionSpec& spec : set.specs()) {
    if (spec.cli->count() > 0) {
      spec.source = OptionSource::kCommandLine;
      spec.origin = "--" + spec.key;
    }
    for (size_t a = 0; a < spec.alias_cli.size(); ++a) {
      if (spec.alias_cli[a]->count() == 0) continue;
      spec.source = OptionSource::kCommandLine;
      spec.origin = "--" + spec.aliases[a];
    }
  }
  const std::string config_path =
      std::visit([](const auto& a) { return a.common.config; }, args[index]);
  if (!config_path.empty()) merge_toml(set, config_path);
  merge_env(set);
  run_checks(set);
  for (const OptionSet::Ignored& ig : set.ignored())
    if (ig.cli->count() > 0)
      out.notices.push_back(fmt::format("--{} is ignored: {}", ig.name, ig.note));
  // OpenRLHF's --max_len alone bounds prompt + response: without --generate_max_len it decides.
  std::visit(
      [&](auto& a) {
        if constexpr (std::is_base_of_v<PpoArgs, std::decay_t<decltype(a)>>) {
          const OptionSpec* gml = set.find("generate_max_len");
          if (a.max_len > 0 && gml && gml->source == OptionSource::kDefault)
            a.gen.generate_max_len = a.max_len;
        }
      },
      args[index]);
  std::visit([](auto& a) { a.validate(); }, args[index]);
  // Critic options given to an estimator that trains no critic are a mistake worth naming.
  std::visit(
      [&](auto& a) {
        if constexpr (std::is_base_of_v<PpoArgs, std::decay_t<decltype(a)>>) {
          if (a.advantage_estimator == "gae") return;
          for (const char* key : {"critic_pretrain", "critic_learning_rate", "value_clip"}) {
            const OptionSpec* spec = set.find(key);
            if (spec && spec->source != OptionSource::kDefault)
              usage_fail(
                  "{} is a critic option, but --advantage_estimator {} trains no critic\nhint: "
                  "drop it, or use --advantage_estimator gae (PPO)",
                  spec->origin, a.advantage_estimator);
          }
        }
      },
      args[index]);

  out.action = ParsedCommand::Action::kRun;
  out.command = set.command();
  out.config.push_back({"config", config_path.empty() ? "\"\"" : config_path,
                        config_path.empty() ? OptionSource::kDefault : OptionSource::kCommandLine});
  for (const OptionSpec& spec : set.specs()) {
    std::string value = to_string(spec.value());
    // --use_wandb KEY (OpenRLHF's form) carries an API key: never into the logs.
    if (spec.key == "use_wandb" && value != "\"\"" && value != "true" && value != "false")
      value = "(an API key)";
    out.config.push_back({spec.key, std::move(value), spec.source});
  }
  out.args = std::move(args[index]);  // the specs point into args[index]: read them first
  return out;
}

void print_resolved_config(const ParsedCommand& cmd) {
  std::vector<std::pair<std::string, std::string>> rows;
  rows.reserve(cmd.config.size());
  for (const ConfigRow& r : cmd.config) rows.emplace_back(r.key, r.value);
  LOG0_INFO("rlhf {}: resolved configuration", cmd.command);
  log0_table(rows, "option", "value");
}

}  // namespace rlhf::app
