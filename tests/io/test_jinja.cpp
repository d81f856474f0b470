// The Jinja engine of io/jinja: Jinja2 semantics case by case against what transformers' Jinja
// environment renders (tests/fixtures/jinja/cases.json, written by
// scripts/make_chat_template_fixtures.py), errors that name the template line and column for
// what is unsupported or wrong, and the bounds that keep untrusted templates from crashing or
// hanging. Whole real templates are tested in test_chat_template.cpp.
#include "io/jinja/jinja.h"

#include <nlohmann/json.hpp>

#include <ctime>
#include <fstream>

#include "tests/io/io_test_util.h"
#include "tests/test_util.h"

using namespace rlhf;
using io::jinja::Json;

namespace {

// RLHF_CHECK_CONTAINS on a message computed once (its INFO would otherwise evaluate it again).
#define CHECK_ERROR(expr, needle)          \
  do {                                     \
    const std::string message_ = (expr);   \
    RLHF_CHECK_CONTAINS(message_, needle); \
  } while (0)

std::string render(const std::string& source, const Json& context = Json::object()) {
  return io::jinja::Template(source).render(context);
}

std::string error_of_render(const std::string& source, const Json& context = Json::object()) {
  return test::error_of([&] { render(source, context); });
}

}  // namespace

TEST_CASE("jinja: constructs render as transformers' Jinja environment renders them") {
  std::ifstream f(std::string(RLHF_SOURCE_DIR) + "/tests/fixtures/jinja/cases.json");
  REQUIRE(f.good());
  const Json fx = Json::parse(f);
  int rendered = 0, failed = 0;
  for (const Json& c : fx.at("cases")) {
    const std::string tmpl = c.at("template").get<std::string>();
    INFO("template: " << tmpl);
    if (c.contains("expected")) {
      CHECK(render(tmpl, c.at("context")) == c.at("expected").get<std::string>());
      ++rendered;
      continue;
    }
    // transformers raised: so must we, with the template's own message for raise_exception.
    const std::string error = c.at("error").get<std::string>();
    INFO("transformers: " << error);
    if (c.at("raised").get<bool>()) {
      try {
        render(tmpl, c.at("context"));
        FAIL_CHECK("no exception");
      } catch (const io::jinja::TemplateRaised& e) {
        CHECK(std::string(e.what()) == error.substr(error.find(": ") + 2));
      }
    } else {
      CHECK_ERROR(error_of_render(tmpl, c.at("context")), "line 1, column ");
    }
    ++failed;
  }
  CHECK(rendered == 47);
  CHECK(failed == 11);
}

TEST_CASE("jinja: errors name the line and column, and what is not supported") {
  // Parse errors.
  CHECK(test::error_of([] { io::jinja::Template("a\n{{ x | nosuch }}"); }) ==
        "line 2, column 8: unknown filter 'nosuch' (near `{{ x | nosuch }}`)");
  CHECK(test::error_of([] { io::jinja::Template("{% if x is nosuch %}{% endif %}"); }) ==
        "line 1, column 12: unknown test 'nosuch' (near `{% if x is nosuch %}{% endif %}`)");
  CHECK_ERROR(test::error_of([] { io::jinja::Template("\n\n  {% for x in y %}"); }),
              "line 3, column 3: this block is never closed ({% endfor %} missing)");
  CHECK_ERROR(test::error_of([] { io::jinja::Template("{{ 'abc }}"); }),
              "line 1, column 4: unclosed string literal");
  CHECK_ERROR(test::error_of([] { io::jinja::Template("{{ x "); }),
              "line 1, column 1: unclosed '{{'");
  CHECK_ERROR(test::error_of([] { io::jinja::Template("{% break %}"); }),
              "'break' outside a for loop");
  for (const char* unsupported :
       {"{% extends 'base' %}", "{% block b %}{% endblock %}", "{% import 'm' as m %}",
        "{% call m() %}{% endcall %}", "{% filter upper %}x{% endfilter %}"})
    CHECK_ERROR(test::error_of([&] { io::jinja::Template t(unsupported); }),
                "line 1, column 1: the '");
  CHECK_ERROR(test::error_of([] { io::jinja::Template("{% for x in y recursive %}"); }),
              "recursive for loops are not supported");
  CHECK_ERROR(test::error_of([] { io::jinja::Template("{{ f(*args) }}"); }),
              "*args and **kwargs in calls are not supported");
  CHECK_ERROR(test::error_of([] { io::jinja::Template("{{ 1 < x < 3 }}"); }),
              "chained comparisons (a < b < c) are not supported");
  // Render errors: where the failing expression starts.
  CHECK(error_of_render("{% for m in messages %}\n  {{ m.content + 1 }}\n{% endfor %}",
                        {{"messages", {{{"content", "hi"}}}}}) ==
        "line 2, column 6: unsupported operand types for +: 'str' and 'int' (near `  {{ m.content "
        "+ 1 }}`)");
  CHECK(error_of_render("{{ '%s' % x }}") ==
        "line 1, column 4: printf-style string formatting ('...' % x) is not supported (near `{{ "
        "'%s' % x }}`)");
  // Values Python has and this engine does not: an error, never a different rendering.
  CHECK_ERROR(error_of_render("{{ {1: 'a'} }}"), "dict keys other than strings are not supported");
  CHECK_ERROR(error_of_render("{{ 'ß' | upper }}"),
              "upper: the case mapping of U+00DF is not supported");
  CHECK_ERROR(error_of_render("{{ [1, 2] | map('string') }}"),
              "printing a generator (map, select, ... without | list) is not supported");
  CHECK(render("{{ 'Ünïcödé ÀÉÎ ѐя' | lower }}|{{ 'ÿ Straße' | title }}") ==
        "ünïcödé àéî ѐя|Ÿ Straße");
  // raise_exception: its message, nothing added.
  try {
    render("{% if true %}{{ raise_exception('Only user and assistant roles') }}{% endif %}");
    FAIL_CHECK("no exception");
  } catch (const io::jinja::TemplateRaised& e) {
    CHECK(std::string(e.what()) == "Only user and assistant roles");
  }
}

TEST_CASE("jinja: strftime_now formats the render's clock in local time") {
  io::jinja::RenderOptions o;
  o.now = 1721952000;  // 2024-07-26 00:00:00 UTC
  std::tm local{};
  localtime_r(&o.now, &local);
  char want[64];
  std::strftime(want, sizeof want, "%d %b %Y|%Y-%m-%d", &local);
  CHECK(io::jinja::Template("{{ strftime_now('%d %b %Y') }}|{{ strftime_now('%Y-%m-%d') }}")
            .render(Json::object(), o) == want);
}

TEST_CASE("jinja: untrusted templates are bounded (nesting, steps, sizes)") {
  // Nesting: parentheses, blocks and macro recursion stop with an error, not a stack overflow.
  CHECK_ERROR(
      test::error_of([] { io::jinja::Template("{{ " + std::string(100000, '-') + "1 }}"); }),
      "the template nests deeper than 200 levels");
  std::string ifs;
  for (int i = 0; i < 1000; ++i) ifs += "{% if true %}";
  CHECK_ERROR(test::error_of([&] { io::jinja::Template t(ifs); }),
              "the template nests deeper than 200 levels");
  CHECK_ERROR(error_of_render("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}"),
              "macros nest deeper than 64 calls");
  // Steps: loops that would run for hours.
  io::jinja::RenderOptions o;
  o.max_steps = 100000;
  CHECK_ERROR(test::error_of([&] {
                io::jinja::Template(
                    "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor "
                    "%}{% endfor %}")
                    .render(Json::object(), o);
              }),
              "the template took more than 100000 steps");
  CHECK_ERROR(error_of_render("{{ range(100001) | length }}"),
              "range() is too big (the sandbox allows 100000 items)");
  // Sizes: strings and lists that double, the rendered text.
  CHECK_ERROR(error_of_render("{{ 'x' * 100000000 }}"), "would exceed 16777216 bytes");
  CHECK_ERROR(error_of_render("{% set ns = namespace(s='ab') %}{% for i in range(40) %}"
                              "{% set ns.s = ns.s ~ ns.s %}{% endfor %}"),
              "a string would exceed 16777216 bytes");
  o = {};
  o.max_output = 1000;
  CHECK_ERROR(test::error_of([&] {
                io::jinja::Template("{% for i in range(1000) %}{{ i }}{% endfor %}")
                    .render(Json::object(), o);
              }),
              "the rendered text exceeds 1000 bytes");
  // Integer overflow is an error (Python would go on with big integers).
  CHECK_ERROR(error_of_render("{{ 2 ** 64 }}"), "integer overflow (beyond 64 bits)");
  CHECK_ERROR(error_of_render("{{ 9223372036854775807 + 1 }}"),
              "integer overflow (beyond 64 bits)");
}
