// MetricsWriter: one flushed JSON line per record, directory created, appends across writers.
#include "io/metrics.h"

#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <sstream>

#include "tests/io/io_test_util.h"

using namespace rlhf;

namespace {
std::vector<nlohmann::json> lines_of(const std::string& path) {
  std::istringstream in(test::slurp(path));
  std::vector<nlohmann::json> out;
  for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line));
  return out;
}
}  // namespace

TEST_CASE("metrics: one line per record, flushed, appended") {
  test::TempDir dir;
  const std::string out = dir.file("run/logs/deep");
  {
    io::MetricsWriter w(out);
    CHECK(w.path() == out + "/metrics.jsonl");
    w.write({{"step", 1}, {"loss", 2.5}, {"phase", "train"}});
    // Flushed: visible before the writer goes away.
    CHECK(lines_of(w.path()).size() == 1);
    w.write({{"step", 2}, {"loss", std::nan("")}, {"tok_per_s", 1e6}});
    RLHF_CHECK_CONTAINS(test::error_of([&] {
                          w.write(nlohmann::json::array({1, 2}));
                        }),
                        "must be a JSON object");
  }
  {
    io::MetricsWriter w(out);
    w.write({{"step", 3}, {"text", "line\nbreak"}});
  }
  const auto lines = lines_of(out + "/metrics.jsonl");
  REQUIRE(lines.size() == 3);
  CHECK(lines[0] == nlohmann::json{{"step", 1}, {"loss", 2.5}, {"phase", "train"}});
  CHECK(lines[1]["loss"].is_null());
  CHECK(lines[1]["tok_per_s"] == 1e6);
  CHECK(lines[2]["text"] == "line\nbreak");
}

TEST_CASE("metrics: unusable directory is an error") {
  test::TempDir dir;
  const std::string file = dir.write("a_file", "x");
  RLHF_CHECK_CONTAINS(test::error_of([&] { io::MetricsWriter w(file + "/sub"); }),
                      "cannot create directory " + file + "/sub");
}
