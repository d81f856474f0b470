// The command line in-process: defaults, flags, TOML files, precedence, and every error kind with
// the location it must name. The expected values are the literals of the specification (OpenRLHF
// names and defaults), written out here independently of the structs' initialisers.
#include <doctest/doctest.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <variant>
#include <vector>

#include "app/cli.h"
#include "app/runtime.h"
#include "app/trl_names.h"
#include "core/log.h"

using namespace rlhf;
using app::OptionSource;
using app::ParsedCommand;

namespace {

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

/// Sets (or unsets) an environment variable for the scope, restoring the previous value.
struct ScopedEnv {
  std::string name;
  std::optional<std::string> old;
  ScopedEnv(std::string n, const char* value) : name(std::move(n)) {
    if (const char* v = std::getenv(name.c_str())) old = v;
    if (value != nullptr)
      ::setenv(name.c_str(), value, 1);
    else
      ::unsetenv(name.c_str());
  }
  ~ScopedEnv() {
    if (old)
      ::setenv(name.c_str(), old->c_str(), 1);
    else
      ::unsetenv(name.c_str());
  }
};

ParsedCommand parse(std::vector<std::string> args) {
  args.insert(args.begin(), "rlhf");
  return app::parse_args(args);
}

/// Splits a command line on spaces.
std::vector<std::string> split(const std::string& line) {
  std::vector<std::string> out;
  std::istringstream is(line);
  for (std::string w; is >> w;) out.push_back(w);
  return out;
}

const app::SftArgs& sft(const ParsedCommand& p) {
  return std::get<app::SftArgs>(p.args);
}

/// The message of the UsageError that parsing `args` throws ("" if it does not throw).
std::string usage_error(std::vector<std::string> args) {
  try {
    parse(std::move(args));
  } catch (const app::UsageError& e) {
    return e.what();
  }
  return "";
}

OptionSource source_of(const ParsedCommand& p, const std::string& key) {
  for (const auto& row : p.config)
    if (row.key == key) return row.source;
  FAIL("no config row for ", key);
  return OptionSource::kDefault;
}

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

const std::vector<std::string> kMinimal = {"sft", "--dataset", "d.jsonl", "--pretrain", "p.h5"};

}  // namespace

TEST_CASE("cli: sft defaults are OpenRLHF's (and the spec's)") {
  ScopedEnv env("RLHF_RANKS_PER_NODE", nullptr);
  const ParsedCommand p = parse(kMinimal);
  REQUIRE(p.action == ParsedCommand::Action::kRun);
  CHECK(p.command == "sft");
  const app::SftArgs& a = sft(p);
  CHECK(a.data.dataset == "d.jsonl");
  CHECK(a.model.pretrain == "p.h5");
  CHECK(a.model.model_config == "");
  CHECK(a.input_key == "input");
  CHECK(a.output_key == "output");
  CHECK(a.data.max_len == 512);
  CHECK(a.data.truncation == "truncate");
  CHECK(a.data.max_samples == 100000000);
  CHECK(a.loop.micro_train_batch_size == 8);
  CHECK(a.loop.train_batch_size == 128);
  CHECK(a.loop.max_epochs == 1);
  CHECK(a.loop.max_steps == -1);
  CHECK(a.optim.learning_rate == 5e-6);
  CHECK(a.optim.lr_scheduler == "cosine_with_min_lr");
  CHECK(a.optim.lr_warmup_ratio == 0.03);
  CHECK(a.optim.adam_betas[0] == 0.9);
  CHECK(a.optim.adam_betas[1] == 0.95);
  CHECK(a.optim.l2 == 0.0);
  CHECK(a.optim.max_norm == 1.0);
  CHECK(a.common.seed == 42);
  CHECK(a.ckpt.save_path == "./ckpt");
  CHECK(a.ckpt.save_steps == -1);
  CHECK(a.ckpt.logging_steps == 1);
  CHECK(a.zero.gradient_checkpointing == false);
  CHECK(a.zero.zero_stage == 3);
  CHECK(a.zero.adam_offload == false);
  CHECK(a.parallel.ranks_per_node == 0);
  CHECK(a.parallel.gen_ranks_per_node == 0);
  CHECK(a.parallel.threads == 0);
  CHECK(a.common.log_level == "info");
  CHECK(a.common.log_dir == (std::filesystem::path("./ckpt") / "logs").string());
  CHECK(a.common.disable_progress == false);
  CHECK(a.common.config == "");
  CHECK(source_of(p, "learning_rate") == OptionSource::kDefault);
  CHECK(source_of(p, "dataset") == OptionSource::kCommandLine);
}

TEST_CASE("cli: flags of every type") {
  const ParsedCommand p = parse(
      split("sft --dataset x.jsonl --model_config m.json --max_len 1024 --learning_rate 1e-4 "
            "--adam_betas 0.8 0.99 --gradient_checkpointing --lr_scheduler constant --zero_stage 0 "
            "--save_steps 100 --truncation skip --log_dir /tmp/x --max_len 2048 --max_steps -1 "
            "--l2=0.1"));
  const app::SftArgs& a = sft(p);
  CHECK(a.model.model_config == "m.json");
  CHECK(a.data.max_len == 2048);  // given twice: the last one wins, as with argparse
  CHECK(a.optim.learning_rate == 1e-4);
  CHECK(a.optim.adam_betas[0] == 0.8);
  CHECK(a.optim.adam_betas[1] == 0.99);
  CHECK(a.zero.gradient_checkpointing == true);
  CHECK(a.optim.lr_scheduler == "constant");
  CHECK(a.zero.zero_stage == 0);
  CHECK(a.ckpt.save_steps == 100);
  CHECK(a.data.truncation == "skip");
  CHECK(a.loop.max_steps == -1);  // a negative number is a value, not a flag
  CHECK(a.optim.l2 == 0.1);
  CHECK(a.common.log_dir == "/tmp/x");  // explicit --log_dir is not replaced by <save_path>/logs
  CHECK(source_of(p, "adam_betas") == OptionSource::kCommandLine);
}

TEST_CASE("cli: TOML file values, and command-line flags override them") {
  TempToml f(
      "# sft run\n"
      "dataset = \"from_file.jsonl\"\n"
      "pretrain = \"init.h5\"\n"
      "learning_rate = 1e-4\n"
      "max_len = 256\n"
      "adam_betas = [0.85, 0.99]\n"
      "gradient_checkpointing = true\n"
      "adam_offload = true\n"
      "lr_warmup_ratio = 0\n"  // a TOML integer is accepted for a float option
      "save_path = \"/tmp/run1\"\n");
  const ParsedCommand p = parse({"sft", "--config", f.str(), "--learning_rate", "2e-5",
                                 "--adam_offload=false", "--dataset", "cli.jsonl"});
  const app::SftArgs& a = sft(p);
  CHECK(a.common.config == f.str());
  CHECK(a.optim.learning_rate == 2e-5);  // flag beats file
  CHECK(a.data.dataset == "cli.jsonl");  // flag beats file
  CHECK(a.zero.adam_offload == false);   // --flag=false beats `= true`
  CHECK(a.data.max_len == 256);          // file beats default
  CHECK(a.model.pretrain == "init.h5");
  CHECK(a.optim.adam_betas[0] == 0.85);
  CHECK(a.optim.adam_betas[1] == 0.99);
  CHECK(a.zero.gradient_checkpointing == true);
  CHECK(a.optim.lr_warmup_ratio == 0.0);
  CHECK(a.common.log_dir == (std::filesystem::path("/tmp/run1") / "logs").string());
  CHECK(a.loop.train_batch_size == 128);  // neither: default
  CHECK(source_of(p, "learning_rate") == OptionSource::kCommandLine);
  CHECK(source_of(p, "max_len") == OptionSource::kConfigFile);
  CHECK(source_of(p, "train_batch_size") == OptionSource::kDefault);
}

TEST_CASE("cli: bool flags from TOML accept true and false") {
  TempToml on(
      "dataset = \"d\"\npretrain = \"p\"\ngradient_checkpointing = true\n"
      "disable_progress = true\nadam_offload = false\n");
  const app::SftArgs a = sft(parse({"sft", "--config", on.str()}));
  CHECK(a.zero.gradient_checkpointing == true);
  CHECK(a.common.disable_progress == true);
  CHECK(a.zero.adam_offload == false);
  // A bare flag on the command line turns on what the file turned off.
  TempToml off("dataset = \"d\"\npretrain = \"p\"\nadam_offload = false\n");
  CHECK(sft(parse({"sft", "--config", off.str(), "--adam_offload"})).zero.adam_offload == true);
}

TEST_CASE("cli: every sft option can come from TOML") {
  TempToml f(
      "dataset = \"d.jsonl\"\nmodel_config = \"m.toml\"\ninput_key = \"q\"\noutput_key = \"a\"\n"
      "max_len = 64\ntruncation = \"skip\"\nmax_samples = 1000\nmicro_train_batch_size = 2\n"
      "train_batch_size = 16\nmax_epochs = 3\nlearning_rate = 3e-4\nlr_scheduler = \"linear\"\n"
      "lr_warmup_ratio = 0.1\nadam_betas = [0.5, 0.6]\nl2 = 0.01\nmax_norm = 0.5\nseed = 7\n"
      "save_path = \"/tmp/s\"\nsave_steps = 10\nlogging_steps = 5\ngradient_checkpointing = true\n"
      "zero_stage = 0\nadam_offload = true\nranks_per_node = 2\ngen_ranks_per_node = 1\n"
      "threads = 3\nlog_dir = \"/tmp/l\"\nlog_level = \"debug\"\nmax_steps = 9\n"
      "disable_progress = true\nzero_keep_params = true\ncomm_backend = \"mpi\"\n"
      "tokenizer = \"tok.json\"\ndevice = \"cpu\"\nnccl_timeout = 60\n"
      "attn_implementation = \"cudnn\"\ncomm_timeout = 90\nckpt_path = \"/tmp/c\"\n"
      "max_ckpt_num = 4\nload_checkpoint = true\napply_chat_template = true\n"
      "save_hf_ckpt = true\n");
  const ParsedCommand p = parse({"sft", "--config", f.str()});
  const app::SftArgs& a = sft(p);
  CHECK(a.data.dataset == "d.jsonl");
  CHECK(a.model.model_config == "m.toml");
  CHECK(a.input_key == "q");
  CHECK(a.output_key == "a");
  CHECK(a.apply_chat_template);
  CHECK(a.data.max_len == 64);
  CHECK(a.data.truncation == "skip");
  CHECK(a.data.max_samples == 1000);
  CHECK(a.loop.micro_train_batch_size == 2);
  CHECK(a.loop.train_batch_size == 16);
  CHECK(a.loop.max_epochs == 3);
  CHECK(a.optim.learning_rate == 3e-4);
  CHECK(a.optim.lr_scheduler == "linear");
  CHECK(a.optim.lr_warmup_ratio == 0.1);
  CHECK(a.optim.adam_betas == std::array<double, 2>{0.5, 0.6});
  CHECK(a.optim.l2 == 0.01);
  CHECK(a.optim.max_norm == 0.5);
  CHECK(a.common.seed == 7);
  CHECK(a.ckpt.save_path == "/tmp/s");
  CHECK(a.ckpt.save_steps == 10);
  CHECK(a.ckpt.logging_steps == 5);
  CHECK(a.zero.gradient_checkpointing == true);
  CHECK(a.zero.zero_stage == 0);
  CHECK(a.zero.adam_offload == true);
  CHECK(a.parallel.ranks_per_node == 2);
  CHECK(a.parallel.gen_ranks_per_node == 1);
  CHECK(a.parallel.threads == 3);
  CHECK(a.common.log_dir == "/tmp/l");
  CHECK(a.common.log_level == "debug");
  CHECK(a.loop.max_steps == 9);
  CHECK(a.common.disable_progress == true);
  CHECK(a.zero.zero_keep_params == true);
  CHECK(a.parallel.comm_backend == "mpi");
  CHECK(a.model.tokenizer == "tok.json");
  CHECK(a.parallel.device == "cpu");
  CHECK(a.parallel.nccl_timeout == 60);
  CHECK(a.parallel.attn_implementation == "cudnn");
  CHECK(a.parallel.comm_timeout == 90);
  CHECK(a.ckpt.ckpt_path == "/tmp/c");
  CHECK(a.ckpt.max_ckpt_num == 4);
  CHECK(a.ckpt.load_checkpoint == true);
  CHECK(a.ckpt.save_hf_ckpt == true);
  // Every option came from the file, except the file itself and --pretrain (exclusive with
  // --model_config).
  for (const auto& row : p.config) {
    CAPTURE(row.key);
    const OptionSource expected = row.key == "config"     ? OptionSource::kCommandLine
                                  : row.key == "pretrain" ? OptionSource::kDefault
                                                          : OptionSource::kConfigFile;
    CHECK(row.source == expected);
  }
}

TEST_CASE("cli: TOML errors name file:line:column and the key") {
  SUBCASE("unknown key, with a did-you-mean hint") {
    TempToml f("dataset = \"d\"\npretrain = \"p\"\nlerning_rate = 1e-4\n");
    const std::string e = usage_error({"sft", "--config", f.str()});
    CHECK(contains(e, f.str() + ":3:1: unknown key 'lerning_rate' for `rlhf sft`"));
    CHECK(contains(e, "did you mean 'learning_rate'"));
  }
  SUBCASE("unknown key far from any option: no hint") {
    TempToml f("dataset = \"d\"\npretrain = \"p\"\n\nqqqqqqqq = 1\n");
    const std::string e = usage_error({"sft", "--config", f.str()});
    CHECK(contains(e, f.str() + ":4:1: unknown key 'qqqqqqqq'"));
    CHECK(!contains(e, "did you mean"));
  }
  SUBCASE("a string for a number") {
    TempToml f("dataset = \"d\"\npretrain = \"p\"\nlearning_rate = \"fast\"\n");
    const std::string e = usage_error({"sft", "--config", f.str()});
    CHECK(contains(e, f.str() + ":3:17: key 'learning_rate': expected a number, got a string"));
  }
  SUBCASE("a float for an integer") {
    TempToml f("dataset = \"d\"\npretrain = \"p\"\nmax_len = 51.2\n");
    const std::string e = usage_error({"sft", "--config", f.str()});
    CHECK(contains(e, f.str() + ":3:11: key 'max_len': expected an integer, got a float (51.2)"));
  }
  SUBCASE("an integral float for an integer, with a hint") {
    TempToml f("dataset = \"d\"\npretrain = \"p\"\nmax_samples = 1e6\n");
    const std::string e = usage_error({"sft", "--config", f.str()});
    CHECK(contains(e, f.str() + ":3:15: key 'max_samples': expected an integer, got a float"));
    CHECK(contains(e, "hint: write integers without a decimal point or exponent: 1000000"));
  }
  SUBCASE("a table") {
    TempToml f("dataset = \"d\"\npretrain = \"p\"\n[max_norm]\nx = 1\n");
    const std::string e = usage_error({"sft", "--config", f.str()});
    CHECK(contains(e, f.str() + ":3:1: key 'max_norm': expected a number, got a table"));
  }
  SUBCASE("an integer for a bool") {
    TempToml f("dataset = \"d\"\npretrain = \"p\"\nadam_offload = 1\n");
    const std::string e = usage_error({"sft", "--config", f.str()});
    CHECK(contains(e, f.str() + ":3:16: key 'adam_offload': expected true or false"));
  }
  SUBCASE("adam_betas with one element") {
    TempToml f("dataset = \"d\"\npretrain = \"p\"\nadam_betas = [0.9]\n");
    const std::string e = usage_error({"sft", "--config", f.str()});
    CHECK(contains(e, f.str() + ":3:14: key 'adam_betas': expected an array of 2 numbers"));
  }
  SUBCASE("an integer too large for a 32-bit option") {
    TempToml f("dataset = \"d\"\npretrain = \"p\"\nthreads = 10000000000\n");
    const std::string e = usage_error({"sft", "--config", f.str()});
    CHECK(contains(e, f.str() + ":3:11: key 'threads': 10000000000 is out of range"));
  }
  SUBCASE("an out-of-range value") {
    TempToml f("dataset = \"d\"\npretrain = \"p\"\n\nlearning_rate = -1.0\n");
    const std::string e = usage_error({"sft", "--config", f.str()});
    CHECK(contains(e, f.str() + ":4:17: invalid value for 'learning_rate': -1 (must be > 0)"));
  }
  SUBCASE("a value outside a set") {
    TempToml f("dataset = \"d\"\npretrain = \"p\"\nzero_stage = 2\n");
    const std::string e = usage_error({"sft", "--config", f.str()});
    CHECK(contains(e, f.str() + ":3:14: invalid value for 'zero_stage': 2 (must be 0|3)"));
  }
  SUBCASE("an out-of-range value overridden by a valid flag is fine") {
    TempToml f("dataset = \"d\"\npretrain = \"p\"\nmicro_train_batch_size = 0\n");
    CHECK(sft(parse({"sft", "--config", f.str(), "--micro_train_batch_size", "4"}))
              .loop.micro_train_batch_size == 4);
  }
  SUBCASE("a wrong type is an error even when a flag overrides the key") {
    TempToml f("dataset = \"d\"\npretrain = \"p\"\nmax_len = \"long\"\n");
    CHECK(contains(usage_error({"sft", "--config", f.str(), "--max_len", "8"}),
                   f.str() + ":3:11: key 'max_len'"));
  }
  SUBCASE("TOML syntax error") {
    TempToml f("dataset = \"d\"\npretrain = \"p\"\nlearning_rate = = 3\n");
    const std::string e = usage_error({"sft", "--config", f.str()});
    CHECK(contains(e, f.str() + ":3:17: TOML syntax error"));
  }
  SUBCASE("'config' inside a config file") {
    TempToml f("config = \"other.toml\"\n");
    CHECK(contains(usage_error({"sft", "--config", f.str()}),
                   f.str() + ":1:1: 'config' cannot be set inside a config file"));
  }
  SUBCASE("missing file") {
    CHECK(contains(usage_error({"sft", "--config", "/nonexistent/run.toml"}),
                   "--config /nonexistent/run.toml: no such file"));
  }
}

TEST_CASE("cli: command-line errors name the flag") {
  std::vector<std::string> args = kMinimal;
  SUBCASE("unknown flag, with a did-you-mean hint") {
    args.insert(args.end(), {"--lerning_rate", "1e-4"});
    const std::string e = usage_error(args);
    CHECK(contains(e, "unknown option '--lerning_rate' for `rlhf sft`"));
    CHECK(contains(e, "did you mean '--learning_rate'"));
  }
  SUBCASE("out of range") {
    args.insert(args.end(), {"--learning_rate", "-1"});
    CHECK(contains(usage_error(args), "invalid value for --learning_rate: -1 (must be > 0)"));
  }
  SUBCASE("batch size below 1") {
    args.insert(args.end(), {"--train_batch_size", "0"});
    CHECK(contains(usage_error(args), "invalid value for --train_batch_size: 0 (must be >= 1)"));
  }
  SUBCASE("not a number") {
    args.insert(args.end(), {"--max_len", "1.5"});
    CHECK(contains(usage_error(args), "--max_len"));
  }
  SUBCASE("not in the set") {
    args.insert(args.end(), {"--lr_scheduler", "cosine"});
    CHECK(contains(usage_error(args),
                   "invalid value for --lr_scheduler: cosine (must be one of "
                   "cosine_with_min_lr, constant, constant_with_warmup, linear)"));
  }
  SUBCASE("adam_betas needs two values") {
    args.insert(args.end(), {"--adam_betas", "0.9"});
    CHECK(contains(usage_error(args), "--adam_betas"));
  }
  SUBCASE("adam_betas element out of range") {
    args.insert(args.end(), {"--adam_betas", "0.9", "1.0"});
    CHECK(contains(usage_error(args), "invalid value for --adam_betas: 0.9 1 (must be < 1)"));
  }
  SUBCASE("stray positional argument") {
    args.push_back("extra");
    CHECK(contains(usage_error(args), "unexpected argument 'extra'"));
  }
}

TEST_CASE("cli: required options and the model source") {
  CHECK(contains(usage_error({"sft", "--pretrain", "p.h5"}), "--dataset is required"));
  TempToml f("dataset = \"\"\npretrain = \"p\"\n");
  CHECK(contains(usage_error({"sft", "--config", f.str()}), "--dataset is required"));
  CHECK(contains(usage_error({"sft", "--dataset", "d"}),
                 "exactly one of --model_config (random init) and --pretrain (checkpoint) is "
                 "required, got neither"));
  CHECK(contains(usage_error({"sft", "--dataset", "d", "--pretrain", "p", "--model_config", "m"}),
                 "got both"));
}

TEST_CASE("cli: ranks_per_node from RLHF_RANKS_PER_NODE") {
  {
    ScopedEnv env("RLHF_RANKS_PER_NODE", "4");
    const ParsedCommand p = parse(kMinimal);
    CHECK(sft(p).parallel.ranks_per_node == 4);
    CHECK(source_of(p, "ranks_per_node") == OptionSource::kEnvironment);
    std::vector<std::string> args = kMinimal;
    args.insert(args.end(), {"--ranks_per_node", "2"});
    CHECK(sft(parse(args)).parallel.ranks_per_node == 2);  // the flag wins
    TempToml f("dataset = \"d\"\npretrain = \"p\"\nranks_per_node = 3\n");
    CHECK(sft(parse({"sft", "--config", f.str()})).parallel.ranks_per_node == 3);  // file wins
  }
  {
    ScopedEnv env("RLHF_RANKS_PER_NODE", "two");
    CHECK(contains(usage_error(kMinimal), "environment variable RLHF_RANKS_PER_NODE"));
  }
  {
    ScopedEnv env("RLHF_RANKS_PER_NODE", "-3");
    CHECK(contains(usage_error(kMinimal),
                   "invalid value for --ranks_per_node from environment "
                   "variable RLHF_RANKS_PER_NODE: -3 (must be >= 0)"));
  }
}

TEST_CASE("cli: help, version, subcommands") {
  const ParsedCommand h = parse({"sft", "--help"});
  REQUIRE(h.action == ParsedCommand::Action::kPrintHelp);
  CHECK(contains(h.text, "--learning_rate FLOAT=5e-06"));
  CHECK(contains(h.text, "--max_len INT=512"));
  CHECK(contains(h.text, "--adam_betas [FLOAT,FLOAT]=[0.9,0.95]"));
  CHECK(contains(h.text, "--gradient_checkpointing=false"));
  CHECK(contains(h.text, "--config"));
  // Every option of the parsed command appears in its help.
  for (const auto& row : parse(kMinimal).config) CHECK(contains(h.text, "--" + row.key));

  const ParsedCommand top = parse({"--help"});
  REQUIRE(top.action == ParsedCommand::Action::kPrintHelp);
  for (const char* name : app::kCommandNames) CHECK(contains(top.text, name));

  const ParsedCommand v = parse({"--version"});
  CHECK(v.action == ParsedCommand::Action::kPrintVersion);
  CHECK(contains(v.text, RLHF_VERSION));

  CHECK(contains(usage_error({}), "subcommand"));
  const std::string e = usage_error({"sfft"});
  CHECK(contains(e, "unknown subcommand 'sfft'"));
  CHECK(contains(e, "did you mean 'sft'"));

  // Every subcommand accepts --config and the common options.
  for (size_t i = 0; i < app::kCommandNames.size(); ++i) {
    TempToml f("seed = 3\nlog_level = \"warn\"\n");
    std::vector<std::string> args = {app::kCommandNames[i], "--config", f.str()};
    const std::string name = app::kCommandNames[i];
    if (name == "sft" || name == "rm")
      args.insert(args.end(), {"--dataset", "d", "--pretrain", "p"});
    if (name == "ppo" || name == "grpo")
      args.insert(args.end(), {"--prompt_data", "d", "--pretrain", "p", "--reward", "length",
                               "--n_samples_per_prompt", "4"});
    if (name == "generate" || name == "score")
      args.insert(args.end(), {"--dataset", "d", "--pretrain", "p", "--output_path", "o"});
    if (name == "eval")
      args.insert(args.end(), {"--dataset", "d", "--pretrain", "p", "--output_path", "o",
                               "--reward", "math", "--label_key", "label"});
    if (name == "export" || name == "import")
      args.insert(args.end(), {"--pretrain", "p", "--output_path", "o"});
    const ParsedCommand p = parse(args);
    CHECK(p.command == app::kCommandNames[i]);
    CHECK(p.args.index() == i);
    CHECK(p.common().seed == 3);
    CHECK(p.common().log_level == "warn");
    if (i != 0) CHECK(contains(usage_error({app::kCommandNames[i], "--bogus"}), "--bogus"));
  }
}

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

TEST_CASE("cli: generate options, defaults and checks") {
  const std::vector<std::string> base = {"generate", "--pretrain",    "ck",       "--dataset",
                                         "p.jsonl",  "--output_path", "out.jsonl"};
  const ParsedCommand p = parse(base);
  const auto& g = std::get<app::GenerateArgs>(p.args);
  CHECK(g.input_key == "input");
  CHECK(g.gen.generate_max_len == 1024);
  CHECK(g.gen.temperature == 1.0);
  CHECK(g.gen.top_p == 1.0);
  CHECK(g.gen.top_k == -1);
  CHECK_FALSE(g.gen.greedy);
  CHECK(g.gen.n_samples_per_prompt == 1);
  CHECK(g.gen.gen_kv_cache_mb == 1024);
  auto with = [&](std::initializer_list<std::string> extra) {
    std::vector<std::string> a = base;
    a.insert(a.end(), extra);
    return a;
  };
  const ParsedCommand q = parse(with({"--top_p", "0.9", "--top_k", "50", "--greedy",
                                      "--n_samples_per_prompt", "4", "--temperature", "0.7"}));
  const auto& h = std::get<app::GenerateArgs>(q.args);
  CHECK(h.gen.top_p == 0.9);
  CHECK(h.gen.top_k == 50);
  CHECK(h.gen.greedy);
  CHECK(h.gen.n_samples_per_prompt == 4);
  CHECK(h.gen.temperature == 0.7);
  CHECK(contains(usage_error(with({"--top_p", "1.5"})), "--top_p"));
  CHECK(contains(usage_error(with({"--top_p", "0"})), "--top_p"));
  CHECK(contains(usage_error(with({"--top_k", "-2"})), "--top_k"));
  CHECK(contains(usage_error(with({"--temperature", "-0.1"})), "--temperature"));
  CHECK(contains(usage_error(with({"--gen_kv_cache_mb", "0"})), "--gen_kv_cache_mb"));
  CHECK(contains(usage_error({"generate", "--dataset", "p.jsonl", "--output_path", "o"}),
                 "--pretrain is required"));
}

namespace {

const std::vector<std::string> kGrpo = {"grpo",    "--prompt_data",
                                        "d.jsonl", "--pretrain",
                                        "p.h5",    "--reward",
                                        "math",    "--label_key",
                                        "label",   "--n_samples_per_prompt",
                                        "4",       "--rollout_batch_size",
                                        "32"};

std::vector<std::string> with(std::vector<std::string> base,
                              std::initializer_list<std::string> extra) {
  base.insert(base.end(), extra);
  return base;
}

}  // namespace

TEST_CASE("cli: grpo/ppo reasoning-RL flags: defaults") {
  const ParsedCommand p = parse(kGrpo);
  const auto& a = std::get<app::GrpoArgs>(p.args);
  CHECK_FALSE(a.dynamic_filtering);
  CHECK(a.dynamic_filtering_reward_range == std::array<double, 2>{0.0, 1.0});
  CHECK(a.max_num_gen_batches == 4);
  CHECK(a.overlong_buffer_len == 0);
  CHECK(a.overlong_penalty_factor == 1.0);
  CHECK(a.policy_loss_type == "ppo");
  CHECK(a.loss_agg_mode == "token-mean");
  CHECK_FALSE(a.no_advantage_std_norm);
  CHECK(a.eval_dataset == "");
  CHECK(a.eval_steps == -1);
  CHECK(a.eval_temperature == 0.6);
  CHECK(a.eval_n_samples_per_prompt == 4);
  CHECK_FALSE(a.eval_before_training);
  CHECK(a.log_completions == 0);
  // GRPO's presets are unchanged.
  CHECK(a.advantage_estimator == "group_norm");
  CHECK(a.use_kl_loss);
  CHECK(a.kl_estimator == "k3");
  CHECK(a.ckpt.ckpt_path == "./ckpt/checkpoints_grpo");
  // ppo has the same flags and defaults.
  const ParsedCommand q =
      parse({"ppo", "--prompt_data", "d", "--pretrain", "p", "--reward", "length"});
  const auto& b = std::get<app::PpoArgs>(q.args);
  CHECK(b.policy_loss_type == "ppo");
  CHECK(b.loss_agg_mode == "token-mean");
  CHECK(b.max_num_gen_batches == 4);
  CHECK(b.eval_n_samples_per_prompt == 4);
}

TEST_CASE("cli: grpo/ppo reasoning-RL flags: values from flags and TOML") {
  const ParsedCommand p = parse(with(kGrpo, {"--dynamic_filtering",
                                             "--dynamic_filtering_reward_range",
                                             "0.1",
                                             "0.9",
                                             "--max_num_gen_batches",
                                             "8",
                                             "--overlong_buffer_len",
                                             "256",
                                             "--overlong_penalty_factor",
                                             "0.5",
                                             "--policy_loss_type",
                                             "gspo",
                                             "--loss_agg_mode",
                                             "seq-mean-token-sum-norm",
                                             "--no_advantage_std_norm",
                                             "--eval_dataset",
                                             "e.jsonl",
                                             "--eval_steps",
                                             "10",
                                             "--eval_temperature",
                                             "0",
                                             "--eval_n_samples_per_prompt",
                                             "8",
                                             "--eval_before_training",
                                             "--log_completions",
                                             "5"}));
  const auto& a = std::get<app::GrpoArgs>(p.args);
  CHECK(a.dynamic_filtering);
  CHECK(a.dynamic_filtering_reward_range == std::array<double, 2>{0.1, 0.9});
  CHECK(a.max_num_gen_batches == 8);
  CHECK(a.overlong_buffer_len == 256);
  CHECK(a.overlong_penalty_factor == 0.5);
  CHECK(a.policy_loss_type == "gspo");
  CHECK(a.loss_agg_mode == "seq-mean-token-sum-norm");
  CHECK(a.no_advantage_std_norm);
  CHECK(a.eval_dataset == "e.jsonl");
  CHECK(a.eval_steps == 10);
  CHECK(a.eval_temperature == 0.0);
  CHECK(a.eval_n_samples_per_prompt == 8);
  CHECK(a.eval_before_training);
  CHECK(a.log_completions == 5);
  for (const char* mode : {"token-mean", "seq-mean-token-mean", "seq-mean-token-sum"})
    CHECK(
        std::get<app::GrpoArgs>(parse(with(kGrpo, {"--loss_agg_mode", mode})).args).loss_agg_mode ==
        mode);

  TempToml f(
      "prompt_data = \"d\"\npretrain = \"p\"\nreward = \"math\"\nlabel_key = \"label\"\n"
      "n_samples_per_prompt = 4\nrollout_batch_size = 32\ndynamic_filtering = true\n"
      "dynamic_filtering_reward_range = [-1, 0.5]\nmax_num_gen_batches = 2\n"
      "overlong_buffer_len = 16\noverlong_penalty_factor = 2\npolicy_loss_type = \"gspo\"\n"
      "loss_agg_mode = \"seq-mean-token-mean\"\nno_advantage_std_norm = true\n"
      "eval_dataset = \"e\"\neval_steps = 3\neval_temperature = 1.0\n"
      "eval_n_samples_per_prompt = 2\neval_before_training = true\nlog_completions = 1\n");
  const ParsedCommand q = parse({"grpo", "--config", f.str()});
  const auto& b = std::get<app::GrpoArgs>(q.args);
  CHECK(b.dynamic_filtering);
  CHECK(b.dynamic_filtering_reward_range == std::array<double, 2>{-1.0, 0.5});
  CHECK(b.max_num_gen_batches == 2);
  CHECK(b.overlong_buffer_len == 16);
  CHECK(b.overlong_penalty_factor == 2.0);
  CHECK(b.policy_loss_type == "gspo");
  CHECK(b.loss_agg_mode == "seq-mean-token-mean");
  CHECK(b.no_advantage_std_norm);
  CHECK(b.eval_dataset == "e");
  CHECK(b.eval_steps == 3);
  CHECK(b.eval_temperature == 1.0);
  CHECK(b.eval_n_samples_per_prompt == 2);
  CHECK(b.eval_before_training);
  CHECK(b.log_completions == 1);
  CHECK(source_of(q, "dynamic_filtering_reward_range") == OptionSource::kConfigFile);
  CHECK(source_of(q, "loss_agg_mode") == OptionSource::kConfigFile);
}

TEST_CASE("cli: grpo/ppo reasoning-RL flags: usage errors name the flag") {
  CHECK(contains(usage_error(with(kGrpo, {"--dynamic_filtering_reward_range", "0.5", "0.5"})),
                 "--dynamic_filtering_reward_range 0.5 0.5: lo must be < hi"));
  CHECK(contains(usage_error(with(kGrpo, {"--dynamic_filtering_reward_range", "1", "0"})),
                 "--dynamic_filtering_reward_range"));
  CHECK(contains(usage_error(with(kGrpo, {"--dynamic_filtering_reward_range", "1"})),
                 "--dynamic_filtering_reward_range"));
  CHECK(contains(usage_error(with(kGrpo, {"--max_num_gen_batches", "0"})),
                 "invalid value for --max_num_gen_batches: 0 (must be >= 1)"));
  CHECK(contains(usage_error(with(kGrpo, {"--overlong_buffer_len", "-1"})),
                 "invalid value for --overlong_buffer_len: -1 (must be >= 0)"));
  CHECK(contains(usage_error(with(kGrpo, {"--overlong_buffer_len", "1024"})),
                 "--overlong_buffer_len 1024 must be < --generate_max_len 1024"));
  CHECK(
      contains(usage_error(with(kGrpo, {"--overlong_buffer_len", "8", "--generate_max_len", "8"})),
               "--overlong_buffer_len 8 must be < --generate_max_len 8"));
  CHECK(std::get<app::GrpoArgs>(
            parse(with(kGrpo, {"--overlong_buffer_len", "7", "--generate_max_len", "8"})).args)
            .overlong_buffer_len == 7);
  CHECK(contains(usage_error(with(kGrpo, {"--overlong_penalty_factor", "-0.5"})),
                 "invalid value for --overlong_penalty_factor: -0.5 (must be >= 0)"));
  CHECK(contains(usage_error(with(kGrpo, {"--policy_loss_type", "grpo"})),
                 "invalid value for --policy_loss_type: grpo (must be one of ppo, gspo)"));
  CHECK(contains(usage_error(with(kGrpo, {"--loss_agg_mode", "seq-mean"})),
                 "invalid value for --loss_agg_mode: seq-mean (must be one of token-mean, "
                 "seq-mean-token-mean, seq-mean-token-sum, seq-mean-token-sum-norm)"));
  CHECK(contains(usage_error(with(kGrpo, {"--eval_steps", "0"})),
                 "invalid value for --eval_steps: 0 (must be -1 or >= 1)"));
  CHECK(contains(usage_error(with(kGrpo, {"--eval_temperature", "-1"})),
                 "invalid value for --eval_temperature"));
  CHECK(contains(usage_error(with(kGrpo, {"--eval_n_samples_per_prompt", "0"})),
                 "invalid value for --eval_n_samples_per_prompt: 0 (must be >= 1)"));
  CHECK(contains(usage_error(with(kGrpo, {"--log_completions", "-1"})),
                 "invalid value for --log_completions: -1 (must be >= 0)"));
  // --eval_* without --eval_dataset: ignored; --eval_before_training without it: an error.
  const ParsedCommand p = parse(with(
      kGrpo, {"--eval_steps", "5", "--eval_temperature", "1", "--eval_n_samples_per_prompt", "2"}));
  CHECK(std::get<app::GrpoArgs>(p.args).eval_dataset == "");
  const std::string e = usage_error(with(kGrpo, {"--eval_before_training"}));
  CHECK(contains(e, "--eval_before_training"));
  CHECK(contains(e, "--eval_dataset"));
  CHECK(usage_error(with(kGrpo, {"--eval_before_training", "--eval_dataset", "e"})).empty());
  // Evaluation checks answers with the rule reward: a reward model alone cannot.
  CHECK(contains(usage_error({"ppo", "--prompt_data", "d", "--pretrain", "p", "--reward_pretrain",
                              "rm.h5", "--eval_dataset", "e"}),
                 "--eval_dataset needs a rule --reward"));
}

TEST_CASE("cli: the reward flags are one group of ppo, grpo and eval") {
  const std::vector<std::string> ev = {"eval",      "--pretrain", "ck",
                                       "--dataset", "p.jsonl",    "--output_path",
                                       "o.jsonl",   "--reward",   "length"};
  for (const std::vector<std::string>& base :
       {with(kGrpo, {}),
        std::vector<std::string>{"ppo", "--prompt_data", "d", "--pretrain", "p", "--reward",
                                 "length"},
        ev}) {
    const std::string cmd = base[0];
    CAPTURE(cmd);
    const ParsedCommand p = parse(base);
    const app::RewardArgs& r = std::visit(
        [](const auto& a) -> const app::RewardArgs& {
          if constexpr (requires { a.rewards; })
            return a.rewards;
          else
            throw std::logic_error("no rewards");
        },
        p.args);
    CHECK(r.reward_command == "");
    CHECK(r.reward_command_timeout == 60);
    CHECK(r.reward_format_pattern == R"(<think>[\s\S]*</think>\s*<answer>[\s\S]*</answer>)");
    CHECK(r.reward_length_target == 64);
    for (const char* key : {"reward", "reward_command", "reward_command_timeout",
                            "reward_format_pattern", "reward_keywords", "reward_length_target"})
      CHECK(contains(parse({cmd, "--help"}).text, std::string("--") + key));
    // Same checks everywhere.
    CHECK(contains(usage_error(with(base, {"--reward_command_timeout", "0"})),
                   "invalid value for --reward_command_timeout: 0 (must be > 0)"));
    CHECK(contains(usage_error(with(base, {"--reward_length_target", "0"})),
                   "invalid value for --reward_length_target: 0 (must be >= 1)"));
    // The TOML keys are the flag names.
    TempToml f(
        "reward = \"keyword\"\nreward_keywords = \"x,y\"\nreward_length_target = 7\n"
        "reward_command = \"./s.sh\"\nreward_command_timeout = 5\n"
        "reward_format_pattern = \"<a>\"\n");
    const ParsedCommand q = parse(with(base, {"--config", f.str(), "--reward", "keyword"}));
    const app::RewardArgs& s = std::visit(
        [](const auto& a) -> const app::RewardArgs& {
          if constexpr (requires { a.rewards; })
            return a.rewards;
          else
            throw std::logic_error("no rewards");
        },
        q.args);
    CHECK(s.reward == "keyword");
    CHECK(s.reward_keywords == "x,y");
    CHECK(s.reward_length_target == 7);
    CHECK(s.reward_command == "./s.sh");
    CHECK(s.reward_command_timeout == 5);
    CHECK(s.reward_format_pattern == "<a>");
  }
  CHECK(contains(usage_error(with(kGrpo, {"--label_key", ""})), "--reward math needs --label_key"));
  CHECK(contains(usage_error({"ppo", "--prompt_data", "d", "--pretrain", "p"}),
                 "no reward: give --reward"));
}

TEST_CASE("cli: eval options, defaults and usage errors") {
  const std::vector<std::string> base = {"eval",    "--pretrain",    "ck",        "--dataset",
                                         "p.jsonl", "--output_path", "out.jsonl", "--reward",
                                         "math",    "--label_key",   "answer"};
  const ParsedCommand p = parse(base);
  REQUIRE(p.command == "eval");
  const auto& a = std::get<app::EvalArgs>(p.args);
  CHECK(a.pretrain == "ck");
  CHECK(a.dataset == "p.jsonl");
  CHECK(a.output_path == "out.jsonl");
  CHECK(a.rewards.reward == "math");
  CHECK(a.label_key == "answer");
  CHECK(a.input_key == "input");
  CHECK(a.tokenizer == "");
  CHECK_FALSE(a.apply_chat_template);
  CHECK(a.prompt_max_len == 1024);
  CHECK(a.max_samples == 100000000);
  // Generation and placement flags as `rlhf generate`'s.
  CHECK(a.gen.generate_max_len == 1024);
  CHECK(a.gen.temperature == 1.0);
  CHECK(a.gen.n_samples_per_prompt == 1);
  CHECK(a.gen.vllm_tensor_parallel_size == 1);
  CHECK(a.parallel.gen_ranks_per_node == 0);
  const ParsedCommand q = parse(with(base, {"--n_samples_per_prompt",
                                            "8",
                                            "--temperature",
                                            "0.6",
                                            "--top_p",
                                            "0.9",
                                            "--generate_max_len",
                                            "64",
                                            "--max_samples",
                                            "10",
                                            "--prompt_max_len",
                                            "32",
                                            "--apply_chat_template",
                                            "--input_key",
                                            "question",
                                            "--gen_ranks_per_node",
                                            "1",
                                            "--vllm_tensor_parallel_size",
                                            "2",
                                            "--seed",
                                            "5"}));
  const auto& b = std::get<app::EvalArgs>(q.args);
  CHECK(b.gen.n_samples_per_prompt == 8);
  CHECK(b.gen.temperature == 0.6);
  CHECK(b.gen.top_p == 0.9);
  CHECK(b.gen.generate_max_len == 64);
  CHECK(b.max_samples == 10);
  CHECK(b.prompt_max_len == 32);
  CHECK(b.apply_chat_template);
  CHECK(b.input_key == "question");
  CHECK(b.parallel.gen_ranks_per_node == 1);
  CHECK(b.gen.vllm_tensor_parallel_size == 2);
  CHECK(b.common.seed == 5);

  // Missing required options name the flag.
  const auto without = [&](const std::string& flag) {
    std::vector<std::string> out;
    for (size_t i = 0; i < base.size(); ++i) {
      if (base[i] == flag) {
        ++i;
        continue;
      }
      out.push_back(base[i]);
    }
    return out;
  };
  CHECK(contains(usage_error(without("--pretrain")), "--pretrain is required"));
  CHECK(contains(usage_error(without("--dataset")), "--dataset is required"));
  CHECK(contains(usage_error(without("--output_path")), "--output_path is required"));
  CHECK(contains(usage_error(without("--reward")), "--reward is required"));
  CHECK(contains(usage_error(without("--label_key")), "--reward math needs --label_key"));
  CHECK(
      contains(usage_error(with(base, {"--n_samples_per_prompt", "0"})), "--n_samples_per_prompt"));
  CHECK(contains(usage_error(with(base, {"--top_p", "1.5"})), "--top_p"));
  CHECK(contains(usage_error(with(base, {"--prompt_max_len", "0"})), "--prompt_max_len"));
  // Training flags are not eval's.
  const std::string e = usage_error(with(base, {"--actor_learning_rate", "1e-6"}));
  CHECK(contains(e, "unknown option '--actor_learning_rate' for `rlhf eval`"));
  // Every option appears in the help.
  const ParsedCommand h = parse({"eval", "--help"});
  for (const auto& row : p.config) CHECK(contains(h.text, "--" + row.key));
  CHECK(contains(parse({"--help"}).text, "eval"));
}

TEST_CASE("cli: reward_options maps the reward flags") {
  app::RewardArgs r;
  r.reward_keywords = "alpha,,beta,";
  r.reward_length_target = 9;
  r.reward_command = "./score";
  r.reward_command_timeout = 3;
  r.reward_format_pattern = "<x>";
  const rl::RewardOptions o = app::reward_options(r);
  CHECK(o.keywords == std::vector<std::string>{"alpha", "beta"});
  CHECK(o.length_target == 9);
  CHECK(o.command == "./score");
  CHECK(o.command_timeout_s == 3);
  CHECK(o.format_pattern == "<x>");
  CHECK(app::split_commas("").empty());
  CHECK(app::split_commas("a") == std::vector<std::string>{"a"});
}

TEST_CASE("cli: a TRL option name says which rlhf flag means the same") {
  const std::vector<std::string> base = {
      "grpo",   "--prompt_data",          "d", "--pretrain", "p", "--reward",
      "length", "--n_samples_per_prompt", "4"};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> a = base;
    a.insert(a.end(), extra.begin(), extra.end());
    return usage_error(a);
  };
  CHECK(contains(with({"--num_generations", "8"}),
                 "unknown option '--num_generations' for `rlhf grpo`\nhint: TRL's "
                 "--num_generations is --n_samples_per_prompt in rlhf"));
  CHECK(contains(with({"--beta=0.04"}), "TRL's --beta is --init_kl_coef"));
  CHECK(contains(with({"--max_completion_length", "256"}), "--generate_max_len"));
  // Every rlhf flag a table row names exists in some subcommand's help.
  std::string all_help;
  for (const char* name : app::kCommandNames) all_help += parse({name, "--help"}).text;
  for (const app::TrlName& n : app::trl_names()) {
    const std::string trl = n.trl;
    CAPTURE(trl);
    const std::string r = n.rlhf;
    for (size_t p = r.find("--"); p != std::string::npos; p = r.find("--", p + 2)) {
      const std::string flag = r.substr(p, r.find_first_of(" ,)", p) - p);
      CAPTURE(flag);
      CHECK((contains(all_help, flag + " ") || contains(all_help, flag + "=")));
    }
  }
  // Other unknown names still get the closest flag.
  CHECK(contains(with({"--save_pat", "1"}), "did you mean '--save_path'"));
  CHECK(contains(with({"--learning_rate", "1e-6"}), "--actor_learning_rate"));
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
  CHECK(contains(usage_error(with({"--env_command", "x", "--device", "cuda"})), "--env_command"));
  CHECK(contains(usage_error(with({"--env_command", "x", "--vllm_tensor_parallel_size", "2"})),
                 "--env_command"));
  CHECK(contains(usage_error(with({"--env_max_turns", "0"})), "--env_max_turns"));
  // grpo without --reward is fine when an environment gives rewards.
  const ParsedCommand r = parse({"grpo", "--model_config", "m.toml", "--prompt_data", "p.jsonl",
                                 "--n_samples_per_prompt", "2", "--env_command", "builtin:toy"});
  CHECK(std::get<app::GrpoArgs>(r.args).gen.env_command == "builtin:toy");
}
