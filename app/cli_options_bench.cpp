// The options of `rlhf bench` (BenchArgs): one registration line per option, and the checks
// across them. Kept apart from app/cli_options.cpp, the training commands' groups.
#include <CLI/CLI.hpp>

#include <string>
#include <utility>

#include "app/cli.h"

namespace rlhf::app {

void BenchArgs::bind(OptionSet& o) {
  common.bind(o);
  o.app()
      ->add_option("suite", suites,
                   "Benchmarks to run: train, generate, comm, sync, all (default all); rl "
                   "(minutes: not in all); gemm (sgemm vs oneDNN fp32 vs bf16 at --model_config's "
                   "shapes, default SmolLM-135M's: not in all); packing (--packing_samples with "
                   "token budgets vs padded micro-batches on ragged lengths: not in all); partial "
                   "(--partial_rollout vs the synchronous rollout with one 8x straggler in 64: "
                   "not in all)")
      ->type_name("SUITE");
  o.add("model_config", model_config, "Model config for train (\"\" = stories15M shape)");
  o.add("tokens_per_step", tokens_per_step, "Tokens per optimizer step (global)").check(ge(1));
  o.add("seq_len", seq_len, "Sequence length of the training benchmark").check(ge(1));
  o.add("micro_train_batch_size", micro_train_batch_size,
        "Sequences per forward/backward (0 = the whole step at once)")
      .check(ge(0));
  o.add("steps", steps, "Timed steps").check(ge(1));
  o.add("warmup", warmup, "Untimed warm-up steps").check(ge(0));
  zero.bind(o);
  parallel.bind(o);
  o.add("output", output, "Also append the JSON lines to this file");
  o.add("min_bytes", min_bytes, "comm: smallest message (bytes)").check(ge(4));
  o.add("max_bytes", max_bytes, "comm: largest message (bytes)").check(ge(4));
  o.add("step_factor", step_factor, "comm: size multiplier between rows").check(ge(2));
  o.add("iters", iters, "comm: timed calls per size").check(ge(1));
  o.add("kv_cache_dtype", kv_cache_dtype,
        "generate: KV cache element type (auto = fp16; fp32 also runs for the long-context ratio)")
      .check(one_of({"auto", "fp16", "fp32"}));
  o.add("kv_block_size", kv_block_size,
        "generate: positions per KV block of the engine (0 = the CPU default, 256)")
      .check(ge(0));
  o.add("pretrain", pretrain,
        "generate: a real model (any --pretrain format) instead of random weights of "
        "--model_config");
  o.add("gen_batches", gen_batches, "generate: batch sizes of the fixed-length runs (comma list)");
  o.add("gen_long_requests", gen_long_requests,
        "generate: requests of the ragged run, 64-1024 new tokens each (0 = skip)")
      .check(ge(0));
  o.add("gen_long_fixed_batch", gen_long_fixed_batch,
        "generate: batch of the 1024-token run next to the same batch at 128 (0 = skip)")
      .check(ge(0));
  o.add("generate_max_len", rl_new_tokens, "rl: new tokens per sample of the GRPO steps")
      .check(ge(1));
  o.add("rollout_batch_size", rl_prompts, "rl: prompts per GRPO step").check(ge(1));
  o.add("n_samples_per_prompt", rl_samples_per_prompt, "rl: completions per prompt").check(ge(1));
  o.add("max_steps", rl_steps, "rl: GRPO steps (rates are means over steps 2..N)").check(ge(1));
  o.add("packing_bench_samples", packing_bench_samples,
        "packing: samples of the global batch (padded micro-batches: --micro_train_batch_size, "
        "0 = 8)")
      .check(ge(1));
  o.add("packing_bench_lengths", packing_bench_len,
        "packing: lo hi of the uniform sample lengths (tokens)")
      .check(ge(2));
}

void BenchArgs::validate() {
  if (suites.empty()) suites = {"all"};
  for (const std::string& s : suites)
    if (s != "train" && s != "generate" && s != "comm" && s != "sync" && s != "rl" && s != "gemm" &&
        s != "packing" && s != "partial" && s != "all")
      usage_fail(
          "unknown benchmark suite '{}'\nhint: train, generate, comm, sync, rl, gemm, packing, "
          "partial or all",
          s);
  if (zero.packing_samples)
    usage_fail(
        "--packing_samples has no effect on rlhf bench: the train suite's rows all have "
        "--seq_len tokens, and the packing suite runs packed and padded micro-batches itself\n"
        "hint: rlhf bench packing");
}

}  // namespace rlhf::app
