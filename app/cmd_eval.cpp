// `rlhf eval`: the accuracy of a checkpoint on held-out prompts with reference answers. The
// prompts are read and rendered as in training (rl::load_prompts: JSONL or builtin:<task>,
// --input_key, --label_key, --apply_chat_template, --prompt_max_len), the engines sample
// --n_samples_per_prompt completions of each, and world rank 0 scores them with the rule reward
// of --reward — the same answer checking as `rlhf grpo --reward ...` — through rl::evaluate.
//
// Ranks and engines as `rlhf generate`: with --gen_ranks_per_node G > 0 the generation ranks of
// each node host the engines, with G = 0 every rank does; --vllm_tensor_parallel_size T makes an
// engine T ranks of one node. Engine e of E completes the prompts [P·e/E, P·(e+1)/E); a sample's
// random stream is keyed by (--seed, prompt index, sample index) only, so the samples, and the
// file, do not depend on the number of ranks or engines.
//
// Output (rank 0, written to <output_path>.tmp and renamed): one object per sample, ordered by
// (prompt_index, sample_index) — prompt_index counts the usable prompts (those within
// --prompt_max_len) in file order —
//   {"prompt_index", "sample_index", "prompt", "completion", "score", "correct",
//    "completion_tokens", "finish_reason"}
// then one line {"summary": {prompts, samples, reward_mean, accuracy, pass@k..., ...}}
// (rl::EvalSummary::to_json). A sample is correct when its score reaches 1 (the full reward).
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "app/commands.h"
#include "app/param_dtype.h"
#include "app/runtime.h"
#include "core/error.h"
#include "core/log.h"
#include "io/builtin_tasks.h"
#include "io/model_source.h"
#include "parallel/comm.h"
#include "parallel/runtime.h"
#include "parallel/topology.h"
#include "rl/environment.h"
#include "rl/evaluate.h"
#include "rl/prompts.h"
#include "rl/rewards.h"
#include "rollout/engine.h"

namespace rlhf::app {

namespace {

// "pass@1 0.500 | pass@2 0.625 | pass@4 0.750".
std::string pass_at_text(const rl::EvalSummary& s) {
  std::string out;
  for (const auto& [k, v] : s.pass_at)
    out += fmt::format("{}pass@{} {:.4f}", out.empty() ? "" : " | ", k, v);
  return out;
}

}  // namespace

int run_eval(const EvalArgs& args) {
  const int tp = args.gen.vllm_tensor_parallel_size;
  int threads = 1;
  const std::unique_ptr<parallel::Topology> topo =
      parallel::setup_topology(runtime_options(args.parallel, tp), &threads);
  const parallel::Device device =
      parallel::setup_device(runtime_options(args.parallel, tp), *topo, nullptr);
  const int rank = topo->rank(), n_engines = topo->placement().num_engines();
  const std::unique_ptr<parallel::Comm> world = parallel::make_comm(topo->world(), "world");

  // --- model, tokenizer, reward, prompts (every rank: errors then stop every rank alike)
  ModelArgs margs;
  margs.pretrain = args.pretrain;
  margs.tokenizer = args.tokenizer;
  const io::ModelSource src = model_source(margs, model::HeadKind::kLM);
  const model::ModelConfig& cfg = src.config;
  const auto tokenizer = io::model_tokenizer(src);  // the model's own, else bytes
  RLHF_CHECK(!src.checkpoint.empty(),
             "rlhf eval needs a model to evaluate\nhint: pass --pretrain CHECKPOINT");
  const model::ParamLayout layout(cfg, model::HeadKind::kLM);
  LOG0_INFO("model: {} | {} parameters | {} layers, hidden {}, heads {}/{} | {}", cfg.model_type,
            layout.num_parameters(), cfg.num_hidden_layers, cfg.hidden_size,
            cfg.num_attention_heads, cfg.num_key_value_heads, src.describe());

  const std::unique_ptr<rl::RewardFn> reward =
      rl::make_reward(args.rewards.reward, reward_options(args.rewards));

  RLHF_CHECK(io::is_builtin_dataset(args.dataset) || std::filesystem::exists(args.dataset),
             "--dataset {}: no such file", args.dataset);
  const std::filesystem::path out(args.output_path);
  rl::PromptOptions po;
  po.prompt_data = args.dataset;
  po.input_key = args.input_key;
  po.label_key = args.label_key;
  po.apply_chat_template = args.apply_chat_template;
  po.input_template = args.input_template;
  po.prompt_max_len = args.prompt_max_len;
  po.max_samples = args.max_samples;
  // A builtin task's records are written next to the output, for inspection.
  po.save_dir = out.has_parent_path() ? out.parent_path().string() : ".";
  const std::vector<rl::Prompt> prompts = rl::load_prompts(po, *tokenizer, cfg, rank);

  rl::EvalOptions eo;
  eo.n_samples_per_prompt = args.gen.n_samples_per_prompt;
  eo.generate_max_len = args.gen.generate_max_len;
  eo.sampling.temperature = args.gen.temperature;
  eo.sampling.top_p = args.gen.top_p;
  eo.sampling.top_k = args.gen.top_k;
  eo.sampling.greedy = args.gen.greedy;
  eo.sampling.seed = static_cast<uint64_t>(args.common.seed);
  eo.sampling.validate();
  LOG0_INFO("data: {} | {} prompts | {} samples per prompt | {} | reward {}", args.dataset,
            prompts.size(), eo.n_samples_per_prompt,
            eo.sampling.is_greedy()
                ? std::string("greedy")
                : fmt::format("temperature {} top_p {} top_k {}", eo.sampling.temperature,
                              eo.sampling.top_p, eo.sampling.top_k),
            reward->name());
  LOG0_INFO(
      "engines: {} ({}) on {} | KV cache {} and up to {} sequences per engine | {} threads per "
      "rank",
      n_engines,
      tp == 1 ? std::string("1 rank each") : fmt::format("{} ranks each, tensor parallel", tp),
      parallel::device_name(device),
      device == parallel::Device::kCuda
          ? fmt::format("{:.0f}% of GPU memory", 100 * args.gen.vllm_gpu_memory_utilization)
          : fmt::format("{} MiB per rank", args.gen.gen_kv_cache_mb),
      args.gen.gen_max_num_seqs, threads);

  // Output checks before any generation, on rank 0 (its error ends the job).
  const std::string tmp = args.output_path + ".tmp";
  if (rank == 0) {
    if (out.has_parent_path()) std::filesystem::create_directories(out.parent_path());
    std::ofstream f(tmp, std::ios::trunc);
    RLHF_CHECK(f.good(), "--output_path {}: cannot open {} for writing", args.output_path, tmp);
  }

  // --- the engines (tensor-parallel group over engine_comm; TP 1: none), loaded from --pretrain
  const std::unique_ptr<parallel::Comm> tp_comm =
      topo->generates() && tp > 1 ? parallel::make_comm(topo->engine_comm(), "engine_comm")
                                  : nullptr;
  std::unique_ptr<rollout::Engine> engine;
  if (topo->generates()) {
    engine = std::make_unique<rollout::Engine>(
        layout, engine_options(args.gen, device, tp_comm.get(), tokenizer->eos_id(),
                               cpu_bf16(args.parallel, device == parallel::Device::kCuda)));
    io::load_model_weights(src, layout, engine->unit_buffers());  // any --pretrain format
  }
  // Multi-turn episodes (--env_command, --stop_strings): one environment per engine (on its TP
  // rank 0); its reward scores a sample where given, else --reward.
  std::unique_ptr<rl::Environment> env;
  if (engine && !args.gen.env_command.empty())
    env = rl::make_environment(args.gen.env_command, args.gen.env_timeout, engine->tp_rank());
  eo.episodes.env = env.get();
  eo.episodes.stop_strings = rl::parse_stop_strings(args.gen.stop_strings);
  eo.episodes.max_turns = args.gen.env_max_turns;

  // --- generate, gather, score (rank 0), summary everywhere
  std::vector<rl::EvalRecord> records;
  const rl::EvalSummary summary = rl::evaluate(engine.get(), *topo, *world, prompts, *reward,
                                               *tokenizer, eo, rank == 0 ? &records : nullptr);
  if (rank != 0) return 0;

  // --- rank 0: <output_path>.tmp, then rename (a crash never leaves a partial file)
  RLHF_CHECK(int64_t(records.size()) == summary.samples,
             "internal error: {} evaluation records for {} samples", records.size(),
             summary.samples);
  {
    std::ofstream f(tmp, std::ios::trunc);
    RLHF_CHECK(f.good(), "--output_path {}: cannot open {} for writing", args.output_path, tmp);
    // Byte-level completions need not be valid UTF-8: invalid bytes become U+FFFD.
    const auto dump = [](const nlohmann::ordered_json& j) {
      return j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
    };
    for (const rl::EvalRecord& r : records) {
      const nlohmann::ordered_json j = {{"prompt_index", r.prompt_index},
                                        {"sample_index", r.sample_index},
                                        {"prompt", prompts.at(size_t(r.prompt_index)).text},
                                        {"completion", r.completion},
                                        {"score", r.score},
                                        {"correct", r.score >= eo.correct_threshold},
                                        {"completion_tokens", r.completion_tokens},
                                        {"finish_reason", r.stopped ? "stop" : "length"}};
      f << dump(j) << '\n';
    }
    f << dump(nlohmann::ordered_json{{"summary", summary.to_json("")}}) << '\n';
    f.flush();
    RLHF_CHECK(f.good(), "--output_path {}: write to {} failed", args.output_path, tmp);
  }
  std::error_code ec;
  std::filesystem::rename(tmp, out, ec);
  RLHF_CHECK(!ec, "--output_path {}: cannot rename {}: {}", args.output_path, tmp, ec.message());

  LOG0_INFO(
      "eval: {} prompts x {} samples | accuracy {:.4f} | {} | reward mean {:.4f} | mean length "
      "{:.1f} tokens | {:.0f}% stopped (EOS) | {:.0f} tok/s | {:.2f}s | {}",
      summary.prompts, eo.n_samples_per_prompt, summary.accuracy, pass_at_text(summary),
      summary.reward_mean, summary.response_length_mean, 100 * summary.stop_fraction,
      summary.tokens_per_s, summary.seconds, args.output_path);
  return 0;
}

}  // namespace rlhf::app
