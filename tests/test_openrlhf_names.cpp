// OpenRLHF's namespaced names (app/openrlhf_names.h) and TRL's habits on the command line: the
// flags of OpenRLHF v0.11's four example scripts, as written (tests/fixtures/openrlhf), must parse
// in `rlhf ppo` (>= 90%, placement flags aside) and mean what they mean there.
#include <doctest/doctest.h>

#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "app/openrlhf_names.h"
#include "cli_test_util.h"
#include "core/error.h"
#include "rl/prompts.h"

namespace rlhf {

using cli_test::contains;
using cli_test::parse;
using cli_test::TempToml;
using cli_test::usage_error;

namespace {

/// One flag of a script with its values, e.g. {"--algo.dynamic_filtering_range", "0", "1"}.
using Flag = std::vector<std::string>;

/// script name -> its flags, in order.
std::map<std::string, std::vector<Flag>> read_scripts() {
  std::ifstream in(std::string(RLHF_SOURCE_DIR) +
                   "/tests/fixtures/openrlhf/v0.11_example_flags.txt");
  REQUIRE(in.good());
  std::map<std::string, std::vector<Flag>> out;
  std::string line, script;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    if (line[0] == '[') {
      script = line.substr(1, line.find(']') - 1);
      continue;
    }
    std::istringstream is(line);
    Flag f;
    for (std::string w; is >> w;) f.push_back(w);
    REQUIRE(!script.empty());
    out[script].push_back(f);
  }
  return out;
}

/// Ray / vLLM placement flags: rlhf places ranks with mpirun/srun, so these are left out of the
/// count (each refused or ignored with its reason, checked below).
const std::map<std::string, const char*> kPlacement = {
    {"--actor.num_nodes", "Ray placement group (rlhf: mpirun/srun -n)"},
    {"--actor.num_gpus_per_node", "Ray placement group (rlhf: mpirun/srun -n)"},
    {"--ref.num_nodes", "Ray placement group (rlhf: the reference lives with the actor)"},
    {"--ref.num_gpus_per_node", "Ray placement group (rlhf: the reference lives with the actor)"},
    {"--critic.num_nodes", "Ray placement group"},
    {"--critic.num_gpus_per_node", "Ray placement group"},
    {"--reward.num_nodes", "Ray placement group"},
    {"--reward.num_gpus_per_node", "Ray placement group"},
    {"--vllm.num_engines", "vLLM engine count (rlhf: --gen_ranks_per_node)"},
    {"--vllm.sync_backend", "Ray/vLLM weight-sync transport"},
    {"--ds.enable_sleep", "DeepSpeed sleep mode between colocated Ray actors"},
    {"--train.colocate_all", "Ray placement of every model on the same GPUs"},
};

const std::vector<std::string> kBase = {"ppo",     "--pretrain", "p.h5",  "--prompt_data",
                                        "d.jsonl", "--reward",   "length"};
const std::vector<std::string> kGroup = {"--advantage_estimator", "group_norm",
                                         "--n_samples_per_prompt", "8"};

/// "" when `flag` parses in `rlhf ppo` (alone, on the smallest command line or on one with a
/// group estimator), else the error of the first.
std::string try_flag(const Flag& flag) {
  std::vector<std::string> a = kBase;
  a.insert(a.end(), flag.begin(), flag.end());
  const std::string first = usage_error(a);
  if (first.empty()) return "";
  a.insert(a.end() - long(flag.size()), kGroup.begin(), kGroup.end());
  return usage_error(a).empty() ? "" : first;
}

}  // namespace

TEST_CASE("openrlhf: >= 90% of the v0.11 example scripts' training flags parse as written") {
  const auto scripts = read_scripts();
  REQUIRE(scripts.size() == 4);
  int total = 0, accepted = 0;
  for (const auto& [script, flags] : scripts) {
    int n = 0, ok = 0;
    std::vector<std::string> refused;
    for (const Flag& f : flags) {
      if (kPlacement.count(f[0])) continue;
      ++n;
      const std::string err = try_flag(f);
      if (err.empty()) {
        ++ok;
        continue;
      }
      refused.push_back(f[0]);
      // A refused OpenRLHF name says why (the table's reason), not a guessed neighbour.
      CHECK_MESSAGE(contains(err, "OpenRLHF's " + f[0]), err);
      CHECK_MESSAGE(!contains(err, "did you mean"), err);
    }
    MESSAGE(script << ": " << ok << " of " << n
                   << " accepted; refused: " << fmt::format("{}", fmt::join(refused, " ")));
    total += n;
    accepted += ok;
  }
  MESSAGE("all four scripts: " << accepted << " of " << total);
  CHECK(total >= 150);
  CHECK(accepted * 10 >= total * 9);
}

TEST_CASE("openrlhf: placement flags are refused or ignored with a reason") {
  for (const auto& [flag, why] : kPlacement) {
    CAPTURE(flag);
    CAPTURE(why);
    Flag f = {flag};
    if (flag.find("num_") != std::string::npos) f.push_back("1");
    if (flag == "--vllm.sync_backend") f.push_back("nccl");
    std::vector<std::string> a = kBase;
    a.insert(a.end(), f.begin(), f.end());
    const std::string err = usage_error(a);
    if (err.empty()) {
      const app::ParsedCommand p = parse(a);
      const bool noted = flag == "--train.colocate_all" ||
                         (!p.notices.empty() && contains(p.notices[0], flag + " is ignored: "));
      CHECK(noted);
    } else {
      CHECK(contains(err, "OpenRLHF's " + flag + ": placement"));
    }
  }
}

TEST_CASE("openrlhf: the DAPO script's flags mean what they mean in OpenRLHF") {
  const auto scripts = read_scripts();
  std::vector<std::string> a = {"ppo", "--reward", "length"};  // its reward_func.py is refused
  for (const Flag& f : scripts.at("train_dapo_ray_hybrid_engine.sh"))
    if (!kPlacement.count(f[0]) && try_flag(f).empty()) a.insert(a.end(), f.begin(), f.end());
  const app::ParsedCommand p = parse(a);
  const auto& x = std::get<app::PpoArgs>(p.args);
  CHECK(x.model.pretrain == "OpenRLHF/Llama-3-8b-sft-mixture");
  CHECK(x.prompt_data == "OpenRLHF/prompt-collection-v0.1");
  CHECK(x.input_key == "context_messages");
  CHECK(x.apply_chat_template);
  CHECK(x.actor_learning_rate == doctest::Approx(5e-7));
  CHECK(x.init_kl_coef == doctest::Approx(1e-3));
  CHECK(x.use_kl_loss);
  CHECK(x.kl_estimator == "k3");
  CHECK(x.advantage_estimator == "group_norm");
  CHECK(x.dynamic_filtering);
  CHECK(x.eps_clip_low_high[0] == doctest::Approx(0.2));
  CHECK(x.eps_clip_low_high[1] == doctest::Approx(0.27));
  CHECK(x.gen.n_samples_per_prompt == 8);
  CHECK(x.rollout_batch_size == 128);
  CHECK(x.train_batch_size == 128);
  CHECK(x.micro_train_batch_size == 8);
  CHECK(x.micro_rollout_batch_size == 16);
  CHECK(x.zero.zero_stage == 3);
  CHECK(x.zero.gradient_checkpointing);
  CHECK(x.gen.enforce_eager);
  CHECK(x.gen.vllm_tensor_parallel_size == 2);
  CHECK(x.gen.vllm_gpu_memory_utilization == doctest::Approx(0.6));
  CHECK(x.max_len == 2048);
  CHECK(x.gen.generate_max_len == 2048);  // no --rollout.max_new_tokens: max_len decides
  CHECK(x.max_samples == 20000);
  CHECK(x.ckpt.save_path == "/openrlhf/examples/test_scripts/final/llama3-8b-rlhf");
  CHECK(x.ckpt.ckpt_path == "/openrlhf/examples/test_scripts/ckpt/llama3-8b-rlhf");
  CHECK(x.ckpt.save_steps == 20);
  CHECK(x.ckpt.save_hf_ckpt);
  CHECK(cli_test::source_of(p, "actor_learning_rate") == app::OptionSource::kCommandLine);
  // --ds.packing_samples is rlhf's --packing_samples (sample packing), not an ignored flag.
  CHECK(x.zero.packing_samples);
  for (const std::string& n : p.notices) CHECK(!contains(n, "packing_samples"));
}

TEST_CASE("openrlhf: namespaced names work as TOML keys (dotted = nested tables) and in --help") {
  TempToml f(
      "[actor]\nmodel_name_or_path = \"p.h5\"\nadam.lr = 3e-7\n[data]\nprompt_dataset = "
      "\"d.jsonl\"\n[rollout]\nn_samples_per_prompt = 4\n");
  const app::ParsedCommand p = parse({"grpo", "--config", f.str(), "--reward", "length"});
  const auto& x = std::get<app::GrpoArgs>(p.args);
  CHECK(x.model.pretrain == "p.h5");
  CHECK(x.actor_learning_rate == doctest::Approx(3e-7));
  CHECK(x.prompt_data == "d.jsonl");
  CHECK(x.gen.n_samples_per_prompt == 4);

  TempToml g("\"ckpt.output_dir\" = \"out\"\n");  // a quoted dotted key
  const auto q = parse({"sft", "--config", g.str(), "--dataset", "d", "--pretrain", "p"});
  CHECK(std::get<app::SftArgs>(q.args).ckpt.save_path == "out");

  TempToml bad("[ds]\nring_attn_size = 2\n");
  CHECK(contains(usage_error({"ppo", "--config", bad.str(), "--pretrain", "p", "--prompt_data", "d",
                              "--reward", "length"}),
                 "OpenRLHF's --ds.ring_attn_size: no ring attention"));

  const std::string help = parse({"ppo", "--help"}).text;
  CHECK(contains(help, "(also --actor.adam.lr)"));
  CHECK(contains(help, "(also --rollout.n_samples_per_prompt)"));
}

TEST_CASE("openrlhf: hints come from the table; several unknown flags are named at once") {
  // The table's names on a command without that option: which flag it is, not a lookalike.
  const std::string e = usage_error({"generate", "--pretrain", "p", "--dataset", "d",
                                     "--output_path", "o", "--train.micro_batch_size", "2"});
  CHECK(contains(e, "OpenRLHF's --train.micro_batch_size is --micro_train_batch_size in rlhf"));
  CHECK(!contains(e, "did you mean"));
  const std::string many =
      usage_error({"ppo", "--pretrain", "p", "--prompt_data", "d", "--reward", "length",
                   "--ds.ring_attn_size", "2", "--reward.remote_url", "x.py", "--bogus_flag"});
  CHECK(contains(many, "3 unknown options for `rlhf ppo`"));
  CHECK(contains(many, "no ring attention"));
  CHECK(contains(many, "--reward command --reward_command"));
  // A namespaced name outside the table gets no flat-name guess.
  CHECK(!contains(usage_error({"ppo", "--pretrain", "p", "--prompt_data", "d", "--reward", "length",
                               "--ds.zpgx", "1"}),
                  "did you mean '--"
                  "zero_stage'"));
}

TEST_CASE("trl habits: --flag true|false, bare --log_completions, grpo's default group") {
  auto sft = [](std::vector<std::string> extra) {
    std::vector<std::string> a = cli_test::kMinimal;
    a.insert(a.end(), extra.begin(), extra.end());
    return std::get<app::SftArgs>(parse(a).args);
  };
  CHECK(sft({"--gradient_checkpointing", "true"}).zero.gradient_checkpointing);
  CHECK(sft({"--gradient_checkpointing", "True", "--max_len", "64"}).data.max_len == 64);
  CHECK(!sft({"--gradient_checkpointing", "false"}).zero.gradient_checkpointing);
  CHECK(sft({"--gradient_checkpointing"}).zero.gradient_checkpointing);
  CHECK(sft({"--model.gradient_checkpointing_enable", "1"}).zero.gradient_checkpointing);

  const std::vector<std::string> grpo = {"grpo", "--pretrain", "p",     "--prompt_data",
                                         "d",    "--reward",   "length"};
  auto g = [&](std::vector<std::string> extra) {
    std::vector<std::string> a = grpo;
    a.insert(a.end(), extra.begin(), extra.end());
    return std::get<app::GrpoArgs>(parse(a).args);
  };
  CHECK(g({}).gen.n_samples_per_prompt == 8);  // TRL's num_generations default
  CHECK(g({"--log_completions"}).log_completions == 1);
  CHECK(g({"--log_completions", "--seed", "3"}).log_completions == 1);
  CHECK(g({"--log_completions", "5"}).log_completions == 5);
  CHECK(g({"--max_new_tokens", "77"}).gen.generate_max_len == 77);
  CHECK(g({"--max_len", "300"}).gen.generate_max_len == 300);
  CHECK(g({"--max_len", "300", "--generate_max_len", "100"}).gen.generate_max_len == 100);
  CHECK(g({"--colocate_all_models"}).colocate_all_models);
  CHECK(g({"--input_template", "Q: {}\\nA:"}).input_template == "Q: {}\\nA:");
  CHECK(g({"--use_wandb"}).tracking.use_wandb == "true");
  CHECK(g({"--use_wandb", "--wandb_project", "p"}).tracking.wandb_project == "p");
  CHECK(g({"--use_tensorboard", "runs"}).tracking.use_tensorboard == "runs");
  {  // OpenRLHF's --use_wandb {token}: the key is used, never shown in the resolved config
    const app::ParsedCommand k = parse({"grpo", "--pretrain", "p", "--prompt_data", "d", "--reward",
                                        "length", "--logger.wandb.key", "s3cr3t"});
    CHECK(std::get<app::GrpoArgs>(k.args).tracking.use_wandb == "s3cr3t");
    for (const auto& row : k.config) CHECK(row.value != "s3cr3t");
  }
  CHECK(contains(usage_error({"grpo", "--pretrain", "p", "--prompt_data", "d", "--reward", "length",
                              "--colocate_all_models", "--gen_ranks_per_node", "1"}),
                 "--colocate_all_models"));
  // --reward_command alone is --reward command with that program.
  const auto rc = std::get<app::GrpoArgs>(
      parse({"grpo", "--pretrain", "p", "--prompt_data", "d", "--reward_command", "./s.sh"}).args);
  CHECK(rc.rewards.reward == "command");
  CHECK(rc.rewards.reward_command == "./s.sh");
  CHECK(contains(usage_error({"grpo", "--pretrain", "p", "--prompt_data", "d", "--reward", "length",
                              "--input_template", "no placeholder"}),
                 "--input_template 'no placeholder' has no {}"));
  // A TRL 1.9 name gets TRL's values mapped.
  CHECK(contains(usage_error({"grpo", "--pretrain", "p", "--prompt_data", "d", "--reward", "length",
                              "--scale_rewards", "none"}),
                 "--no_advantage_std_norm"));
}

TEST_CASE("openrlhf: --input_template puts the prompt at {} and turns \\n into newlines") {
  CHECK(rl::apply_input_template("User: {}\\nAssistant: ", "2+2?") == "User: 2+2?\nAssistant: ");
  CHECK(rl::apply_input_template("{}", "x") == "x");
  CHECK(rl::apply_input_template("a\\n{}\\n", "{}") == "a\n{}\n");  // the text is not rescanned
  CHECK_THROWS_AS(rl::apply_input_template("no place", "x"), Error);
}

}  // namespace rlhf
