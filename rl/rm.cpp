#include "rl/rm.h"

#include <algorithm>
#include <memory>
#include <vector>

#include "core/error.h"
#include "core/log.h"
#include "io/model_source.h"
#include "io/tokenizer.h"
#include "parallel/lora_store.h"
#include "parallel/preemption.h"
#include "rl/losses.h"
#include "rl/packing.h"
#include "rl/weights.h"

namespace rlhf::rl {

namespace {

// Bradley–Terry on (chosen, rejected) pairs. Metric sums: [0] Σ loss, [1] pairs ranked right
// (Δ > 0), [2] Σ Δ; each divided by TB for the step's loss, acc and reward_margin.
class RmTask final : public SupervisedTask {
 public:
  RmTask(parallel::TrainModel& net, const io::PreferenceDataset& data,
         const io::Tokenizer& tokenizer, int64_t train_batch_size, bool packing)
      : net_(net),
        data_(data),
        tokenizer_(tokenizer),
        pad_id_(tokenizer.pad_id()),
        TB_(train_batch_size),
        packing_(packing) {}

  const io::Tokenizer* saved_tokenizer() const override { return &tokenizer_; }

  int num_metrics() const override { return 3; }

  // 2·MB sequences, right-padded to the longest: chosen of pair i at row i, rejected at row
  // MB + i (with packing: the 2·MB sequences end to end in one row, in that order). The reward of
  // a sequence is the head's value at its last token; dloss/dr_chosen = dloss/dΔ / TB,
  // dloss/dr_rejected = −dloss/dΔ / TB, 0 at every other token.
  void micro_batch(std::span<const int64_t> samples, std::span<double> sums) override {
    const int64_t MB = int64_t(samples.size()), B = 2 * MB;
    std::vector<const std::vector<int32_t>*> seqs;
    for (const int64_t s : samples) seqs.push_back(&data_.pairs[size_t(s)].chosen);
    for (const int64_t s : samples) seqs.push_back(&data_.pairs[size_t(s)].rejected);
    int64_t T = 0;
    std::vector<int64_t> len, start;
    for (auto* s : seqs) {
      len.push_back(int64_t(s->size()));
      T = std::max<int64_t>(T, len.back());
    }
    tokens_.assign(size_t(B * T), pad_id_);
    for (int64_t r = 0; r < B; ++r) {
      std::copy(seqs[size_t(r)]->begin(), seqs[size_t(r)]->end(), tokens_.begin() + r * T);
      start.push_back(r * T);
    }
    int64_t rows = B;
    model::SeqLens packed_seqs;
    PackedRows packed;
    if (packing_) {
      packed = pack_rows(tokens_.data(), nullptr, B, T, len);
      tokens_ = packed.tokens;
      start = packed.start;
      rows = 1;
      T = packed.T;
      packed_seqs = packed.seqs();
    }
    values_.resize(size_t(rows * T));
    dvalues_.assign(size_t(rows * T), 0.0f);
    net_.forward_scalar(tokens_.data(), rows, T, values_.data(), true, packed_seqs);
    for (int64_t i = 0; i < MB; ++i) {
      const int64_t lc = start[size_t(i)] + len[size_t(i)] - 1;
      const int64_t lr = start[size_t(MB + i)] + len[size_t(MB + i)] - 1;
      const double delta = double(values_[size_t(lc)]) - double(values_[size_t(lr)]);
      double dl = 0;
      sums[0] += bradley_terry_loss(delta, &dl);
      const double g = dl / double(TB_);
      dvalues_[size_t(lc)] = float(g);
      dvalues_[size_t(lr)] = float(-g);
      sums[1] += delta > 0;
      sums[2] += delta;
    }
    net_.backward_scalar(dvalues_.data());
  }

  double loss(std::span<const double> sums) const override { return sums[0] / double(TB_); }

  std::string step_line(const StepReport& r) const override {
    return fmt::format(
        "step {}/{} ({:.1f}%) | loss {:.4f} | acc {:.3f} | margin {:.3f} | lr {:.3e} | "
        "grad_norm {:.3f} | {:.2f}s/step (comm {:.2f}s) | elapsed {:.1f}s | eta {:.0f}s",
        r.step, r.total_steps, 100.0 * double(r.step) / double(r.total_steps), r.loss,
        r.sums[1] / double(TB_), r.sums[2] / double(TB_), r.lr, r.grad_norm, r.step_s, r.comm_s,
        r.elapsed_s, r.eta_s);
  }

  void add_metrics(const StepReport& r, nlohmann::json& rec) const override {
    rec["acc"] = r.sums[1] / double(TB_);
    rec["reward_margin"] = r.sums[2] / double(TB_);
  }

 private:
  parallel::TrainModel& net_;
  const io::PreferenceDataset& data_;
  const io::Tokenizer& tokenizer_;
  int32_t pad_id_;
  int64_t TB_;
  bool packing_;
  std::vector<int32_t> tokens_;
  std::vector<float> values_, dvalues_;
};

}  // namespace

int run_rm(const RmConfig& c) {
  parallel::TrainRuntime rt = parallel::setup_train_runtime(c.runtime, /*needs_generation=*/false);
  parallel::Comm& comm = *rt.train_comm;
  const int world = comm.size();

  const io::ModelSource src =
      io::resolve_model_source(c.model_config, c.pretrain, c.tokenizer, model::HeadKind::kReward);
  const model::ModelConfig& cfg = src.config;
  const std::shared_ptr<const io::Tokenizer> tokenizer = io::model_tokenizer(src);
  RLHF_CHECK(tokenizer->vocab_size() <= cfg.vocab_size,
             "the tokenizer has {} tokens but the model's vocab_size is {}",
             tokenizer->vocab_size(), cfg.vocab_size);
  RLHF_CHECK(c.data.max_len <= cfg.max_position_embeddings,
             "--max_len {} exceeds the model's max_position_embeddings {}", c.data.max_len,
             cfg.max_position_embeddings);
  const model::ParamLayout layout(cfg, model::HeadKind::kReward);
  const std::unique_ptr<parallel::TrainModel> net = parallel::make_train_model(layout, rt, c.zero);
  initialize_weights(net->store(), src, static_cast<uint64_t>(c.train.seed));

  const io::PreferenceDataset data = io::build_preference_dataset(c.dataset, *tokenizer, c.data);
  const BatchPlan plan =
      plan_batches(c.train, int64_t(data.pairs.size()), world, c.dataset, "pairs");
  LOG0_INFO("reward model: {} parameters, {} | data: {} | {} steps", layout.num_parameters(),
            src.describe(), data.stats.summary(), plan.total_steps);
  if (auto* ls = dynamic_cast<parallel::LoraStore*>(&net->store()))
    LOG0_INFO(
        "{} (base frozen; the saved model is the merged W + (alpha/r)·B·A and the score head)",
        ls->lora_layout().describe());

  RmTask task(*net, data, *tokenizer, plan.train_batch_size, c.zero.packing_samples);
  const SupervisedResult res = train_supervised(c.train, plan, task, *net, comm);
  if (res.signal != 0) return parallel::kExitPreempted;
  LOG0_INFO("done: {} steps in {:.1f}s | reward model {}", res.steps, res.seconds, res.model_path);
  return 0;
}

}  // namespace rlhf::rl
