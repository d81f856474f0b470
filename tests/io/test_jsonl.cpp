// JSONL and JSON files: blank lines, CRLF, BOM, line numbers in errors, positions in JSON errors.
#include "io/jsonl.h"

#include "tests/io/io_test_util.h"

using namespace rlhf;

TEST_CASE("jsonl: objects with their line numbers, blank lines and CRLF skipped") {
  test::TempDir dir;
  const std::string p = dir.write(
      "a.jsonl", "\xEF\xBB\xBF{\"a\": 1}\n\n   \n{\"a\": 2, \"s\": \"x\\ny\"}\r\n\t\r\n{\"a\": 3}");
  std::vector<int64_t> lines, values;
  io::for_each_jsonl(p, [&](const nlohmann::json& o, int64_t line) {
    lines.push_back(line);
    values.push_back(o["a"].get<int64_t>());
    return true;
  });
  CHECK(lines == std::vector<int64_t>{1, 4, 6});
  CHECK(values == std::vector<int64_t>{1, 2, 3});
  const auto all = io::read_jsonl(p);
  REQUIRE(all.size() == 3);
  CHECK(all[1]["s"] == "x\ny");

  // Early stop.
  int seen = 0;
  io::for_each_jsonl(p, [&](const nlohmann::json&, int64_t) { return ++seen < 2; });
  CHECK(seen == 2);

  // Pull reader.
  io::JsonlReader r(p);
  nlohmann::json o;
  CHECK(r.line() == 0);
  REQUIRE(r.next(o));
  CHECK(r.line() == 1);
  REQUIRE(r.next(o));
  CHECK(r.line() == 4);
  REQUIRE(r.next(o));
  CHECK(r.line() == 6);
  CHECK_FALSE(r.next(o));

  CHECK(io::read_jsonl(dir.write("empty.jsonl", "")).empty());
  CHECK(io::read_jsonl(dir.write("blank.jsonl", "\n \n\n")).empty());
}

TEST_CASE("jsonl: errors name the file and line") {
  test::TempDir dir;
  const std::string bad =
      dir.write("bad.jsonl", "{\"a\": 1}\n\n{\"a\": 2}\n{\"a\": x}\n{\"a\": 5}\n");
  std::string msg = test::error_of([&] { io::read_jsonl(bad); });
  RLHF_CHECK_CONTAINS(msg, bad + ":4: malformed JSON: ");
  RLHF_CHECK_CONTAINS(msg, "invalid literal");
  // The streaming reader delivers the good lines first.
  int n = 0;
  msg = test::error_of(
      [&] { io::for_each_jsonl(bad, [&](const nlohmann::json&, int64_t) { return ++n > 0; }); });
  CHECK(n == 2);
  RLHF_CHECK_CONTAINS(msg, bad + ":4: malformed JSON");

  const std::string trunc = dir.write("trunc.jsonl", "{\"a\": 1}\n{\"a\": \"unterminated\n");
  RLHF_CHECK_CONTAINS(test::error_of([&] { io::read_jsonl(trunc); }), trunc + ":2: malformed JSON");

  const std::string arr = dir.write("arr.jsonl", "{\"a\": 1}\n[1, 2]\n");
  RLHF_CHECK_CONTAINS(test::error_of([&] { io::read_jsonl(arr); }),
                      arr + ":2: expected a JSON object, got array");

  const std::string two = dir.write("two.jsonl", "{\"a\": 1} {\"b\": 2}\n");
  RLHF_CHECK_CONTAINS(test::error_of([&] { io::read_jsonl(two); }), two + ":1: malformed JSON");

  const std::string missing = dir.file("missing.jsonl");
  CHECK(test::error_of([&] { io::read_jsonl(missing); }) ==
        "cannot open " + missing + ": No such file or directory");
  RLHF_CHECK_CONTAINS(test::error_of([&] { io::read_jsonl(dir.path().string()); }),
                      "cannot read " + dir.path().string() + ": Is a directory");
}

TEST_CASE("json file: parse errors give file:line:column") {
  test::TempDir dir;
  CHECK(io::parse_json_file(dir.write("ok.json", "{\"a\": [1, 2]}"))["a"][1] == 2);
  const std::string p = dir.write("bad.json", "{\n  \"a\": 1,\n  \"b\": x\n}\n");
  RLHF_CHECK_CONTAINS(test::error_of([&] { io::parse_json_file(p); }),
                      p + ":3:8: malformed JSON: ");
  const std::string q = dir.write("trail.json", "{\"a\": 1,\n\"b\": 2,\n}");
  RLHF_CHECK_CONTAINS(test::error_of([&] { io::parse_json_file(q); }), q + ":3:1: malformed JSON");
  // A number beyond double is nlohmann's out_of_range, not a parse_error: still rlhf::Error.
  const std::string big = dir.write("big.json", "{\"hidden_size\": 1e8192}");
  RLHF_CHECK_CONTAINS(test::error_of([&] { io::parse_json_file(big); }),
                      big + ": malformed JSON: ");
  const std::string big_lines = dir.write("big.jsonl", "{\"a\": 1}\n{\"a\": 1e8192}\n");
  RLHF_CHECK_CONTAINS(test::error_of([&] { io::read_jsonl(big_lines); }),
                      big_lines + ":2: malformed JSON: ");
  const std::string missing = dir.file("nope.json");
  CHECK(test::error_of([&] { io::parse_json_file(missing); }) ==
        "cannot open " + missing + ": No such file or directory");
  // line_column_of, independently.
  CHECK(io::line_column_of("ab\ncd\n\ne", 0) == std::pair<int64_t, int64_t>{1, 1});
  CHECK(io::line_column_of("ab\ncd\n\ne", 4) == std::pair<int64_t, int64_t>{2, 2});
  CHECK(io::line_column_of("ab\ncd\n\ne", 7) == std::pair<int64_t, int64_t>{4, 1});
}
