// Logging and the multi-turn environment flags: format_table's box, log levels and per-rank log
// files, print_resolved_config's table, the warning for --env_command without --stop_strings, and
// --env_command / --stop_strings (and OpenRLHF's --vllm_stop_strings) on the command line and in
// TOML.
#include <doctest/doctest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <iterator>
#include <string>
#include <variant>
#include <vector>

#include "app/cli.h"
#include "core/log.h"
#include "tests/cli_test_util.h"

using namespace rlhf;
using namespace rlhf::cli_test;
using app::ParsedCommand;

TEST_CASE("log: format_table draws an llm.c-style box") {
  const std::vector<std::string> t =
      rlhf::format_table({{"learning_rate", "5e-06"}, {"seed", "42"}}, "option", "value");
  const std::vector<std::string> expected = {
      "+---------------+-------+",  //
      "| option        | value |",  //
      "+---------------+-------+",  //
      "| learning_rate | 5e-06 |",  //
      "| seed          | 42    |",  //
      "+---------------+-------+",
  };
  CHECK(t == expected);
}

TEST_CASE("log: levels and per-rank log files") {
  CHECK(rlhf::parse_log_level("debug") == spdlog::level::debug);
  CHECK(rlhf::parse_log_level("warn") == spdlog::level::warn);
  CHECK_THROWS_AS(rlhf::parse_log_level("loud"), rlhf::Error);

  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / fmt::format("rlhf_test_log_{}", ::getpid()) / "logs";
  rlhf::init_logging({3, 4, "off", dir.string()});
  CHECK(rlhf::log_rank() == 3);
  LOG_DEBUG("debug line {}", 1);
  LOG0_INFO("rank-0-only line");  // not rank 0: dropped
  LOG_WARN("warn line {}", 2);
  rlhf::flush_logs();
  rlhf::init_logging({});  // back to a plain rank-0 console logger for the other tests
  std::ifstream in(dir / "rank_00003.log");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  CHECK(contains(text, "[r003] [debug] debug line 1"));
  CHECK(contains(text, "[r003] [warning] warn line 2"));
  CHECK(!contains(text, "rank-0-only"));
  std::filesystem::remove_all(dir.parent_path());
}

TEST_CASE("log: print_resolved_config writes every option and its value") {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / fmt::format("rlhf_test_cfg_{}", ::getpid());
  std::vector<std::string> args = kMinimal;
  args.insert(args.end(), {"--learning_rate", "0.00025", "--log_dir", dir.string()});
  const ParsedCommand p = parse(args);
  rlhf::init_logging({0, 1, "off", dir.string()});  // console off: the table goes to the file only
  app::print_resolved_config(p);
  rlhf::flush_logs();
  rlhf::init_logging({});
  std::ifstream in(dir / "rank_00000.log");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  CHECK(contains(text, "rlhf sft: resolved configuration"));
  CHECK(contains(text, "| learning_rate          | 0.00025 "));
  CHECK(contains(text, "| dataset                | d.jsonl "));
  CHECK(contains(text, "| adam_betas             | 0.9 0.95 "));
  CHECK(contains(text, "| gradient_checkpointing | false "));
  for (const auto& row : p.config) CHECK(contains(text, "| " + row.key + " "));
  std::filesystem::remove_all(dir);
}

TEST_CASE(
    "multi-turn flags: --env_command without --stop_strings warns that episodes have one turn") {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / fmt::format("rlhf_test_env_warn_{}", ::getpid());
  auto warned = [&](const std::vector<std::string>& extra) {
    std::filesystem::remove_all(dir);
    rlhf::init_logging({0, 1, "off", dir.string()});
    std::vector<std::string> args = {
        "grpo",       "--model_config",         "m.toml", "--prompt_data",
        "p.jsonl",    "--n_samples_per_prompt", "2",      "--env_command",
        "builtin:toy"};
    args.insert(args.end(), extra.begin(), extra.end());
    (void)parse(args);
    rlhf::flush_logs();
    rlhf::init_logging({});
    std::ifstream in(dir / "rank_00000.log");
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    return contains(text, "without --stop_strings");
  };
  CHECK(warned({}));
  CHECK(!warned({"--stop_strings", "</calc>"}));
  CHECK(!warned({"--env_max_turns", "1"}));  // one turn asked for: nothing to warn about
  std::filesystem::remove_all(dir);
}

TEST_CASE("multi-turn flags: --env_command, --stop_strings and its OpenRLHF alias") {
  const std::vector<std::string> base = {"generate", "--pretrain",    "m.h5",   "--dataset",
                                         "p.jsonl",  "--output_path", "o.jsonl"};
  auto with = [&](std::initializer_list<std::string> extra) {
    std::vector<std::string> a = base;
    a.insert(a.end(), extra);
    return a;
  };
  const ParsedCommand p = parse(with({"--env_command", "python3 env.py", "--env_max_turns", "3",
                                      "--stop_strings", "</calc>,\\n"}));
  const auto& g = std::get<app::GenerateArgs>(p.args);
  CHECK(g.gen.env_command == "python3 env.py");
  CHECK(g.gen.env_max_turns == 3);
  CHECK(g.gen.env_timeout == 60);
  CHECK(g.gen.stop_strings == "</calc>,\\n");
  // OpenRLHF's --vllm_stop_strings sets the same option (flag and TOML key), and says so.
  const ParsedCommand q = parse(with({"--vllm_stop_strings", "</tool>"}));
  CHECK(std::get<app::GenerateArgs>(q.args).gen.stop_strings == "</tool>");
  bool found = false;
  for (const app::ConfigRow& r : q.config)
    if (r.key == "stop_strings")
      found = r.value == "</tool>" && r.source == app::OptionSource::kCommandLine;
  CHECK(found);
  const TempToml toml("vllm_stop_strings = \"</a>\"\n");
  const ParsedCommand t = parse(with({"--config", toml.str()}));
  CHECK(std::get<app::GenerateArgs>(t.args).gen.stop_strings == "</a>");
  // Errors name the flag.
  CHECK(contains(usage_error(with({"--stop_strings", "a\\q"})), "--stop_strings"));
  // GPU engines run environments too (observation tokens one decode step each).
  CHECK(std::get<app::GenerateArgs>(parse(with({"--env_command", "x", "--device", "cuda"})).args)
            .gen.env_command == "x");
  // Tensor-parallel engines too (TP rank 0 runs it and broadcasts its answers).
  CHECK(std::get<app::GenerateArgs>(
            parse(with({"--env_command", "x", "--vllm_tensor_parallel_size", "2"})).args)
            .gen.vllm_tensor_parallel_size == 2);
  CHECK(contains(usage_error(with({"--env_max_turns", "0"})), "--env_max_turns"));
  // grpo without --reward is fine when an environment gives rewards.
  const ParsedCommand r = parse({"grpo", "--model_config", "m.toml", "--prompt_data", "p.jsonl",
                                 "--n_samples_per_prompt", "2", "--env_command", "builtin:toy"});
  CHECK(std::get<app::GrpoArgs>(r.args).gen.env_command == "builtin:toy");
}
