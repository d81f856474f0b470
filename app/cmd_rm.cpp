// `rlhf rm`: reward-model training on preference pairs with the Bradley–Terry loss
// (Ouyang et al. 2022, eq. 1): loss = −log σ(r_chosen − r_rejected), the reward read at the last
// token (EOS) of each sequence by a scalar head (`score.weight`) on the model's final norm.
#include <nlohmann/json.hpp>

#include <chrono>
#include <cmath>
#include <filesystem>

#include "app/commands.h"
#include "app/runtime.h"
#include "core/error.h"
#include "core/log.h"
#include "io/metrics.h"
#include "io/preference_dataset.h"
#include "io/tokenizer.h"
#include "model/transformer.h"
#include "optim/schedule.h"
#include "parallel/failure_injection.h"
#include "rl/epoch_order.h"
#include "rl/losses.h"
#include "rl/weights.h"

namespace rlhf::app {

namespace {
using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}
}  // namespace

int run_rm(const RmArgs& args) {
  parallel::TrainRuntime rt =
      parallel::setup_train_runtime(runtime_options(args.parallel, 1), /*needs_generation=*/false);
  parallel::Comm& comm = *rt.train_comm;
  const int rank = comm.rank(), world = comm.size();

  const io::ModelSource src = model_source(args.model, model::HeadKind::kReward);
  const model::ModelConfig& cfg = src.config;
  auto tokenizer = io::make_tokenizer("byte");
  RLHF_CHECK(tokenizer->vocab_size() <= cfg.vocab_size,
             "the tokenizer has {} tokens but the model's vocab_size is {}",
             tokenizer->vocab_size(), cfg.vocab_size);
  RLHF_CHECK(args.max_len <= cfg.max_position_embeddings,
             "--max_len {} exceeds the model's max_position_embeddings {}", args.max_len,
             cfg.max_position_embeddings);
  model::ParamLayout layout(cfg, model::HeadKind::kReward);
  const std::unique_ptr<parallel::TrainModel> net =
      parallel::make_train_model(layout, rt, zero_options(args.zero));
  parallel::ParamStore* store = &net->store();
  rl::initialize_weights(*store, src, static_cast<uint64_t>(args.common.seed));

  io::PreferenceDatasetOptions dopt;
  dopt.chosen_key = args.chosen_key;
  dopt.rejected_key = args.rejected_key;
  dopt.prompt_key = args.prompt_key;
  dopt.max_len = args.max_len;
  dopt.max_samples = args.max_samples;
  const io::PreferenceDataset data = io::build_preference_dataset(args.dataset, *tokenizer, dopt);
  const int64_t n_pairs = static_cast<int64_t>(data.pairs.size());

  const int64_t TB = args.loop.train_batch_size, MB = args.loop.micro_train_batch_size;
  RLHF_CHECK(TB % (MB * world) == 0,
             "--train_batch_size {} must be a multiple of --micro_train_batch_size {} x {} rank(s)",
             TB, MB, world);
  const int64_t steps_per_epoch = n_pairs / TB;
  RLHF_CHECK(steps_per_epoch >= 1, "{}: {} usable pairs, fewer than one --train_batch_size ({})",
             args.dataset, n_pairs, TB);
  int64_t total_steps = steps_per_epoch * args.loop.max_epochs;
  if (args.loop.max_steps > 0) total_steps = std::min(total_steps, args.loop.max_steps);
  const auto sched = optim::LrSchedule::openrlhf(args.optim.lr_scheduler, args.optim.learning_rate,
                                                 total_steps, args.optim.lr_warmup_ratio);
  const optim::AdamWConfig adam = make_adamw(args.optim, args.optim.learning_rate);
  LOG0_INFO("reward model: {} parameters, {} | data: {} | {} steps", layout.num_parameters(),
            src.describe(), data.stats.summary(), total_steps);

  std::unique_ptr<io::MetricsWriter> metrics;
  if (rank == 0) metrics = std::make_unique<io::MetricsWriter>(args.ckpt.save_path, true);
  rl::EpochOrder order(n_pairs, static_cast<uint64_t>(args.common.seed));
  const auto t_start = Clock::now();
  std::vector<int32_t> tokens;
  std::vector<float> values, dvalues;
  for (int64_t step = 0; step < total_steps; ++step) {
    const auto t_step = Clock::now();
    parallel::maybe_inject_failure("rm_step", rank);
    const int64_t epoch = step / steps_per_epoch;
    const int64_t base = epoch * n_pairs + (step % steps_per_epoch) * TB + rank * (TB / world);
    store->zero_grads();
    double loss_sum = 0, correct = 0, margin_sum = 0;
    for (int64_t a = 0; a < TB / world; a += MB) {
      // 2·MB sequences: chosen of pair i at row i, rejected at row MB + i; right-padded.
      std::vector<const std::vector<int32_t>*> seqs;
      for (int64_t i = 0; i < MB; ++i)
        seqs.push_back(&data.pairs[size_t(order.at(base + a + i))].chosen);
      for (int64_t i = 0; i < MB; ++i)
        seqs.push_back(&data.pairs[size_t(order.at(base + a + i))].rejected);
      int64_t T = 0;
      for (auto* s : seqs) T = std::max<int64_t>(T, int64_t(s->size()));
      const int64_t B = 2 * MB;
      tokens.assign(size_t(B * T), tokenizer->pad_id());
      for (int64_t r = 0; r < B; ++r)
        std::copy(seqs[size_t(r)]->begin(), seqs[size_t(r)]->end(), tokens.begin() + r * T);
      values.resize(size_t(B * T));
      dvalues.assign(size_t(B * T), 0.0f);
      net->forward_scalar(tokens.data(), B, T, values.data(), true);
      for (int64_t i = 0; i < MB; ++i) {
        const int64_t lc = i * T + int64_t(seqs[size_t(i)]->size()) - 1;
        const int64_t lr = (MB + i) * T + int64_t(seqs[size_t(MB + i)]->size()) - 1;
        const double delta = double(values[size_t(lc)]) - double(values[size_t(lr)]);
        double dl = 0;
        loss_sum += rl::bradley_terry_loss(delta, &dl);
        const double g = dl / double(TB);
        dvalues[size_t(lc)] = float(g);
        dvalues[size_t(lr)] = float(-g);
        correct += delta > 0;
        margin_sum += delta;
      }
      net->backward_scalar(dvalues.data());
    }
    double sums[3] = {loss_sum, correct, margin_sum}, total[3];
    comm.all_reduce(sums, total, 3);
    const double loss = total[0] / double(TB), acc = total[1] / double(TB);
    RLHF_CHECK(std::isfinite(loss),
               "loss is not finite ({}) at step {}\nhint: lower --learning_rate", loss, step + 1);
    const double lr = sched.lr_at(step);
    const double grad_norm =
        parallel::clip_and_step(*store, adam, lr, step + 1, args.optim.max_norm);
    if ((step + 1) % args.ckpt.logging_steps == 0 || step + 1 == total_steps) {
      LOG0_INFO(
          "step {}/{} ({:.1f}%) | loss {:.4f} | acc {:.3f} | margin {:.3f} | lr {:.3e} | "
          "grad_norm {:.3f} | {:.2f}s/step",
          step + 1, total_steps, 100.0 * double(step + 1) / double(total_steps), loss, acc,
          total[2] / double(TB), lr, grad_norm, since(t_step));
      if (metrics)
        metrics->write(nlohmann::json{{"step", step + 1},
                                      {"epoch", epoch},
                                      {"loss", loss},
                                      {"acc", acc},
                                      {"reward_margin", total[2] / double(TB)},
                                      {"lr", lr},
                                      {"grad_norm", grad_norm},
                                      {"step_time_s", since(t_step)},
                                      {"elapsed_s", since(t_start)}});
    }
  }
  const std::string path = (std::filesystem::path(args.ckpt.save_path) / "model.h5").string();
  rl::save_model(*store, path, rank);
  LOG0_INFO("done: {} steps in {:.1f}s | reward model {}", total_steps, since(t_start), path);
  return 0;
}

}  // namespace rlhf::app
