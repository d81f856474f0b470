// Helpers shared by the command-line suites (test_cli.cpp, test_cli_commands.cpp,
// test_cli_log_env.cpp): a temporary TOML file, in-process parsing, the UsageError message of a
// command line, and the source of a resolved option.
#pragma once

#include <doctest/doctest.h>
#include <fmt/format.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "app/cli.h"

namespace rlhf::cli_test {

/// A TOML file in a fresh temporary directory, removed at scope exit.
struct TempToml {
  std::filesystem::path path;
  explicit TempToml(const std::string& content) {
    static std::atomic<int> counter{0};
    path = std::filesystem::temp_directory_path() /
           fmt::format("rlhf_test_cli_{}_{}.toml", ::getpid(), counter++);
    std::ofstream(path) << content;
  }
  ~TempToml() { std::filesystem::remove(path); }
  std::string str() const { return path.string(); }
};

/// Parses `args` as the command line after the program name ("rlhf").
inline app::ParsedCommand parse(std::vector<std::string> args) {
  args.insert(args.begin(), "rlhf");
  return app::parse_args(args);
}

/// The message of the UsageError that parsing `args` throws ("" if it does not throw).
inline std::string usage_error(std::vector<std::string> args) {
  try {
    parse(std::move(args));
  } catch (const app::UsageError& e) {
    return e.what();
  }
  return "";
}

/// Where the resolved option `key` of `p` came from (fails the test when there is no such row).
inline app::OptionSource source_of(const app::ParsedCommand& p, const std::string& key) {
  for (const auto& row : p.config)
    if (row.key == key) return row.source;
  FAIL("no config row for ", key);
  return app::OptionSource::kDefault;
}

/// Whether `needle` occurs in `haystack`.
inline bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

/// The smallest valid sft command line.
inline const std::vector<std::string> kMinimal = {"sft", "--dataset", "d.jsonl", "--pretrain",
                                                  "p.h5"};

}  // namespace rlhf::cli_test
