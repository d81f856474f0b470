// `rlhf generate`: sample completions of the prompts of a JSONL file from a checkpoint, with the
// rollout engine (KV cache, continuous batching), and write them as JSONL.
//
// Ranks: the topology (--ranks_per_node, --gen_ranks_per_node) says which ranks host engines —
// with --gen_ranks_per_node G > 0 the G generation ranks of each node, with G = 0 (colocated)
// every rank. Each engine loads the weights itself from --pretrain and completes a contiguous block
// of the prompts (engine e of E: prompts [N·e/E, N·(e+1)/E)); the other ranks idle (sleeping, not
// spinning in MPI) and exit with the job. Completions are gathered to world rank 0, which writes
// them in prompt order. A sample's random stream is keyed by (--seed, prompt index, sample index)
// only, so the file does not depend on the number of ranks or engines.
//
// With --vllm_tensor_parallel_size T > 1 an engine is T ranks of one node that split the attention
// heads and MLP columns (rollout::Engine, Megatron style, all-reduce on engine_comm through a
// shared-memory comm); its rank 0 reports and sends the completions.
//
// Every prompt of an engine is queued at once; the engine decodes as many sequences together as the
// KV budget (--gen_kv_cache_mb) and --gen_max_num_seqs allow, so there is no micro-batch size to
// choose. Rank 0 prints a progress line (samples, tokens, tok/s over all engines) every few
// seconds from the engines' small progress messages.
//
// Prompts: the value under --input_key of each JSONL object, a string or chat messages
// ([{"role", "content"}, ...]); with --apply_chat_template rendered by the model's chat template
// with the generation prompt (io/chat_template.h) and encoded without an extra BOS, else encoded
// with BOS (a conversation's contents joined by newlines).
//
// Output, one object per sample, ordered by (prompt_index, sample_index):
//   {"prompt_index", "sample_index", "prompt" (the text given to the model), "completion",
//    "completion_token_ids", "logprobs", "finish_reason", "prompt_tokens", "completion_tokens"}
// completion is the decoded text without special tokens; completion_token_ids include the EOS
// token when finish_reason is "stop"; logprobs[i] = log softmax(logits / T)[token i] over the
// whole vocabulary (T = --temperature, 1 when greedy), what the trainer recomputes.
#include <mpi.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "app/commands.h"
#include "app/param_dtype.h"
#include "app/runtime.h"
#include "core/error.h"
#include "core/log.h"
#include "io/chat_template.h"
#include "io/hdf5_ckpt.h"
#include "io/jsonl.h"
#include "io/tokenizer.h"
#include "parallel/failure_injection.h"
#include "parallel/mpi_check.h"
#include "parallel/topology.h"
#include "parallel/watchdog.h"
#include "rl/environment.h"
#include "rl/episodes.h"
#include "rollout/engine.h"
#include "rollout/samples.h"

namespace rlhf::app {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

struct Prompt {
  std::string text;     // as given to the model (after the chat template, if any)
  bool add_bos = true;  // false after a chat template (it writes its own BOS)
  int64_t line = 0;
};

// The prompts of `path`: the value under `key` of each object (a string, or chat messages),
// at most `max` of them. With --apply_chat_template rendered by the tokenizer's chat template with
// the generation prompt; without, a conversation's contents joined by newlines.
std::vector<Prompt> read_prompts(const GenerateArgs& args, const io::Tokenizer& tok,
                                 const std::string& model_type) {
  const std::string& path = args.dataset;
  const std::string& key = args.input_key;
  RLHF_CHECK(std::filesystem::exists(path), "--dataset {}: no such file", path);
  std::vector<Prompt> prompts;
  io::for_each_jsonl(path, [&](const nlohmann::json& obj, int64_t line) {
    if (static_cast<int64_t>(prompts.size()) >= args.max_samples) return false;
    const auto it = obj.find(key);
    if (it == obj.end()) {
      std::string keys;
      for (const auto& [k, v] : obj.items()) keys += (keys.empty() ? "" : ", ") + k;
      RLHF_FAIL("{}:{}: no key \"{}\" (keys: {})\nhint: set --input_key to the prompt's key", path,
                line, key, keys.empty() ? "none" : keys);
    }
    const std::string where = fmt::format("{}:{}: key '{}'", path, line, key);
    RLHF_CHECK(it->is_string() || it->is_array(),
               "{}: must be a string or chat messages (an array of {{\"role\", \"content\"}}), "
               "got {}",
               where, it->type_name());
    Prompt p;
    p.line = line;
    if (!args.apply_chat_template && it->is_string() && it->get_ref<const std::string&>().empty()) {
      // An empty prompt generates from BOS alone (llama2.c's default; TinyStories samples).
      RLHF_CHECK(tok.bos_id() >= 0,
                 "{}: an empty prompt generates from BOS, but the tokenizer ({}) has no BOS "
                 "token\nhint: give the prompt some text",
                 where, tok.name());
      prompts.push_back(std::move(p));  // text "", add_bos: the prompt is [BOS]
      return true;
    }
    const std::vector<io::ChatMessage> messages = io::chat_messages_from_json(*it, where);
    if (args.apply_chat_template) {
      try {
        p.text = io::render_chat(tok, model_type, messages, /*add_generation_prompt=*/true);
      } catch (const Error& e) {
        RLHF_FAIL("{}:{}: --apply_chat_template: {}", path, line, e.what());
      }
      p.add_bos = false;
    } else {
      for (const io::ChatMessage& m : messages) p.text += (p.text.empty() ? "" : "\n") + m.content;
    }
    prompts.push_back(std::move(p));
    return true;
  });
  RLHF_CHECK(!prompts.empty(), "{}: no prompts (the file has no JSON objects)", path);
  return prompts;
}

// --- progress and stats of the engines, reported to world rank 0 by point-to-point messages

constexpr int kReportTag = 7411;  // tag of the engine → rank 0 report messages on the world comm

// One engine's report: running counters, or (final = 1) its last stats after generate().
struct Report {
  double engine = 0, final = 0, done = 0, total = 0, tokens = 0;
  double prefill_tokens = 0, prefill_s = 0, decode_steps = 0, decode_tokens = 0, decode_s = 0;
  double peak_kv_bytes = 0, total_s = 0;
  static constexpr int kCount = 12;
  double* data() { return &engine; }
};
static_assert(sizeof(Report) == Report::kCount * sizeof(double));

Report make_report(int engine, bool final, int64_t done, int64_t total,
                   const rollout::EngineStats& st, double bytes_per_block) {
  Report r;
  r.engine = engine;
  r.final = final ? 1 : 0;
  r.done = double(done);
  r.total = double(total);
  r.tokens = double(st.generated_tokens);
  r.prefill_tokens = double(st.prefill_tokens);
  r.prefill_s = st.prefill_s;
  r.decode_steps = double(st.decode_steps);
  r.decode_tokens = double(st.decode_tokens);
  r.decode_s = st.decode_s;
  r.peak_kv_bytes = double(st.peak_kv_blocks) * bytes_per_block;
  r.total_s = st.total_s;
  return r;
}

// Rank 0's view of every engine: the latest report of each, and how many have finished.
class ProgressBoard {
 public:
  ProgressBoard(int num_engines, int64_t total_samples, bool quiet, MPI_Comm world)
      : last_(size_t(num_engines)),
        heard_(size_t(num_engines), Clock::now()),
        total_(total_samples),
        quiet_(quiet),
        world_(world) {}

  void update(const Report& r) {
    last_.at(size_t(r.engine)) = r;
    heard_.at(size_t(r.engine)) = Clock::now();
    finals_ += r.final != 0;
  }
  // Engines report every 2 s while they generate: one silent for longer than --comm_timeout
  // (stopped, hung) ends the job instead of leaving rank 0 waiting for it forever.
  void check_silence() const {
    const double limit = parallel::comm_watch_timeout();
    if (limit <= 0) return;
    for (size_t e = 0; e < last_.size(); ++e) {
      const double silent = seconds_since(heard_[e]);
      if (last_[e].final == 0 && silent > limit)
        parallel::comm_watch_abort(
            fmt::format("engine {} has sent no progress for {:.0f} s (last: {}/{} samples)", e,
                        silent, int64_t(last_[e].done), int64_t(last_[e].total)));
    }
  }
  // Receives the reports that have arrived (MPI_Iprobe; never blocks).
  void drain() {
    for (;;) {
      int flag = 0;
      MPI_Status st;
      MPI_CHECK(MPI_Iprobe(MPI_ANY_SOURCE, kReportTag, world_, &flag, &st));
      if (!flag) return;
      receive(st.MPI_SOURCE);
    }
  }
  // Blocks until every engine's final report is in (after the engines have finished).
  void wait_finals() {
    while (finals_ < int(last_.size())) receive(MPI_ANY_SOURCE);
  }
  // The progress line, at most every 5 s.
  void maybe_print() {
    if (quiet_ || seconds_since(last_print_) < 5.0) return;
    last_print_ = Clock::now();
    double done = 0, tokens = 0;
    for (const Report& r : last_) done += r.done, tokens += r.tokens;
    const double elapsed = seconds_since(t0_);
    LOG0_INFO(
        "generate: {}/{} samples ({:.1f}%) | {} tokens | {:.0f} tok/s | {}/{} engines done | "
        "elapsed {:.1f}s",
        int64_t(done), total_, 100.0 * done / double(std::max<int64_t>(total_, 1)), int64_t(tokens),
        tokens / std::max(elapsed, 1e-9), finals_, last_.size(), elapsed);
  }
  const std::vector<Report>& reports() const { return last_; }

 private:
  void receive(int source) {
    Report r;
    MPI_CHECK(MPI_Recv(r.data(), Report::kCount, MPI_DOUBLE, source, kReportTag, world_,
                       MPI_STATUS_IGNORE));
    update(r);
  }
  std::vector<Report> last_;
  std::vector<Clock::time_point> heard_;  // when each engine last reported
  int64_t total_ = 0;
  int finals_ = 0;
  bool quiet_ = false;
  MPI_Comm world_;
  Clock::time_point t0_ = Clock::now(), last_print_ = Clock::now();
};

// Rank 0's heartbeat to the other ranks while the run lasts. A rank that finished its share waits
// in the gather for rank 0, whose own share may legitimately take much longer, so the wait itself
// is not watched; silence is: rank 0 sends a message every 2 s (on a communicator of its own, so
// a beat still in flight at the end is dropped with it), and a waiting rank that hears none for
// --comm_timeout (rank 0 stopped, hung or dead) ends the job naming it.
class Heartbeat {
 public:
  explicit Heartbeat(MPI_Comm world) {
    parallel::WatchScope watch("MPI_Comm_dup (heartbeat)", "world");  // collective
    MPI_CHECK(MPI_Comm_dup(world, &comm_));
    rank_ = parallel::comm_rank(comm_);
    MPI_Comm_size(comm_, &size_);
  }
  ~Heartbeat() { parallel::free_comm_quietly(&comm_); }
  Heartbeat(const Heartbeat&) = delete;
  Heartbeat& operator=(const Heartbeat&) = delete;

  // Rank 0: a beat to every other rank when 2 s have passed since the last one.
  void beat() {
    if (rank_ != 0 || seconds_since(last_) < 2.0) return;
    last_ = Clock::now();
    parallel::WatchScope watch("heartbeat send", "generate heartbeat");
    const int one = 1;
    for (int r = 1; r < size_; ++r) MPI_CHECK(MPI_Send(&one, 1, MPI_INT, r, kTag, comm_));
  }
  // Other ranks: takes the beats that arrived; ends the job when none came for --comm_timeout.
  void listen() {
    if (rank_ == 0) return;
    for (;;) {
      int flag = 0, x = 0;
      MPI_CHECK(MPI_Iprobe(0, kTag, comm_, &flag, MPI_STATUS_IGNORE));
      if (!flag) break;
      MPI_CHECK(MPI_Recv(&x, 1, MPI_INT, 0, kTag, comm_, MPI_STATUS_IGNORE));
      last_ = Clock::now();
    }
    const double limit = parallel::comm_watch_timeout();
    if (limit > 0 && seconds_since(last_) > limit)
      parallel::comm_watch_abort(fmt::format(
          "rank {} waits for rank 0 in the gather of the completions, and rank 0 has sent no "
          "heartbeat for {:.0f} s",
          rank_, seconds_since(last_)));
  }

 private:
  static constexpr int kTag = 7412;
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  Clock::time_point last_ = Clock::now();
};

// Waits for a non-blocking request, sleeping between tests (idle ranks must not spin on the cores
// the engines use); `poll` runs between tests.
template <class Poll>
void wait_sleeping(MPI_Request* req, Poll&& poll) {
  for (;;) {
    int flag = 0;
    MPI_CHECK(MPI_Test(req, &flag, MPI_STATUS_IGNORE));
    if (flag) return;
    poll();
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

// Gathers the serialized samples of every rank to rank 0 of `world` (sleeping while waiting);
// returns them on rank 0 sorted by (prompt index, sample index), empty elsewhere.
template <class Poll>
std::vector<rollout::Sample> gather_samples(const std::vector<rollout::Sample>& local,
                                            MPI_Comm world, Poll&& poll) {
  const int rank = parallel::comm_rank(world);
  int n = 0;
  MPI_Comm_size(world, &n);
  const std::vector<uint8_t> mine = rollout::serialize_samples(local);
  RLHF_CHECK(mine.size() < size_t(std::numeric_limits<int>::max()),
             "an engine generated more than 2 GiB of completions\nhint: split --dataset (or use "
             "--max_samples) and run generate on each part");
  int my = int(mine.size());
  std::vector<int> sizes(static_cast<size_t>(n)), displs(static_cast<size_t>(n));
  MPI_Request req;
  MPI_CHECK(MPI_Igather(&my, 1, MPI_INT, sizes.data(), 1, MPI_INT, 0, world, &req));
  wait_sleeping(&req, poll);
  int64_t total = 0;
  if (rank == 0) {
    for (int j = 0; j < n; ++j) {
      displs[size_t(j)] = int(total);
      total += sizes[size_t(j)];
    }
    RLHF_CHECK(total < std::numeric_limits<int>::max(),
               "the completions exceed 2 GiB\nhint: split --dataset (or use --max_samples) and run "
               "generate on each part");
  }
  std::vector<uint8_t> all(size_t(rank == 0 ? total : 0));
  MPI_CHECK(MPI_Igatherv(mine.data(), my, MPI_BYTE, all.data(), sizes.data(), displs.data(),
                         MPI_BYTE, 0, world, &req));
  wait_sleeping(&req, poll);
  std::vector<rollout::Sample> out;
  if (rank != 0) return out;
  for (int j = 0; j < n; ++j) {
    auto part =
        rollout::deserialize_samples(all.data() + displs[size_t(j)], size_t(sizes[size_t(j)]));
    for (rollout::Sample& s : part) out.push_back(std::move(s));
  }
  rollout::sort_samples(out);
  return out;
}

// The prompts [lo, hi) of engine `e` of `n_engines` for `n_prompts` prompts: contiguous blocks
// by prompt index, sizes differing by at most one.
std::pair<int64_t, int64_t> engine_prompt_range(int64_t n_prompts, int e, int n_engines) {
  return {n_prompts * e / n_engines, n_prompts * (e + 1) / n_engines};
}

}  // namespace

int run_generate(const GenerateArgs& args) {
  const int tp = args.gen.vllm_tensor_parallel_size;
  int threads = 1;
  const std::unique_ptr<parallel::Topology> topo =
      parallel::setup_topology(runtime_options(args.parallel, tp), &threads);
  const parallel::Device device =
      parallel::setup_device(runtime_options(args.parallel, tp), *topo, nullptr);
  const parallel::Placement& pl = topo->placement();
  const MPI_Comm world = topo->world();
  const int rank = topo->rank(), n_engines = pl.num_engines();
  const int engine_id = topo->me().engine;
  const bool leader = topo->generates() && topo->me().engine_rank == 0;  // reports the engine
  const auto t_start = Clock::now();

  // --- model and tokenizer (every rank: cheap, and errors then stop every rank alike)
  ModelArgs margs;
  margs.pretrain = args.pretrain;
  margs.tokenizer = args.tokenizer;
  const io::ModelSource src = model_source(margs, model::HeadKind::kLM);
  const model::ModelConfig& cfg = src.config;
  const auto tokenizer = io::model_tokenizer(src);  // the model's own, else bytes
  RLHF_CHECK(!src.checkpoint.empty(),
             "rlhf generate needs a model to sample from\nhint: pass --pretrain CHECKPOINT");
  model::ParamLayout layout(cfg, model::HeadKind::kLM);
  LOG0_INFO("model: {} | {} parameters | {} layers, hidden {}, heads {}/{} | {}", cfg.model_type,
            layout.num_parameters(), cfg.num_hidden_layers, cfg.hidden_size,
            cfg.num_attention_heads, cfg.num_key_value_heads, src.describe());

  // --- prompts → requests (every rank tokenizes all prompts: each engine takes its block, rank 0
  // writes the texts). request id = prompt index: the random stream does not depend on the rank.
  const std::vector<Prompt> prompts = read_prompts(args, *tokenizer, cfg.model_type);
  const int64_t n_prompts = int64_t(prompts.size());
  rollout::SamplingParams sp;
  sp.temperature = args.gen.temperature;
  sp.top_p = args.gen.top_p;
  sp.top_k = args.gen.top_k;
  sp.greedy = args.gen.greedy;
  sp.seed = static_cast<uint64_t>(args.common.seed);
  sp.validate();
  std::vector<rollout::GenerationRequest> requests;
  int64_t prompt_tokens = 0, capped = 0;
  for (int64_t i = 0; i < n_prompts; ++i) {
    rollout::GenerationRequest r;
    r.id = uint64_t(i);
    r.prompt = tokenizer->encode(prompts[size_t(i)].text, prompts[size_t(i)].add_bos, false);
    const int64_t P = static_cast<int64_t>(r.prompt.size());
    RLHF_CHECK(P < cfg.max_position_embeddings,
               "{}:{}: the prompt is {} tokens, which leaves no room to generate under "
               "the model's max_position_embeddings = {}",
               args.dataset, prompts[size_t(i)].line, P, cfg.max_position_embeddings);
    if (P + args.gen.generate_max_len > cfg.max_position_embeddings) ++capped;
    r.n_samples = args.gen.n_samples_per_prompt;
    r.max_new_tokens = args.gen.generate_max_len;
    r.sampling = sp;
    prompt_tokens += P;
    requests.push_back(std::move(r));
  }
  const int64_t total_samples = n_prompts * args.gen.n_samples_per_prompt;
  LOG0_INFO("data: {} | {} prompts, {} prompt tokens | {} samples per prompt | {}", args.dataset,
            n_prompts, prompt_tokens, args.gen.n_samples_per_prompt,
            sp.is_greedy() ? std::string("greedy")
                           : fmt::format("temperature {} top_p {} top_k {}", sp.temperature,
                                         sp.top_p, sp.top_k));
  if (capped > 0)
    LOG0_WARN(
        "{} prompt(s) leave fewer than --generate_max_len {} positions under "
        "max_position_embeddings {}: their samples stop there (finish_reason \"length\")",
        capped, args.gen.generate_max_len, cfg.max_position_embeddings);
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
  const std::filesystem::path out(args.output_path);
  const std::string tmp = args.output_path + ".tmp";
  if (rank == 0) {
    if (out.has_parent_path()) std::filesystem::create_directories(out.parent_path());
    std::ofstream f(tmp, std::ios::trunc);
    RLHF_CHECK(f.good(), "--output_path {}: cannot open {} for writing", args.output_path, tmp);
  }

  // --- generate: every engine its block of prompts; rank 0 collects the progress reports
  ProgressBoard board(n_engines, total_samples, args.common.disable_progress, world);
  Heartbeat heartbeat(world);
  parallel::set_watch_context(fmt::format("generate, engine {}", engine_id));
  const auto t_gen = Clock::now();
  std::vector<rollout::Sample> local;
  if (topo->generates()) {
    // The engine's tensor-parallel group (collective over engine_comm; TP 1: none).
    const std::unique_ptr<parallel::Comm> tp_comm =
        tp > 1 ? parallel::make_comm(topo->engine_comm(), "engine_comm") : nullptr;
    rollout::Engine engine(
        layout, engine_options(args.gen, device, tp_comm.get(), tokenizer->eos_id(),
                               cpu_bf16(args.parallel, device == parallel::Device::kCuda)));
    io::load_model_weights(src, layout, engine.unit_buffers());  // any --pretrain format
    const rollout::KvCache& kv = engine.kv_cache();
    if (rank == 0)
      LOG0_INFO("engine {}: KV cache {} = {} blocks of {} positions ({} per position)", engine_id,
                format_bytes(double(kv.capacity_bytes())), kv.num_blocks(), kv.block_size(),
                format_bytes(double(kv.bytes_per_token())));
    const auto [lo, hi] = engine_prompt_range(n_prompts, engine_id, n_engines);
    const std::vector<rollout::GenerationRequest> mine(requests.begin() + lo,
                                                       requests.begin() + hi);
    const double bpb = double(kv.bytes_per_block());
    const int64_t my_total = (hi - lo) * args.gen.n_samples_per_prompt;
    auto last_report = Clock::now();
    // Reports go to rank 0 every 2 s (rank 0's own engine updates the board directly).
    const auto report = [&](const Report& r) {
      if (!leader) return;
      if (rank == 0) {
        board.update(r);
      } else {
        Report copy = r;
        MPI_CHECK(MPI_Send(copy.data(), Report::kCount, MPI_DOUBLE, 0, kReportTag, world));
      }
    };
    const rollout::ProgressFn progress = [&](const rollout::EngineStats& st, int64_t done,
                                             int64_t) {
      if (rank == 0) {
        board.drain();
        board.update(make_report(engine_id, false, done, my_total, st, bpb));
        board.maybe_print();
        board.check_silence();  // a stopped engine ends the job while rank 0 still generates
        heartbeat.beat();
      } else {
        heartbeat.listen();  // rank 0 stopped: end the job now, not after this engine's share
      }
      if (rank != 0 && seconds_since(last_report) >= 2.0) {
        last_report = Clock::now();
        report(make_report(engine_id, false, done, my_total, st, bpb));
      }
    };
    // Multi-turn episodes (--env_command, --stop_strings): one environment per engine (on its TP
    // rank 0).
    const std::unique_ptr<rl::Environment> env =
        args.gen.env_command.empty()
            ? nullptr
            : rl::make_environment(args.gen.env_command, args.gen.env_timeout, engine.tp_rank());
    rl::EpisodeOptions episodes;
    episodes.env = env.get();
    episodes.stop_strings = rl::parse_stop_strings(args.gen.stop_strings);
    episodes.max_turns = args.gen.env_max_turns;
    std::vector<rl::EpisodeContext> contexts;
    for (int64_t i = lo; i < hi; ++i) contexts.push_back({&prompts[size_t(i)].text, nullptr});
    std::vector<rollout::Sample> mine_samples;
    parallel::maybe_inject_stop("generate", rank);  // tests: a silent engine
    if (!mine.empty())
      mine_samples =
          rl::generate_episodes(engine, mine, contexts, lo, *tokenizer, episodes, progress);
    const rollout::EngineStats st = mine.empty() ? rollout::EngineStats{} : engine.stats();
    report(make_report(engine_id, true, my_total, my_total, st, bpb));
    if (leader) local = std::move(mine_samples);
  }
  // Idle ranks wait here asleep; rank 0 prints progress while it waits.
  parallel::set_watch_context("generate, gathering the completions");
  const auto poll = [&] {
    if (rank != 0) return heartbeat.listen();
    heartbeat.beat();
    board.drain();
    board.maybe_print();
    board.check_silence();
  };
  const std::vector<rollout::Sample> samples = gather_samples(local, world, poll);
  if (rank == 0) board.wait_finals();
  const double gen_s = seconds_since(t_gen);
  if (rank != 0) return 0;

  // --- rank 0: write <output_path>.tmp, then rename (a crash never leaves a partial file)
  RLHF_CHECK(int64_t(samples.size()) == total_samples,
             "gathered {} completions, expected {} ({} prompts x {} samples)", samples.size(),
             total_samples, n_prompts, args.gen.n_samples_per_prompt);
  int64_t stops = 0, tokens = 0;
  {
    std::ofstream f(tmp, std::ios::trunc);
    RLHF_CHECK(f.good(), "--output_path {}: cannot open {} for writing", args.output_path, tmp);
    const bool with_env = !args.gen.env_command.empty();
    for (const rollout::Sample& s : samples) {
      const size_t i = static_cast<size_t>(s.prompt_pos);
      stops += s.stopped;
      tokens += int64_t(s.response.size());
      nlohmann::ordered_json j = {
          {"prompt_index", s.prompt_pos},
          {"sample_index", s.sample_index},
          {"prompt", prompts[i].text},
          {"completion", tokenizer->decode(s.response, /*skip_special_tokens=*/true)},
          {"completion_token_ids", s.response},
          {"logprobs", s.gen_logprobs},
          {"finish_reason", rollout::to_string(s.finish)},
          {"prompt_tokens", s.prompt.size()},
          {"completion_tokens", s.response.size()}};
      if (with_env) {  // multi-turn: which tokens the environment wrote, turns, its reward
        j["action_mask"] =
            s.action_mask.empty() ? std::vector<uint8_t>(s.response.size(), 1) : s.action_mask;
        j["turns"] = s.turns;
        j["env_reward"] =
            s.has_env_reward ? nlohmann::ordered_json(s.env_reward) : nlohmann::ordered_json();
      }
      // Byte-level completions need not be valid UTF-8: invalid bytes become U+FFFD in the text
      // (the token ids keep them exactly).
      f << j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace) << '\n';
    }
    f.flush();
    RLHF_CHECK(f.good(), "--output_path {}: write to {} failed", args.output_path, tmp);
    LOG0_INFO("finish reasons: {} ended on their own (EOS, stop string, environment), {} cut",
              stops, int64_t(samples.size()) - stops);
  }
  std::error_code ec;
  std::filesystem::rename(tmp, out, ec);
  RLHF_CHECK(!ec, "--output_path {}: cannot rename {}: {}", args.output_path, tmp, ec.message());

  // Summary: wall-clock throughput over all engines, then the engines' own counters.
  Report sum;
  double peak_kv = 0, slowest = 0;
  for (const Report& r : board.reports()) {
    sum.prefill_tokens += r.prefill_tokens;
    sum.decode_steps += r.decode_steps;
    sum.decode_tokens += r.decode_tokens;
    peak_kv = std::max(peak_kv, r.peak_kv_bytes);
    slowest = std::max(slowest, r.total_s);
  }
  LOG0_INFO(
      "done: {} samples of {} prompts on {} engine{} | {} tokens in {:.2f}s = {:.0f} tok/s | "
      "prefill {} tokens | decode {} steps, mean batch {:.1f} | slowest engine {:.2f}s, peak KV "
      "{} per engine | total {:.1f}s | {}",
      samples.size(), n_prompts, n_engines, n_engines == 1 ? "" : "s", tokens, gen_s,
      double(tokens) / std::max(gen_s, 1e-9), int64_t(sum.prefill_tokens),
      int64_t(sum.decode_steps), sum.decode_steps > 0 ? sum.decode_tokens / sum.decode_steps : 0.0,
      slowest, format_bytes(peak_kv), seconds_since(t_start), args.output_path);
  return 0;
}

}  // namespace rlhf::app
