// The command line in-process, per subcommand: generate's options, grpo/ppo's reasoning-RL flags,
// the reward flags shared by ppo, grpo and eval, eval's options, reward_options, and the hint a
// TRL option name gets. Defaults, values from flags and TOML, and usage errors that name the flag.
#include <doctest/doctest.h>

#include <array>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <variant>
#include <vector>

#include "app/cli.h"
#include "app/runtime.h"
#include "app/trl_names.h"
#include "tests/cli_test_util.h"

using namespace rlhf;
using namespace rlhf::cli_test;
using app::OptionSource;
using app::ParsedCommand;

namespace {

/// A valid grpo command line: math reward, 4 samples per prompt, 32 rollouts per batch.
const std::vector<std::string> kGrpo = {"grpo",    "--prompt_data",
                                        "d.jsonl", "--pretrain",
                                        "p.h5",    "--reward",
                                        "math",    "--label_key",
                                        "label",   "--n_samples_per_prompt",
                                        "4",       "--rollout_batch_size",
                                        "32"};

/// `base` with `extra` appended.
std::vector<std::string> with(std::vector<std::string> base,
                              std::initializer_list<std::string> extra) {
  base.insert(base.end(), extra);
  return base;
}

}  // namespace

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

TEST_CASE("cli: rlhf bench refuses --packing_samples, which none of its suites would use") {
  const std::string e = usage_error({"bench", "train", "--packing_samples"});
  CHECK(contains(e, "--packing_samples has no effect on rlhf bench"));
  CHECK(contains(e, "rlhf bench packing"));
  CHECK(std::holds_alternative<app::BenchArgs>(parse({"bench", "packing"}).args));
}
