#include "rollout/engine.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <exception>

#include "core/checked_alloc.h"
#include "core/error.h"
#include "core/log.h"
#include "model/ops/half.h"
#include "rollout/engine_run.h"

namespace rlhf::rollout {

namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// Returns the KV blocks of a group of sequences if the call throws before each is handed on.
template <typename Seq>
struct ReleaseOnExit {
  KvCache& cache;
  std::vector<std::unique_ptr<Seq>>& seqs;
  ~ReleaseOnExit() {
    for (auto& s : seqs)
      if (s && !s->blocks.empty()) cache.release(s->blocks);
  }
};

}  // namespace

const char* to_string(FinishReason r) {
  switch (r) {
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kStopString:
      return "stop_string";
    case FinishReason::kEnvDone:
      return "env_done";
    case FinishReason::kMaxTurns:
      return "max_turns";
  }
  return "?";
}

// ---------------------------------------------------------------------------------------------
// Weights

EngineWeights::EngineWeights(const model::ParamLayout& layout, const std::vector<int64_t>& room) {
  RLHF_CHECK(room.empty() || int(room.size()) == layout.num_units(),
             "engine weights: room for {} units, the model has {}", room.size(),
             layout.num_units());
  for (int u = 0; u < layout.num_units(); ++u) {
    const int64_t n = std::max(layout.unit(u).numel, room.empty() ? 0 : room[size_t(u)]);
    units_.emplace_back();
    checked_assign(units_.back(), n, 0.0f,
                   fmt::format("the engine weights of unit '{}'", layout.unit(u).name));
  }
}

float* EngineWeights::acquire_grads(int u) {
  RLHF_FAIL("the rollout engine holds weights only: no gradient buffer for unit {}", u);
}

// ---------------------------------------------------------------------------------------------
// Backends

float* EngineBackend::batch_logits(int64_t G, int64_t V) {
  checked_grow(batch_logits_, G * V, "the engine's prefill logits");
  return batch_logits_.data();
}

const float* EngineBackend::prefill_batch(const PrefillBatch& b) {
  const int64_t V = b.vocab_size;
  float* out = batch_logits(b.G, V);
  for (int64_t g = 0; g < b.G; ++g) {
    const float* logits =
        prefill(b.tokens + b.offsets[g], b.offsets[g + 1] - b.offsets[g], b.blocks[g]);
    std::copy_n(logits, V, out + g * V);
  }
  return out;
}

TpGroup tp_group(parallel::Comm* tp_comm) {
  TpGroup g;
  if (tp_comm != nullptr && tp_comm->size() > 1) {
    g.comm = tp_comm;
    g.size = tp_comm->size();
    g.rank = tp_comm->rank();
  }
  return g;
}

std::string tp_split_problem(const model::ModelConfig& c, int T) {
  auto fits = [&](int64_t t) {
    return c.num_attention_heads % t == 0 && c.num_key_value_heads % t == 0 &&
           c.intermediate_size % t == 0;
  };
  if (T >= 1 && fits(T)) return "";
  std::string ok;
  for (int t = 1; t <= 64; ++t)
    if (fits(t)) ok += (ok.empty() ? "" : ", ") + std::to_string(t);
  return fmt::format(
      "--vllm_tensor_parallel_size {}: tensor parallel size {} must divide the attention heads "
      "({}), the KV heads ({}) and intermediate_size ({}) of the model\nhint: use a "
      "--vllm_tensor_parallel_size that divides all three: {}",
      T, T, c.num_attention_heads, c.num_key_value_heads, c.intermediate_size, ok);
}

model::LayerSpec tp_layer_spec(const model::ModelConfig& c, const TpGroup& tp) {
  model::LayerSpec s = model::layer_spec(c);
  const int T = tp.size;
  if (T == 1) return s;
  const std::string problem = tp_split_problem(c, T);
  RLHF_CHECK(problem.empty(), "{}", problem);
  s.H /= T;
  s.Hkv /= T;
  s.F /= T;
  return s;
}

model::ModelConfig tp_kv_config(const model::ModelConfig& c, const TpGroup& tp) {
  model::ModelConfig kv = c;
  if (tp.size > 1) {
    kv.head_dim = c.D();
    kv.num_key_value_heads = c.num_key_value_heads / tp.size;
  }
  return kv;
}

// ---------------------------------------------------------------------------------------------
// Engine

/// The scheduler's buffers: a decode step's host inputs, and the samplers.
struct Engine::Work {
  std::vector<int32_t> tokens, pos, lens, table;
  std::vector<int64_t> last_row;       // per sequence: its last row (whose logits are sampled)
  std::vector<Sampler> samplers;       // one per OpenMP thread
  std::vector<Seq*> batch;             // the sequences of a decode step
  std::vector<SampledToken> sampled;   // their sampled tokens
  std::vector<float> inv_temperature;  // device sampling's inputs: per sequence 1/T (0 = greedy)
  std::vector<double> draws;           // and its uniform draw
};

Engine::Engine(const model::ParamLayout& layout, const EngineOptions& options)
    : layout_(layout),
      opt_(options),
      weights_(layout, options.unit_room),
      work_(std::make_unique<Work>()) {
  RLHF_CHECK(layout.head() == model::HeadKind::kLM,
             "the generation engine needs a model with an LM head, not '{}'",
             model::to_string(layout.head()));
  RLHF_CHECK(opt_.max_batch >= 1, "engine: max_batch must be >= 1, got {}", opt_.max_batch);
  RLHF_CHECK(opt_.block_size >= 0, "engine: --kv_block_size must be >= 0, got {}", opt_.block_size);
  opt_.block_size = opt_.resolved_block_size();
  tp_ = tp_group(opt_.tp_comm);
  (void)tp_layer_spec(layout.config(), tp_);  // the group must divide the heads and MLP columns
  backend_ = opt_.cuda ? make_cuda_backend(layout_, opt_, weights_, tp_)
                       : make_cpu_backend(layout_, opt_, weights_, tp_);
}

Engine::~Engine() = default;

void Engine::set_lora(const model::LoraConfig& cfg) {
  auto layout = std::make_unique<model::LoraLayout>(model::layer_spec(layout_.config()),
                                                    int(layout_.config().num_hidden_layers), cfg);
  lora_.assign(size_t(layout->numel()), 0.0f);
  backend_->set_lora(layout.get(), lora_.data());
  lora_layout_ = std::move(layout);
}

int64_t Engine::sleep() {
  if (sleeping_) return 0;
  if (!generating_) release_kept();  // the cache goes: no sample can continue from it
  const int64_t busy = backend_->kv_cache().used_blocks();
  RLHF_CHECK(!generating_ && busy == 0,
             "engine sleep (--vllm_enable_sleep): sequences are in flight (a generate() call "
             "running: {}; {} KV block(s) in use); an engine sleeps only once every sequence has "
             "finished",
             generating_ ? "yes" : "no", busy);
  const int64_t freed = backend_->sleep();
  sleeping_ = true;
  return freed;
}

int64_t Engine::wake() {
  if (!sleeping_) return 0;
  const int64_t bytes = backend_->wake();
  sleeping_ = false;
  // A GPU backend's device weights came back zeroed: until a device sync writes them again
  // (device_weights_updated), generate() uploads the host buffers.
  device_weights_current_ = false;
  return bytes;
}

Engine::MemoryPlan Engine::memory_plan() const {
  MemoryPlan p;
  p.backend = backend_->memory_plan();
  for (int u = 0; u < num_units(); ++u) {
    const int64_t room = opt_.unit_room.empty() ? 0 : opt_.unit_room[size_t(u)];
    p.host_weights += std::max(layout_.unit(u).numel, room) * int64_t(sizeof(float));
  }
  return p;
}

std::string Engine::describe(const MemoryPlan& p, bool sleep) {
  const EngineMemoryPlan& b = p.backend;
  std::string s =
      b.device ? fmt::format(
                     "host fp32 weights {} | device: bf16 weights {} | KV cache {} | "
                     "buffers {}",
                     format_bytes(double(p.host_weights)), format_bytes(double(b.weights)),
                     format_bytes(double(b.kv_cache)), format_bytes(double(b.buffers)))
               : fmt::format("host: fp32 weights {} | decode weight copies {} | KV cache {}",
                             format_bytes(double(p.host_weights)), format_bytes(double(b.weights)),
                             format_bytes(double(b.kv_cache)));
  if (sleep)
    s += fmt::format(" | asleep while training: {} {} freed", format_bytes(double(b.sleep_frees)),
                     b.device ? "device" : "host");
  return s;
}

#ifdef RLHF_CUDA
std::vector<model::bf16*> Engine::device_unit_buffers() {
  RLHF_CHECK(on_gpu(), "device_unit_buffers: this engine runs on the CPU");
  RLHF_CHECK(!sleeping_,
             "device_unit_buffers: the engine is asleep (--vllm_enable_sleep); wake() it before "
             "the weight sync");
  return backend_->device_units();
}
#endif

std::vector<float*> Engine::unit_buffers() {
  std::vector<float*> out;
  for (int u = 0; u < num_units(); ++u) out.push_back(unit_buffer(u));
  return out;
}

int64_t Engine::weight_bytes_per_decode_step() const {
  int64_t n = 0;
  for (int l = 0; l < layout_.config().num_hidden_layers; ++l)
    for (const model::TensorInfo& t : layout_.unit(layout_.layer_unit(l)).tensors) n += t.numel;
  for (const model::TensorInfo& t : layout_.unit(layout_.head_unit()).tensors) n += t.numel;
  if (layout_.config().tie_word_embeddings)
    n += layout_.unit(layout_.embedding_unit()).at("embed_tokens.weight").numel;
  return n * backend_->weight_element_bytes();
}

// ---------------------------------------------------------------------------------------------
// Scheduling

Engine::Plan Engine::validate(const std::vector<GenerationRequest>& requests) const {
  const KvCache& kv = backend_->kv_cache();
  const model::ModelConfig& c = layout_.config();
  const int64_t V = c.vocab_size, max_pos = c.max_position_embeddings;
  const int64_t R = static_cast<int64_t>(requests.size());
  Plan plan;
  plan.max_new.resize(static_cast<size_t>(R));
  plan.blocks_per.resize(static_cast<size_t>(R));
  for (int64_t i = 0; i < R; ++i) {
    const GenerationRequest& r = requests[size_t(i)];
    const int64_t P = static_cast<int64_t>(r.prompt.size());
    RLHF_CHECK(P >= 1, "request {} (id {}): empty prompt", i, r.id);
    for (int64_t t = 0; t < P; ++t)
      RLHF_CHECK(r.prompt[size_t(t)] >= 0 && r.prompt[size_t(t)] < V,
                 "request {} (id {}): prompt token {} at position {} is outside the vocabulary "
                 "[0, {})",
                 i, r.id, r.prompt[size_t(t)], t, V);
    RLHF_CHECK(r.n_samples >= 1, "request {} (id {}): n_samples must be >= 1, got {}", i, r.id,
               r.n_samples);
    RLHF_CHECK(r.max_new_tokens >= 1, "request {} (id {}): max_new_tokens must be >= 1, got {}", i,
               r.id, r.max_new_tokens);
    try {
      r.sampling.validate();
    } catch (const Error& e) {
      RLHF_FAIL("request {} (id {}): {}", i, r.id, e.what());
    }
    RLHF_CHECK(P < max_pos,
               "request {} (id {}): a prompt of {} tokens leaves no room to generate under "
               "max_position_embeddings = {}",
               i, r.id, P, max_pos);
    plan.max_new[size_t(i)] = std::min(r.max_new_tokens, max_pos - P);
    const int64_t K = static_cast<int64_t>(r.prefix.size());
    RLHF_CHECK(K < plan.max_new[size_t(i)],
               "request {} (id {}): a continuation of {} tokens leaves no room under its {} new "
               "tokens",
               i, r.id, K, plan.max_new[size_t(i)]);
    RLHF_CHECK(r.prefix_logprobs.empty() || r.prefix_logprobs.size() == r.prefix.size(),
               "request {} (id {}): {} prefix log-probs for {} prefix tokens", i, r.id,
               r.prefix_logprobs.size(), K);
    for (int64_t t = 0; t < K; ++t)
      RLHF_CHECK(r.prefix[size_t(t)] >= 0 && r.prefix[size_t(t)] < V,
                 "request {} (id {}): prefix token {} at position {} is outside the vocabulary "
                 "[0, {})",
                 i, r.id, r.prefix[size_t(t)], t, V);
    RLHF_CHECK(r.first_sample_index >= 0, "request {} (id {}): first_sample_index {} < 0", i, r.id,
               r.first_sample_index);
    // Positions a sample can ever hold: the prompt and every generated token but the last (which
    // is sampled and never fed back).
    const int64_t positions = P + plan.max_new[size_t(i)] - 1;
    plan.blocks_per[size_t(i)] = kv.blocks_for(positions);
    RLHF_CHECK(plan.blocks_per[size_t(i)] <= kv.num_blocks(),
               "request {} (id {}): one sample needs up to {} positions ({} bytes of KV cache) but "
               "the cache holds {} bytes\nhint: raise --gen_kv_cache_mb or lower "
               "--generate_max_len",
               i, r.id, positions, plan.blocks_per[size_t(i)] * kv.bytes_per_block(),
               kv.capacity_bytes());
    plan.samples_total += r.n_samples;
  }
  return plan;
}

void Engine::admit(const std::vector<GenerationRequest>& requests, Run& run) {
  const KvCache& kv = backend_->kv_cache();
  std::vector<Admission> batch;
  int64_t slots = opt_.max_batch - static_cast<int64_t>(run.active.size());
  int64_t free_blocks = kv.free_blocks(), tokens = 0;
  while (!run.pending.empty()) {
    Run::Pending& pr = run.pending.front();
    const int64_t per = run.plan.blocks_per[size_t(pr.index)];
    const int64_t group_max = std::min(opt_.max_batch, kv.num_blocks() / per);
    const int64_t want = std::min(pr.remaining, group_max);
    if (want <= slots && want * per > free_blocks && !kept_.empty()) {
      free_blocks += evict_kept(want * per - free_blocks);  // kept samples yield their blocks
      continue;
    }
    if (want > slots || want * per > free_blocks) {
      if (!run.waiting) ++stats_.admission_waits;
      run.waiting = true;
      break;
    }
    run.waiting = false;
    const GenerationRequest& r = requests[size_t(pr.index)];
    const int64_t P = static_cast<int64_t>(r.prompt.size() + r.prefix.size());
    if (!batch.empty() && tokens + P > opt_.prefill_batch_tokens) {  // this forward is full
      start_groups(requests, batch, run);
      batch.clear();
      tokens = 0;
      slots = opt_.max_batch - static_cast<int64_t>(run.active.size());
      free_blocks = kv.free_blocks();
      continue;
    }
    batch.push_back({pr.index, pr.next_sample, want});
    tokens += P;
    slots -= want;
    free_blocks -= want * per;
    pr.next_sample += want;
    pr.remaining -= want;
    if (pr.remaining == 0) run.pending.pop_front();
  }
  if (!batch.empty()) start_groups(requests, batch, run);
}

void Engine::start_groups(const std::vector<GenerationRequest>& requests,
                          const std::vector<Admission>& groups, Run& run) {
  const auto t_prefill = Clock::now();
  KvCache& kv = backend_->kv_cache();
  const int64_t G = static_cast<int64_t>(groups.size());
  std::vector<std::unique_ptr<Seq>> seqs;    // group g's samples from seqs[start[g]]
  const ReleaseOnExit seqs_guard{kv, seqs};  // until each is active or finished
  std::vector<int64_t> start(size_t(G) + 1, 0), offsets(size_t(G) + 1, 0);
  std::vector<int32_t> tokens;  // the prompts, each with a continuation's prefix after it
  for (int64_t g = 0; g < G; ++g) {
    const Admission& ad = groups[size_t(g)];
    const GenerationRequest& r = requests[size_t(ad.index)];
    for (int64_t j = 0; j < ad.n; ++j) {
      auto s = std::make_unique<Seq>();
      const bool allocated = kv.allocate(run.plan.blocks_per[size_t(ad.index)], s->blocks);
      RLHF_ASSERT(allocated);
      s->open(r, ad.index, r.first_sample_index + ad.first + j, run.plan.max_new[size_t(ad.index)]);
      s->len = static_cast<int64_t>(r.prompt.size() + r.prefix.size());
      seqs.push_back(std::move(s));
    }
    start[size_t(g) + 1] = static_cast<int64_t>(seqs.size());
    tokens.insert(tokens.end(), r.prompt.begin(), r.prompt.end());
    tokens.insert(tokens.end(), r.prefix.begin(), r.prefix.end());
    offsets[size_t(g) + 1] = static_cast<int64_t>(tokens.size());
  }
  // Each prompt (and a continuation's prefix after it) once under the current weights, all in one
  // backend call; then copied to the group's other samples.
  std::vector<const int32_t*> blocks(static_cast<size_t>(G));
  for (int64_t g = 0; g < G; ++g) blocks[size_t(g)] = seqs[size_t(start[size_t(g)])]->blocks.data();
  PrefillBatch pb;
  pb.G = G;
  pb.tokens = tokens.data();
  pb.offsets = offsets.data();
  pb.blocks = blocks.data();
  pb.vocab_size = layout_.config().vocab_size;
  const float* logits = backend_->prefill_batch(pb);
  ++stats_.prefill_batches;
  for (int64_t g = 0; g < G; ++g) {
    const int64_t P = offsets[size_t(g) + 1] - offsets[size_t(g)];
    for (int64_t i = start[size_t(g)] + 1; i < start[size_t(g) + 1]; ++i)
      backend_->copy_prefix(blocks[size_t(g)], seqs[size_t(i)]->blocks.data(), P);
    ++stats_.prefills;
    stats_.prefill_tokens += P;
  }
  for (int64_t g = 0; g < G; ++g) {
    const GenerationRequest& r = requests[size_t(groups[size_t(g)].index)];
    for (int64_t i = start[size_t(g)]; i < start[size_t(g) + 1]; ++i) {
      std::unique_ptr<Seq>& s = seqs[size_t(i)];
      const Run::Outcome o = run.append(
          *s, work_->samplers[0].sample(logits + g * pb.vocab_size, r.sampling, s->next_draw()));
      if (o == Run::Outcome::kGoing) run.active.push_back(std::move(s));
      if (o == Run::Outcome::kTurnEnd) run.turning.push_back(std::move(s));
    }
  }
  stats_.prefill_s += since(t_prefill);
}

bool Engine::observations_row_by_row() const {
  return opt_.observations_row_by_row || !backend_->feeds_observations();
}

DecodeBatch Engine::prepare_decode(const std::vector<Seq*>& active) {
  const int64_t B = static_cast<int64_t>(active.size());
  Work& w = *work_;
  // One row per token to feed: each sequence's last sampled token, then any observation tokens
  // (multi-turn), at consecutive positions — all in this step, or row by row one per step.
  const bool by_row = observations_row_by_row();
  auto rows_of = [&](const Seq& s) {
    return by_row ? int64_t(1) : 1 + static_cast<int64_t>(s.extra.size());
  };
  DecodeBatch d;
  d.B = B;
  w.last_row.resize(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b) {
    const Seq* s = active[size_t(b)];
    d.rows += rows_of(*s);
    w.last_row[size_t(b)] = d.rows - 1;
    d.max_blocks = std::max(d.max_blocks, static_cast<int64_t>(s->blocks.size()));
  }
  w.tokens.resize(static_cast<size_t>(d.rows));
  w.pos.resize(static_cast<size_t>(d.rows));
  w.lens.resize(static_cast<size_t>(d.rows));
  w.table.assign(static_cast<size_t>(d.rows * d.max_blocks), 0);
  int64_t row = 0;
  for (int64_t b = 0; b < B; ++b) {
    const Seq& s = *active[size_t(b)];
    for (int64_t j = 0; j < rows_of(s); ++j, ++row) {
      const int64_t k = by_row ? s.fed : j;  // 0 = next_token, k > 0 = extra[k - 1]
      w.tokens[size_t(row)] = k == 0 ? s.next_token : s.extra[size_t(k - 1)];
      w.pos[size_t(row)] = int32_t(s.len + j);
      w.lens[size_t(row)] = int32_t(s.len + j + 1);
      std::copy(s.blocks.begin(), s.blocks.end(), w.table.begin() + row * d.max_blocks);
    }
  }
  d.tokens = w.tokens.data();
  d.pos = w.pos.data();
  d.lens = w.lens.data();
  d.table = w.table.data();
  d.last_row = w.last_row.data();
  return d;
}

void Engine::decode_step(const std::vector<Seq*>& batch, bool by_row) {
  Work& w = *work_;
  const int64_t B = static_cast<int64_t>(batch.size());
  const int64_t V = layout_.config().vocab_size;
  const DecodeBatch d = prepare_decode(batch);
  w.sampled.resize(static_cast<size_t>(B));
  bool on_device = opt_.device_sampling;
  for (const Seq* s : batch) on_device = on_device && backend_->samples_on_device(*s->sampling);
  if (on_device) {
    w.inv_temperature.resize(static_cast<size_t>(B));
    w.draws.resize(static_cast<size_t>(B));
    for (int64_t b = 0; b < B; ++b) {
      const Seq& s = *batch[size_t(b)];
      w.inv_temperature[size_t(b)] =
          s.sampling->is_greedy() ? 0.0f : static_cast<float>(1.0 / s.sampling->temperature);
      w.draws[size_t(b)] = s.next_draw();
    }
    const SampledToken* t =
        backend_->decode_sampled(d, DeviceSampling{w.inv_temperature.data(), w.draws.data()});
    for (int64_t b = 0; b < B; ++b) {
      const Seq& s = *batch[size_t(b)];
      RLHF_CHECK(!s.samples_now(by_row) || t[b].token >= 0,
                 "sampling: the logits of request id {} (sample {}) are not finite on the "
                 "device\nhint: the weights or the activations overflowed",
                 s.request_id, s.sample_index);
      w.sampled[size_t(b)] = t[b];
    }
    ++stats_.device_sampled_steps;
    return;
  }
  const float* logits = backend_->decode(d);
  std::exception_ptr error;
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t b = 0; b < B; ++b) {
    try {
      const Seq& s = *batch[size_t(b)];
      if (!s.samples_now(by_row)) continue;
      w.sampled[size_t(b)] = w.samplers[size_t(omp_get_thread_num())].sample(
          logits + b * V, *s.sampling, s.next_draw());
    } catch (...) {
#pragma omp critical(rlhf_engine_error)
      if (!error) error = std::current_exception();
    }
  }
  if (error) std::rethrow_exception(error);
}

void Engine::decode_and_sample(Run& run) {
  const auto t_step = Clock::now();
  Work& w = *work_;
  std::vector<std::unique_ptr<Seq>>& active = run.active;
  std::vector<Seq*>& batch = w.batch;
  batch.clear();
  for (auto& s : active) batch.push_back(s.get());
  const int64_t B = static_cast<int64_t>(batch.size());
  const bool by_row = observations_row_by_row();
  decode_step(batch, by_row);
  ++stats_.decode_steps;
  stats_.decode_tokens += B;
  stats_.max_active = std::max(stats_.max_active, B);
  const double token_bytes = double(backend_->kv_cache().bytes_per_token());
  for (const Seq* s : batch) stats_.kv_bytes_read += double(s->len + 1) * token_bytes;
  size_t kept = 0;
  for (int64_t b = 0; b < B; ++b) {
    Seq& s = *active[size_t(b)];
    const bool sampled = s.samples_now(by_row);
    s.len += by_row ? 1 : 1 + static_cast<int64_t>(s.extra.size());  // the rows fed are cached
    if (!sampled) {
      ++s.fed;
      if (kept != size_t(b)) active[kept] = std::move(active[size_t(b)]);
      ++kept;
      continue;
    }
    s.fed = 0;
    s.extra.clear();
    const Run::Outcome o = run.append(s, w.sampled[size_t(b)]);
    if (o == Run::Outcome::kFinished) continue;
    if (o == Run::Outcome::kTurnEnd) {
      run.turning.push_back(std::move(active[size_t(b)]));
      continue;
    }
    if (kept != size_t(b)) active[kept] = std::move(active[size_t(b)]);
    ++kept;
  }
  active.resize(kept);
  stats_.decode_s += since(t_step);
}

std::vector<GenerationResult> Engine::generate(const std::vector<GenerationRequest>& requests,
                                               const ProgressFn& progress, const TurnHooks* hooks,
                                               int64_t quota_groups) {
  const auto t_start = Clock::now();
  stats_ = EngineStats{};
  const double device_s0 = backend_->decode_device_seconds();
  const double sampling_s0 = backend_->decode_sampling_device_seconds();
  if (hooks != nullptr) {
    RLHF_CHECK(hooks->max_turns >= 1, "multi-turn generation: max_turns must be >= 1, got {}",
               hooks->max_turns);
    RLHF_CHECK(quota_groups <= 0,
               "multi-turn generation has no generation quota (partial rollouts are single-turn)");
    for (const GenerationRequest& r : requests)
      RLHF_CHECK(r.prefix.empty(), "request id {}: multi-turn generation takes no prefix", r.id);
  }
  RLHF_CHECK(!sleeping_, "generate: the engine is asleep (--vllm_enable_sleep); wake() it first");
  struct Busy {  // sleep() refuses until this call returns (or throws)
    bool& flag;
    explicit Busy(bool& f) : flag(f) { flag = true; }
    ~Busy() { flag = false; }
  } busy(generating_);
  // The unit buffers may have changed (loading, weight sync) since the last call; after a device
  // sync the device copies are the weights until the host buffers are declared current again.
  if (opt_.bf16 && !opt_.cuda) {
    // A bf16 CPU engine reads every weight as its bf16 value (norms, biases and the embedding
    // too), as the bf16 trainer and a GPU engine do; rounding is idempotent, so weights that
    // arrived in bf16 (WeightSync's bf16) are left as they are.
    for (int u = 0; u < num_units(); ++u)
      model::round_to_bf16_n(weights_.unit_buffer(u), layout_.unit(u).numel);
  }
  backend_->prepare_weights(device_weights_current_);
  KvCache& kv = backend_->kv_cache();
  kv.reset_peak();
  const model::ModelConfig& c = layout_.config();
  const int64_t V = c.vocab_size;
  const int32_t eos = opt_.eos_token_id >= 0 ? opt_.eos_token_id : int32_t(c.eos_token_id);
  Run run(requests, validate(requests), kv, stats_, hooks, eos, opt_.ignore_eos, V);
  stats_.requests = static_cast<int64_t>(requests.size());
  stats_.samples = run.plan.samples_total;
  resume_kept(requests, run);  // before admission: kept samples already hold their blocks

  const int threads = omp_get_max_threads();
  std::vector<Sampler>& samplers = work_->samplers;
  if (static_cast<int>(samplers.size()) != threads ||
      (threads > 0 && samplers[0].vocab_size() != V)) {
    samplers.clear();
    for (int t = 0; t < threads; ++t) samplers.emplace_back(V);
  }

  while (run.busy()) {
    admit(requests, run);  // first come, first served, as long as slots and KV blocks allow
    if (run.active.empty() && run.turning.empty()) continue;  // all finished at a first token
    if (!run.active.empty()) decode_and_sample(run);
    if (!run.turning.empty()) run.resolve_turns(run.turning, run.active);  // the env's answers
    if (progress) progress(stats_, run.samples_done, run.plan.samples_total);
    if (quota_groups > 0 && run.busy() && run.quota_reached(requests, quota_groups)) {
      const int64_t before = kept_sequences();
      run.interrupt_all(requests, opt_.keep_interrupted_kv ? &kept_ : nullptr);
      stats_.kept += kept_sequences() - before;
    }
  }
  stats_.peak_kv_blocks = kv.peak_used_blocks();
  stats_.decode_device_s = backend_->decode_device_seconds() - device_s0;
  stats_.decode_sampling_device_s = backend_->decode_sampling_device_seconds() - sampling_s0;
  stats_.total_s = since(t_start);
  if (progress) progress(stats_, run.samples_done, run.plan.samples_total);
  return run.take_results();
}

}  // namespace rlhf::rollout
