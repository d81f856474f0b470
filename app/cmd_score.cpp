// `rlhf score`: teacher-forced scoring under a model (rl::Scorer), no sampling.
//
// Records (a .jsonl / .json --dataset): the prompt under --input_key (a string, or chat messages)
// is rendered — with the model's chat template and its generation prompt under
// --apply_chat_template, else encoded with BOS — and the response under --output_key is encoded
// separately (no BOS, no EOS) and appended; the line of a record is
//   {"index", "line", "prompt_tokens", "tokens", "nll", "logprobs"}
// where tokens counts the response tokens, logprobs are theirs (nats) and nll is their negated
// mean. A record longer than --max_len (default: the model's context) gets {"index", "line",
// "skipped"}. The last line is {"summary": {"records", "scored", "skipped", "tokens", "nll",
// "perplexity", "seconds"}} with nll the token-weighted mean.
//
// Plain text (any other --dataset): the whole file is encoded with BOS and scored in windows of
// --max_len tokens every --stride tokens (Hugging Face's strided perplexity); one line
//   {"summary": {"text_tokens", "tokens", "windows"?, "nll", "perplexity", "seconds"}}.
//
// Ranks: record i is scored by world rank i mod world size; rank 0 gathers the lines (through
// parallel::Comm) and writes <output_path>.tmp, then renames it. The output does not depend on
// the number of ranks. A plain text is scored by rank 0 alone.
#include <chrono>
#include <cmath>
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
#include "io/chat_template.h"
#include "io/jsonl.h"
#include "io/model_source.h"
#include "parallel/comm.h"
#include "parallel/runtime.h"
#include "parallel/topology.h"
#include "rl/score.h"

namespace rlhf::app {

namespace {

using Json = nlohmann::ordered_json;

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

bool is_json_dataset(const std::string& path) {
  const std::string ext = std::filesystem::path(path).extension().string();
  return ext == ".jsonl" || ext == ".json";
}

// What one rank scores and how the lines are merged.
struct ScoreContext {
  const ScoreArgs& args;
  const io::Tokenizer& tok;
  const std::string& model_type;
  rl::Scorer& scorer;
  int64_t max_len;
};

// The prompt's tokens as the record gives them (rendered or plain), named by file:line in errors.
std::vector<int32_t> prompt_tokens(const ScoreContext& c, const nlohmann::json& value,
                                   const std::string& where) {
  const std::vector<io::ChatMessage> messages = io::chat_messages_from_json(value, where);
  if (c.args.apply_chat_template) {
    std::string text;
    try {
      text = io::render_chat(c.tok, c.model_type, messages, true);
    } catch (const Error& e) {
      RLHF_FAIL("{}: --apply_chat_template: {}", where, e.what());
    }
    return c.tok.encode(text, false, false);  // the template writes its own BOS
  }
  std::string text;
  for (const auto& m : messages) text += (text.empty() ? "" : "\n") + m.content;
  return c.tok.encode(text, true, false);
}

// One record's line (see the file comment).
Json score_record(const ScoreContext& c, const nlohmann::json& r, int64_t index, int64_t line) {
  const std::string& path = c.args.dataset;
  const auto in = r.find(c.args.input_key);
  RLHF_CHECK(in != r.end(), "{}:{}: no key '{}'\nhint: set --input_key", path, line,
             c.args.input_key);
  const auto out = r.find(c.args.output_key);
  RLHF_CHECK(out != r.end() && out->is_string(),
             "{}:{}: key '{}' must be a string (the response to score)\nhint: set --output_key",
             path, line, c.args.output_key);
  const std::vector<int32_t> prompt =
      prompt_tokens(c, *in, fmt::format("{}:{}: key '{}'", path, line, c.args.input_key));
  const std::vector<int32_t> response = c.tok.encode(out->get<std::string>(), false, false);
  Json j{{"index", index}, {"line", line}};
  const int64_t n = int64_t(prompt.size() + response.size());
  if (n > c.max_len) {
    j["skipped"] = fmt::format("{} tokens, more than --max_len {}", n, c.max_len);
    return j;
  }
  const std::vector<double> lp = c.scorer.response_logprobs(prompt, response);
  j["prompt_tokens"] = prompt.size();
  j["tokens"] = lp.size();
  j["nll"] = rl::mean_nll(lp);
  j["logprobs"] = lp;
  return j;
}

// Every record's line, in file order, on rank 0 (empty elsewhere). Collective over `world`.
std::vector<std::string> score_records(const ScoreContext& c, parallel::Comm& world) {
  std::vector<std::string> mine;  // "<index>\t<line json>" of this rank's records
  int64_t index = 0, done = 0;
  auto last_report = std::chrono::steady_clock::now();
  io::for_each_jsonl(c.args.dataset, [&](const nlohmann::json& r, int64_t line) {
    if (index >= c.args.max_samples) return false;
    if (index % world.size() == world.rank()) {
      mine.push_back(
          score_record(c, r, index, line).dump(-1, ' ', false, Json::error_handler_t::replace));
      ++done;
      if (seconds_since(last_report) > 10) {
        LOG0_INFO("score: {} records scored on rank 0", done);
        last_report = std::chrono::steady_clock::now();
      }
    }
    ++index;
    return true;
  });
  std::string blob;
  for (const std::string& s : mine) blob += s + '\n';
  const auto parts = world.all_gather_bytes(std::vector<uint8_t>(blob.begin(), blob.end()));
  if (world.rank() != 0) return {};
  // Rank r holds records r, r + W, r + 2W, ...: interleave them back into file order.
  std::vector<std::vector<std::string>> lines(parts.size());
  for (size_t r = 0; r < parts.size(); ++r) {
    std::string s(parts[r].begin(), parts[r].end());
    for (size_t p = 0, e; (e = s.find('\n', p)) != std::string::npos; p = e + 1)
      lines[r].push_back(s.substr(p, e - p));
  }
  std::vector<std::string> out;
  for (int64_t i = 0; i < index; ++i)
    out.push_back(std::move(lines[size_t(i % world.size())].at(size_t(i / world.size()))));
  return out;
}

// The summary of the record lines.
Json records_summary(const std::vector<std::string>& lines, double seconds) {
  int64_t scored = 0, skipped = 0, tokens = 0;
  double nll_sum = 0;
  for (const std::string& s : lines) {
    const nlohmann::json j = nlohmann::json::parse(s);
    if (j.contains("skipped")) {
      ++skipped;
      continue;
    }
    ++scored;
    const int64_t n = j["tokens"].get<int64_t>();
    tokens += n;
    nll_sum += j["nll"].get<double>() * double(n);
  }
  const double nll = tokens > 0 ? nll_sum / double(tokens) : 0.0;
  return Json{{"records", lines.size()}, {"scored", scored}, {"skipped", skipped},
              {"tokens", tokens},        {"nll", nll},       {"perplexity", std::exp(nll)},
              {"seconds", seconds}};
}

// A plain text's summary line (rank 0).
Json score_text(const ScoreContext& c, double* seconds) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::string text = io::read_text_file(c.args.dataset);
  const std::vector<int32_t> ids = c.tok.encode(text, true, false);
  RLHF_CHECK(ids.size() >= 2, "{}: the text has {} token(s); perplexity needs at least 2",
             c.args.dataset, ids.size());
  const int64_t window = std::min<int64_t>(c.max_len, int64_t(ids.size()));
  const int64_t stride =
      c.args.stride > 0 ? std::min(c.args.stride, window) : std::max<int64_t>(1, window / 2);
  const std::vector<double> lp = c.scorer.text_logprobs(ids, std::max<int64_t>(window, 2), stride);
  const double nll = rl::mean_nll(lp);
  *seconds = seconds_since(t0);
  return Json{{"text_tokens", ids.size()}, {"tokens", lp.size()}, {"window", window},
              {"stride", stride},          {"nll", nll},          {"perplexity", std::exp(nll)},
              {"seconds", *seconds}};
}

void write_output(const std::string& output_path, const std::vector<std::string>& lines,
                  const Json& summary) {
  const std::string tmp = output_path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::trunc);
    RLHF_CHECK(f.good(), "--output_path {}: cannot open {} for writing", output_path, tmp);
    for (const std::string& s : lines) f << s << '\n';
    f << Json{{"summary", summary}}.dump() << '\n';
    f.flush();
    RLHF_CHECK(f.good(), "--output_path {}: write to {} failed", output_path, tmp);
  }
  std::error_code ec;
  std::filesystem::rename(tmp, output_path, ec);
  RLHF_CHECK(!ec, "--output_path {}: cannot rename {}: {}", output_path, tmp, ec.message());
}

}  // namespace

int run_score(const ScoreArgs& args) {
  int threads = 1;
  const std::unique_ptr<parallel::Topology> topo =
      parallel::setup_topology(runtime_options(args.parallel), &threads);
  const std::unique_ptr<parallel::Comm> world = parallel::make_comm(topo->world(), "world");
  const int rank = topo->rank();

  ModelArgs margs;
  margs.pretrain = args.pretrain;
  margs.tokenizer = args.tokenizer;
  const io::ModelSource src = model_source(margs, model::HeadKind::kLM);
  RLHF_CHECK(!src.checkpoint.empty(),
             "rlhf score needs a model to score with\nhint: pass --pretrain CHECKPOINT");
  const model::ModelConfig& cfg = src.config;
  const auto tokenizer = io::model_tokenizer(src);
  const model::ParamLayout layout(cfg, model::HeadKind::kLM);
  RLHF_CHECK(std::filesystem::is_regular_file(args.dataset), "--dataset {}: no such file",
             args.dataset);
  const int64_t max_len = args.max_len > 0 ? std::min(args.max_len, cfg.max_position_embeddings)
                                           : cfg.max_position_embeddings;
  if (args.max_len > cfg.max_position_embeddings)
    LOG0_WARN("--max_len {} is more than the model's {} positions: using {}", args.max_len,
              cfg.max_position_embeddings, max_len);
  const bool records = is_json_dataset(args.dataset);
  LOG0_INFO("score: {} | {} parameters | {} | {} | {} | max_len {} | {} ranks x {} threads",
            cfg.model_type, layout.num_parameters(), src.describe(), tokenizer->name(),
            records ? "records" : "plain text (perplexity)", max_len, world->size(), threads);

  const std::string tmp = args.output_path + ".tmp";
  if (rank == 0) {  // output checks before the work
    const std::filesystem::path out(args.output_path);
    if (out.has_parent_path()) std::filesystem::create_directories(out.parent_path());
    std::ofstream f(tmp, std::ios::trunc);
    RLHF_CHECK(f.good(), "--output_path {}: cannot open {} for writing", args.output_path, tmp);
  }

  rl::Scorer scorer(layout);
  scorer.set_bf16(cpu_bf16(args.parallel, false));  // score runs on the CPU only
  io::load_model_weights(src, layout, scorer.unit_buffers());
  const ScoreContext c{args, *tokenizer, cfg.model_type, scorer, max_len};
  const auto t0 = std::chrono::steady_clock::now();
  if (!records) {
    if (rank != 0) return 0;
    double seconds = 0;
    const Json summary = score_text(c, &seconds);
    write_output(args.output_path, {}, summary);
    LOG0_INFO("score: {} tokens scored of {} | nll {:.4f} | perplexity {:.3f} | {:.0f} tok/s | {}",
              summary["tokens"].get<int64_t>(), summary["text_tokens"].get<int64_t>(),
              summary["nll"].get<double>(), summary["perplexity"].get<double>(),
              double(summary["tokens"].get<int64_t>()) / std::max(seconds, 1e-9), args.output_path);
    return 0;
  }
  const std::vector<std::string> lines = score_records(c, *world);
  if (rank != 0) return 0;
  const Json summary = records_summary(lines, seconds_since(t0));
  write_output(args.output_path, lines, summary);
  LOG0_INFO(
      "score: {} records ({} skipped) | {} response tokens | nll {:.4f} | perplexity {:.3f} | "
      "{:.1f}s | {}",
      summary["records"].get<int64_t>(), summary["skipped"].get<int64_t>(),
      summary["tokens"].get<int64_t>(), summary["nll"].get<double>(),
      summary["perplexity"].get<double>(), summary["seconds"].get<double>(), args.output_path);
  return 0;
}

}  // namespace rlhf::app
