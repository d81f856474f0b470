// The command line in-process, sft and the options every subcommand shares: defaults, flags,
// TOML files, precedence, the environment, help and version, and every error kind with the
// location it must name. The expected values are the literals of the specification (OpenRLHF
// names and defaults), written out here independently of the structs' initialisers.
#include <doctest/doctest.h>
#include <unistd.h>

#include <array>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <sstream>
#include <string>
#include <variant>
#include <vector>

#include "app/cli.h"
#include "tests/cli_test_util.h"

using namespace rlhf;
using namespace rlhf::cli_test;
using app::OptionSource;
using app::ParsedCommand;

namespace {

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

/// Splits a command line on spaces.
std::vector<std::string> split(const std::string& line) {
  std::vector<std::string> out;
  std::istringstream is(line);
  for (std::string w; is >> w;) out.push_back(w);
  return out;
}

/// The SftArgs of a parsed `sft` command line.
const app::SftArgs& sft(const ParsedCommand& p) {
  return std::get<app::SftArgs>(p.args);
}

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
      "zero_stage = 0\nadam_offload = true\nranks_per_node = 2\n"
      "threads = 3\nlog_dir = \"/tmp/l\"\nlog_level = \"debug\"\nmax_steps = 9\n"
      "disable_progress = true\nzero_keep_params = true\ncomm_backend = \"mpi\"\n"
      "tokenizer = \"tok.json\"\ndevice = \"cpu\"\nnccl_timeout = 60\n"
      "attn_implementation = \"cudnn\"\ncomm_timeout = 90\nckpt_path = \"/tmp/c\"\n"
      "max_ckpt_num = 4\nload_checkpoint = true\napply_chat_template = true\n"
      "save_hf_ckpt = true\nckpt_format = \"sharded\"\n"
      "use_tensorboard = \"/tmp/tb\"\nuse_wandb = \"false\"\n"
      "wandb_project = \"p\"\nwandb_group = \"g\"\nwandb_run_name = \"r\"\nwandb_org = \"o\"\n"
      "param_dtype = \"fp32\"\nbf16 = false\nlora_rank = 8\nlora_alpha = 32\n"
      "target_modules = \"q_proj,v_proj\"\nlora_path = \"/tmp/adapter\"\nlora_dropout = 0\n"
      "packing_samples = true\n");
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
  // sft has no generation ranks: the option is not even offered.
  CHECK(contains(
      usage_error({"sft", "--dataset", "d", "--pretrain", "p", "--gen_ranks_per_node", "1"}),
      "unknown option '--gen_ranks_per_node'"));
  CHECK(a.parallel.threads == 3);
  CHECK(a.common.log_dir == "/tmp/l");
  CHECK(a.common.log_level == "debug");
  CHECK(a.loop.max_steps == 9);
  CHECK(a.common.disable_progress == true);
  CHECK(a.zero.zero_keep_params == true);
  CHECK(a.zero.packing_samples == true);
  CHECK(a.parallel.comm_backend == "mpi");
  CHECK(a.model.tokenizer == "tok.json");
  CHECK(a.parallel.device == "cpu");
  CHECK(a.parallel.nccl_timeout == 60);
  CHECK(a.parallel.attn_implementation == "cudnn");
  CHECK(a.parallel.param_dtype == "fp32");
  CHECK(a.parallel.comm_timeout == 90);
  CHECK(a.ckpt.ckpt_path == "/tmp/c");
  CHECK(a.ckpt.max_ckpt_num == 4);
  CHECK(a.ckpt.load_checkpoint == true);
  CHECK(a.ckpt.save_hf_ckpt == true);
  CHECK(a.tracking.use_tensorboard == "/tmp/tb");
  CHECK(a.tracking.use_wandb == "false");
  CHECK(a.tracking.wandb_project == "p");
  CHECK(a.tracking.wandb_group == "g");
  CHECK(a.tracking.wandb_run_name == "r");
  CHECK(a.tracking.wandb_org == "o");
  CHECK(a.lora.lora_rank == 8);
  CHECK(a.lora.lora_alpha == 32);
  CHECK(a.lora.target_modules == "q_proj,v_proj");
  CHECK(a.lora.lora_path == "/tmp/adapter");
  CHECK(a.lora.lora_dropout == 0);
  CHECK(a.ckpt.ckpt_format == "sharded");
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
    const std::string name = app::kCommandNames[i];
    const bool seeded = name != "export" && name != "import";  // they draw no random numbers
    TempToml f(seeded ? "seed = 3\nlog_level = \"warn\"\n" : "log_level = \"warn\"\n");
    std::vector<std::string> args = {app::kCommandNames[i], "--config", f.str()};
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
    CHECK(p.common().seed == (seeded ? 3 : 42));
    if (!seeded) CHECK(contains(usage_error({name, "--seed", "1"}), "unknown option '--seed'"));
    CHECK(p.common().log_level == "warn");
    if (i != 0) CHECK(contains(usage_error({app::kCommandNames[i], "--bogus"}), "--bogus"));
  }
}
