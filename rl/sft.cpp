#include "rl/sft.h"

#include <unistd.h>

#include <filesystem>
#include <memory>
#include <vector>

#include "core/error.h"
#include "core/log.h"
#include "io/builtin_tasks.h"
#include "io/model_source.h"
#include "io/tokenizer.h"
#include "model/flops.h"
#include "parallel/lora_store.h"
#include "parallel/preemption.h"
#include "rl/packing.h"
#include "rl/weights.h"

namespace rlhf::rl {

namespace {

// Next-token cross-entropy, token mean over the optimizer step. Metric sums: [0] Σ −log p over
// loss tokens, [1] non-padding tokens.
class SftTask final : public SupervisedTask {
 public:
  SftTask(parallel::TrainModel& net, const io::SftDataset& data, const io::Tokenizer& tokenizer,
          const model::ModelConfig& cfg, int64_t max_len, bool packing)
      : net_(net),
        data_(data),
        tokenizer_(tokenizer),
        cfg_(cfg),
        max_len_(max_len),
        packing_(packing) {}

  int num_metrics() const override { return 2; }

  // The global number of loss tokens of the step: every rank's share summed (one all-reduce).
  void begin_step(int64_t step, std::span<const int64_t> samples, parallel::Comm& comm) override {
    double local = 0;
    for (const int64_t i : samples) local += double(io::sft_loss_tokens(data_.samples[size_t(i)]));
    n_loss_tokens_ = 0;
    comm.all_reduce(&local, &n_loss_tokens_, 1);
    RLHF_CHECK(n_loss_tokens_ > 0, "step {}: the batch has no loss tokens", step + 1);
  }

  // lp = log p(target) per token; dloss/dlp = −1 / N_loss on loss tokens, 0 elsewhere. With
  // packing the rows are laid end to end without padding (the same loss tokens).
  void micro_batch(std::span<const int64_t> samples, std::span<double> sums) override {
    const std::vector<int64_t> idx(samples.begin(), samples.end());
    io::TokenBatch batch = io::collate_sft(data_.samples, idx, tokenizer_.pad_id());
    model::SeqLens seqs;
    PackedRows packed;
    if (packing_) {
      std::vector<int64_t> len;
      for (const int64_t i : idx) len.push_back(int64_t(data_.samples[size_t(i)].tokens.size()));
      packed = pack_rows(batch.tokens.data(), batch.targets.data(), batch.B, batch.T, len);
      batch.tokens = packed.tokens;
      batch.targets = packed.targets;
      batch.B = 1;
      batch.T = packed.T;
      seqs = packed.seqs();
    }
    const int64_t N = batch.B * batch.T;
    lp_.resize(size_t(N));
    dlp_.resize(size_t(N));
    net_.forward_lm(batch.tokens.data(), batch.targets.data(), batch.B, batch.T, lp_.data(),
                    nullptr, true, 1.0f, seqs);
    for (int64_t n = 0; n < N; ++n) {
      const bool on = batch.targets[size_t(n)] >= 0;
      sums[0] -= on ? double(lp_[size_t(n)]) : 0.0;
      dlp_[size_t(n)] = on ? static_cast<float>(-1.0 / n_loss_tokens_) : 0.0f;
    }
    net_.backward_lm(dlp_.data(), nullptr);
    sums[1] += double(batch.real_tokens);
  }

  double loss(std::span<const double> sums) const override { return sums[0] / n_loss_tokens_; }

  std::string step_line(const StepReport& r) const override {
    return fmt::format(
        "step {}/{} ({:.1f}%) | loss {:.4f} | lr {:.3e} | grad_norm {:.3f} | {:.0f} tok/s | "
        "{:.1f} GFLOP/s | {:.2f}s/step (comm {:.2f}s) | elapsed {:.1f}s | eta {:.0f}s",
        r.step, r.total_steps, 100.0 * double(r.step) / double(r.total_steps), r.loss, r.lr,
        r.grad_norm, tokens_per_s(r), gflops_per_s(r), r.step_s, r.comm_s, r.elapsed_s, r.eta_s);
  }

  void add_metrics(const StepReport& r, nlohmann::json& rec) const override {
    rec["tokens"] = r.sums[1];
    rec["loss_tokens"] = n_loss_tokens_;
    rec["tokens_per_s"] = tokens_per_s(r);
    rec["gflops_per_s"] = gflops_per_s(r);
    rec["comm_time_s"] = r.comm_s;
    rec["comm_gb"] = r.comm_gb;
  }

  const io::Tokenizer* saved_tokenizer() const override { return &tokenizer_; }

 private:
  double tokens_per_s(const StepReport& r) const { return r.sums[1] / r.step_s; }
  // Training FLOPs of the step's real tokens at sequence length max_len (model/flops.h).
  double gflops_per_s(const StepReport& r) const {
    return r.sums[1] * model::training_flops_per_token(cfg_, max_len_) / r.step_s / 1e9;
  }

  parallel::TrainModel& net_;
  const io::SftDataset& data_;
  const io::Tokenizer& tokenizer_;
  const model::ModelConfig& cfg_;
  int64_t max_len_;
  bool packing_;
  double n_loss_tokens_ = 0;  // of the current step, over every rank
  std::vector<float> lp_, dlp_;
};

// The dataset; a builtin task (builtin:addition) is written to <save_path>/data first, then read
// like a file. Rank 0 keeps that file for the user; the others read a private copy (no shared
// file system is assumed) that is removed once loaded.
io::SftDataset load_sft_data(const SftConfig& c, const io::Tokenizer& tokenizer, int rank) {
  std::string path = c.dataset;
  if (io::is_builtin_dataset(path)) {
    const std::string out = (std::filesystem::path(c.train.save_path) / "data").string();
    const std::string dir = rank == 0 ? out
                                      : (std::filesystem::temp_directory_path() /
                                         fmt::format("rlhf_builtin_{}_{}", ::getpid(), rank))
                                            .string();
    path = io::materialize_builtin_dataset(c.dataset, dir);
    if (rank == 0) LOG0_INFO("data: {} written to {}", c.dataset, path);
  }
  io::SftDataset data = io::build_sft_dataset(path, tokenizer, c.data);
  if (rank != 0 && path != c.dataset)
    std::filesystem::remove_all(std::filesystem::path(path).parent_path());
  return data;
}

}  // namespace

int run_sft(const SftConfig& c) {
  parallel::TrainRuntime rt = parallel::setup_train_runtime(c.runtime, /*needs_generation=*/false);
  parallel::Comm& comm = *rt.train_comm;
  const int rank = comm.rank(), world = comm.size();

  // --- model and tokenizer
  const io::ModelSource src =
      io::resolve_model_source(c.model_config, c.pretrain, c.tokenizer, model::HeadKind::kLM);
  const model::ModelConfig& cfg = src.config;
  const std::shared_ptr<const io::Tokenizer> tokenizer = io::model_tokenizer(src);
  const model::ParamLayout layout(cfg, model::HeadKind::kLM);
  const std::unique_ptr<parallel::TrainModel> net = parallel::make_train_model(layout, rt, c.zero);
  initialize_weights(net->store(), src, static_cast<uint64_t>(c.train.seed));

  // --- data and batches
  RLHF_CHECK(c.data.max_len <= cfg.max_position_embeddings,
             "--max_len {} exceeds the model's max_position_embeddings {}", c.data.max_len,
             cfg.max_position_embeddings);
  const io::SftDataset data = load_sft_data(c, *tokenizer, rank);
  const BatchPlan plan =
      plan_batches(c.train, int64_t(data.samples.size()), world, c.dataset, "samples");

  LOG0_INFO("model: {} | {} parameters | {} layers, hidden {}, heads {}/{} | {}", cfg.model_type,
            layout.num_parameters(), cfg.num_hidden_layers, cfg.hidden_size,
            cfg.num_attention_heads, cfg.num_key_value_heads, src.describe());
  LOG0_INFO("tokenizer: {}", tokenizer->name());
  if (auto* ls = dynamic_cast<parallel::LoraStore*>(&net->store()))
    LOG0_INFO("{} (base frozen; the saved model is the merged W + (alpha/r)·B·A)",
              ls->lora_layout().describe());
  LOG0_INFO("data: {} ({}) | {}", c.dataset, data.format, data.stats.summary());
  LOG0_INFO(
      "training: {} steps ({} per epoch x {} epochs) | batch {} = {} rank(s) x {} micro x {} "
      "accumulation | {} threads per rank",
      plan.total_steps, plan.steps_per_epoch, c.train.max_epochs, plan.train_batch_size, world,
      plan.micro_batch_size, plan.accumulation, rt.threads);

  SftTask task(*net, data, *tokenizer, cfg, c.data.max_len, c.zero.packing_samples);
  const SupervisedResult res = train_supervised(c.train, plan, task, *net, comm);
  if (res.signal != 0) return parallel::kExitPreempted;
  LOG0_INFO("done: {} steps in {:.1f}s | final model {}", res.steps, res.seconds, res.model_path);
  return 0;
}

}  // namespace rlhf::rl
