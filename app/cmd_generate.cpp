// `rlhf generate`: sample completions of the prompts of a JSONL file from a checkpoint, with the
// rollout engine (KV cache, continuous batching), and write them as JSONL.
//
// One process for now: placing engines on the generation ranks and spreading prompts across them
// needs the topology (issues 3/4). Every prompt is queued at once; the engine decodes as many
// sequences together as the KV budget (--gen_kv_cache_mb) and --gen_max_num_seqs allow, so there
// is no micro-batch size to choose.
//
// Output, one object per sample, ordered by (prompt_index, sample_index):
//   {"prompt_index", "sample_index", "prompt", "completion", "completion_token_ids", "logprobs",
//    "finish_reason", "prompt_tokens", "completion_tokens"}
// completion is the decoded text without special tokens; completion_token_ids include the EOS
// token when finish_reason is "stop"; logprobs[i] = log softmax(logits / T)[token i] over the
// whole vocabulary (T = --temperature, 1 when greedy), what the trainer recomputes.
#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "app/commands.h"
#include "app/runtime.h"
#include "core/error.h"
#include "core/log.h"
#include "io/hdf5_ckpt.h"
#include "io/jsonl.h"
#include "io/tokenizer.h"
#include "rollout/engine.h"

namespace rlhf::app {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

struct Prompt {
  std::string text;
  int64_t line = 0;
};

// The prompts of `path`: the string under `key` of each object, at most `max` of them.
std::vector<Prompt> read_prompts(const std::string& path, const std::string& key, int64_t max) {
  RLHF_CHECK(std::filesystem::exists(path), "--dataset {}: no such file", path);
  std::vector<Prompt> prompts;
  io::for_each_jsonl(path, [&](const nlohmann::json& obj, int64_t line) {
    if (static_cast<int64_t>(prompts.size()) >= max) return false;
    const auto it = obj.find(key);
    if (it == obj.end()) {
      std::string keys;
      for (const auto& [k, v] : obj.items()) keys += (keys.empty() ? "" : ", ") + k;
      RLHF_FAIL("{}:{}: no key \"{}\" (keys: {})\nhint: set --input_key to the prompt's key", path,
                line, key, keys.empty() ? "none" : keys);
    }
    RLHF_CHECK(it->is_string(), "{}:{}: \"{}\" must be a string, got {}", path, line, key,
               it->type_name());
    prompts.push_back({it->get<std::string>(), line});
    return true;
  });
  RLHF_CHECK(!prompts.empty(), "{}: no prompts (the file has no JSON objects)", path);
  return prompts;
}

}  // namespace

int run_generate(const GenerateArgs& args) {
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  RLHF_CHECK(world == 1,
             "multi-rank generate needs the topology (issue 3/4): got {} ranks\nhint: run `rlhf "
             "generate` on one rank for now",
             world);
  const int threads = configure_threads(args.parallel.threads);
  const auto t_start = Clock::now();

  // --- model, tokenizer, engine
  ModelArgs margs;
  margs.pretrain = args.pretrain;
  margs.tokenizer = args.tokenizer;
  const ModelSource src = resolve_model_source(margs, model::HeadKind::kLM);
  const model::ModelConfig& cfg = src.config;
  const auto tokenizer = model_tokenizer(src);  // the model's own, else bytes
  model::ParamLayout layout(cfg, model::HeadKind::kLM, 1);
  rollout::EngineOptions eopt;
  eopt.kv_cache_bytes = args.gen.gen_kv_cache_mb * (int64_t(1) << 20);
  eopt.max_batch = args.gen.gen_max_num_seqs;
  eopt.eos_token_id = tokenizer->eos_id();
  rollout::Engine engine(layout, eopt);
  load_model_weights(src, layout, engine.unit_buffers());  // any --pretrain format
  const rollout::KvCache& kv = engine.kv_cache();
  LOG0_INFO("model: {} | {} parameters | {} layers, hidden {}, heads {}/{} | {}", cfg.model_type,
            layout.num_parameters(), cfg.num_hidden_layers, cfg.hidden_size,
            cfg.num_attention_heads, cfg.num_key_value_heads, src.describe());
  LOG0_INFO(
      "engine: KV cache {} = {} blocks of {} positions ({} per position) | up to {} sequences "
      "at once | {} threads",
      format_bytes(double(kv.capacity_bytes())), kv.num_blocks(), kv.block_size(),
      format_bytes(double(kv.bytes_per_token())), eopt.max_batch, threads);

  // --- prompts → requests
  const std::vector<Prompt> prompts = read_prompts(args.dataset, args.input_key, args.max_samples);
  rollout::SamplingParams sp;
  sp.temperature = args.gen.temperature;
  sp.top_p = args.gen.top_p;
  sp.top_k = args.gen.top_k;
  sp.greedy = args.gen.greedy;
  sp.seed = static_cast<uint64_t>(args.common.seed);
  sp.validate();
  std::vector<rollout::GenerationRequest> requests;
  int64_t prompt_tokens = 0, capped = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    rollout::GenerationRequest r;
    r.id = i;
    r.prompt = tokenizer->encode(prompts[i].text, /*add_bos=*/true, /*add_eos=*/false);
    const int64_t P = static_cast<int64_t>(r.prompt.size());
    RLHF_CHECK(P < cfg.max_position_embeddings,
               "{}:{}: the prompt is {} tokens (with BOS), which leaves no room to generate under "
               "the model's max_position_embeddings = {}",
               args.dataset, prompts[i].line, P, cfg.max_position_embeddings);
    if (P + args.gen.generate_max_len > cfg.max_position_embeddings) ++capped;
    r.n_samples = args.gen.n_samples_per_prompt;
    r.max_new_tokens = args.gen.generate_max_len;
    r.sampling = sp;
    prompt_tokens += P;
    requests.push_back(std::move(r));
  }
  LOG0_INFO("data: {} | {} prompts, {} prompt tokens | {} samples per prompt | {}", args.dataset,
            requests.size(), prompt_tokens, args.gen.n_samples_per_prompt,
            sp.is_greedy() ? std::string("greedy")
                           : fmt::format("temperature {} top_p {} top_k {}", sp.temperature,
                                         sp.top_p, sp.top_k));
  if (capped > 0)
    LOG0_WARN(
        "{} prompt(s) leave fewer than --generate_max_len {} positions under "
        "max_position_embeddings {}: their samples stop there (finish_reason \"length\")",
        capped, args.gen.generate_max_len, cfg.max_position_embeddings);

  // --- generate, with a progress line every few seconds
  auto last_progress = Clock::now();
  const auto t_gen = Clock::now();
  const rollout::ProgressFn progress = [&](const rollout::EngineStats& st, int64_t done,
                                           int64_t total) {
    if (args.common.disable_progress || seconds_since(last_progress) < 5.0) return;
    last_progress = Clock::now();
    const double elapsed = seconds_since(t_gen);
    LOG0_INFO(
        "generate: {}/{} samples ({:.1f}%) | {} tokens | {:.0f} tok/s | batch {:.1f} mean | "
        "KV {}/{} blocks | elapsed {:.1f}s",
        done, total, 100.0 * double(done) / double(total), st.generated_tokens,
        double(st.generated_tokens) / elapsed, st.mean_active_batch(), kv.used_blocks(),
        kv.num_blocks(), elapsed);
  };
  const std::vector<rollout::GenerationResult> results = engine.generate(requests, progress);
  const rollout::EngineStats& st = engine.stats();

  // --- write <output_path>.tmp, then rename: a crash never leaves a partial file as the result
  const std::filesystem::path out(args.output_path);
  if (out.has_parent_path()) std::filesystem::create_directories(out.parent_path());
  const std::string tmp = args.output_path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::trunc);
    RLHF_CHECK(f.good(), "--output_path {}: cannot open {} for writing", args.output_path, tmp);
    int64_t stops = 0;
    for (const rollout::GenerationResult& r : results) {
      const size_t i = static_cast<size_t>(r.request_index);
      stops += r.finish == rollout::FinishReason::kStop;
      const nlohmann::ordered_json j = {
          {"prompt_index", r.request_index},
          {"sample_index", r.sample_index},
          {"prompt", prompts[i].text},
          {"completion", tokenizer->decode(r.tokens, /*skip_special_tokens=*/true)},
          {"completion_token_ids", r.tokens},
          {"logprobs", r.logprobs},
          {"finish_reason", rollout::to_string(r.finish)},
          {"prompt_tokens", requests[i].prompt.size()},
          {"completion_tokens", r.tokens.size()}};
      // Byte-level completions need not be valid UTF-8: invalid bytes become U+FFFD in the text
      // (the token ids keep them exactly).
      f << j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace) << '\n';
    }
    f.flush();
    RLHF_CHECK(f.good(), "--output_path {}: write to {} failed", args.output_path, tmp);
    LOG0_INFO("finish reasons: {} stop, {} length", stops,
              static_cast<int64_t>(results.size()) - stops);
  }
  std::error_code ec;
  std::filesystem::rename(tmp, out, ec);
  RLHF_CHECK(!ec, "--output_path {}: cannot rename {}: {}", args.output_path, tmp, ec.message());

  LOG0_INFO(
      "done: {} samples of {} prompts | {} tokens in {:.2f}s = {:.0f} tok/s | prefill {} tokens "
      "{:.2f}s | decode {} steps {:.2f}s, mean batch {:.1f}, peak KV {} | total {:.1f}s | {}",
      results.size(), requests.size(), st.generated_tokens, st.total_s,
      double(st.generated_tokens) / std::max(st.total_s, 1e-9), st.prefill_tokens, st.prefill_s,
      st.decode_steps, st.decode_s, st.mean_active_batch(),
      format_bytes(double(st.peak_kv_blocks * kv.bytes_per_block())), seconds_since(t_start),
      args.output_path);
  return 0;
}

}  // namespace rlhf::app
