// Builtin tasks: deterministic, correct sums, train/test differ, bad specs are clear errors.
#include "io/builtin_tasks.h"

#include "core/error.h"
#include "tests/test_util.h"

using namespace rlhf;

TEST_CASE("builtin addition task") {
  auto a = io::builtin_records("builtin:addition?n=50&digits=3&seed=4");
  auto b = io::builtin_records("builtin:addition?n=50&digits=3&seed=4");
  auto t = io::builtin_records("builtin:addition?n=50&digits=3&seed=4&split=test");
  REQUIRE(a.size() == 50);
  CHECK(a == b);
  CHECK(a != t);
  for (const auto& r : a) {
    const std::string in = r["input"];
    const size_t plus = in.find('+');
    const int64_t x = std::stoll(in.substr(0, plus)), y = std::stoll(in.substr(plus + 1));
    CHECK(x < 1000);
    CHECK(in.back() == '=');
    CHECK(r["output"] == std::to_string(x + y));
    CHECK(r["label"] == r["output"]);
  }
  CHECK(io::builtin_records("builtin:addition").size() == 1000);
  CHECK_THROWS_AS(io::builtin_records("builtin:multiply"), rlhf::Error);
  CHECK_THROWS_AS(io::builtin_records("builtin:addition?n=x"), rlhf::Error);
  CHECK_THROWS_AS(io::builtin_records("builtin:addition?digits=12"), rlhf::Error);
  CHECK_THROWS_AS(io::builtin_records("builtin:addition?size=3"), rlhf::Error);
}
