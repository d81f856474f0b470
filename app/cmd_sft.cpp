// `rlhf sft`: supervised fine-tuning / pre-training with next-token cross-entropy.
//
// Batch arithmetic (OpenRLHF's): each optimizer step takes --train_batch_size samples (global),
// each rank --micro_train_batch_size per forward/backward, gradient accumulation fills the rest.
// The loss is the mean over every loss token of the whole optimizer step (ALGORITHMS.md "agg"),
// so the gradient does not depend on how the batch is split across micro-batches or ranks.
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <numeric>
#include <random>

#include <nlohmann/json.hpp>

#include "app/commands.h"
#include "app/runtime.h"
#include "core/error.h"
#include "core/log.h"
#include "io/builtin_tasks.h"
#include "io/metrics.h"
#include "io/sft_dataset.h"
#include "io/tokenizer.h"
#include "model/flops.h"
#include "model/transformer.h"
#include "optim/schedule.h"
#include "parallel/failure_injection.h"
#include "parallel/param_store.h"
#include "rl/epoch_order.h"
#include "rl/weights.h"

namespace rlhf::app {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double allreduce_sum(parallel::Comm& comm, double x) {
  double y = 0;
  comm.all_reduce(&x, &y, 1);
  return y;
}

}  // namespace

int run_sft(const SftArgs& args) {
  parallel::TrainRuntime rt =
      parallel::setup_train_runtime(runtime_options(args.parallel, 1), /*needs_generation=*/false);
  parallel::Comm& comm = *rt.train_comm;
  const int rank = comm.rank(), world = comm.size();
  const int threads = rt.threads;

  // --- model and tokenizer
  const io::ModelSource src = model_source(args.model, model::HeadKind::kLM);
  const model::ModelConfig& cfg = src.config;
  const std::shared_ptr<const io::Tokenizer> tokenizer = io::model_tokenizer(src);
  model::ParamLayout layout(cfg, model::HeadKind::kLM);
  const std::unique_ptr<parallel::TrainModel> net =
      parallel::make_train_model(layout, rt, zero_options(args.zero));
  parallel::ParamStore& store = net->store();
  rl::initialize_weights(store, src, static_cast<uint64_t>(args.common.seed));

  // --- data
  io::SftDatasetOptions dopt;
  dopt.input_key = args.input_key;
  dopt.output_key = args.output_key;
  dopt.max_len = args.data.max_len;
  dopt.overlong = io::overlong_policy_from_string(args.data.truncation);
  dopt.max_samples = args.data.max_samples;
  RLHF_CHECK(args.data.max_len <= cfg.max_position_embeddings,
             "--max_len {} exceeds the model's max_position_embeddings {}", args.data.max_len,
             cfg.max_position_embeddings);
  // A builtin task (builtin:addition) is written to <save_path> first, then read like a file.
  std::string dataset_path = args.data.dataset;
  if (io::is_builtin_dataset(dataset_path)) {
    const std::string out = (std::filesystem::path(args.ckpt.save_path) / "data").string();
    // Rank 0 keeps the file for the user; the others read a private copy (no shared file system
    // is assumed) that is removed once loaded.
    const std::string dir = rank == 0 ? out
                                      : (std::filesystem::temp_directory_path() /
                                         fmt::format("rlhf_builtin_{}_{}", ::getpid(), rank))
                                            .string();
    dataset_path = io::materialize_builtin_dataset(args.data.dataset, dir);
    if (rank == 0) LOG0_INFO("data: {} written to {}", args.data.dataset, dataset_path);
  }
  const io::SftDataset data = io::build_sft_dataset(dataset_path, *tokenizer, dopt);
  if (rank != 0 && dataset_path != args.data.dataset)
    std::filesystem::remove_all(std::filesystem::path(dataset_path).parent_path());
  const int64_t n_samples = static_cast<int64_t>(data.samples.size());

  // --- batch arithmetic
  const int64_t TB = args.loop.train_batch_size, MB = args.loop.micro_train_batch_size;
  RLHF_CHECK(TB % (MB * world) == 0,
             "--train_batch_size {} must be a multiple of --micro_train_batch_size {} x {} rank(s)",
             TB, MB, world);
  const int64_t accum = TB / (MB * world);
  const int64_t steps_per_epoch = n_samples / TB;
  RLHF_CHECK(steps_per_epoch >= 1,
             "{}: {} usable samples, fewer than one --train_batch_size ({})\nhint: lower "
             "--train_batch_size or add data",
             args.data.dataset, n_samples, TB);
  int64_t total_steps = steps_per_epoch * args.loop.max_epochs;
  if (args.loop.max_steps > 0) total_steps = std::min(total_steps, args.loop.max_steps);
  const optim::LrSchedule sched = optim::LrSchedule::openrlhf(
      args.optim.lr_scheduler, args.optim.learning_rate, total_steps, args.optim.lr_warmup_ratio);
  const optim::AdamWConfig adam = make_adamw(args.optim, args.optim.learning_rate);

  LOG0_INFO("model: {} | {} parameters | {} layers, hidden {}, heads {}/{} | {}", cfg.model_type,
            layout.num_parameters(), cfg.num_hidden_layers, cfg.hidden_size,
            cfg.num_attention_heads, cfg.num_key_value_heads, src.describe());
  LOG0_INFO("tokenizer: {}", tokenizer->name());
  LOG0_INFO("data: {} ({}) | {}", args.data.dataset, data.format, data.stats.summary());
  LOG0_INFO(
      "training: {} steps ({} per epoch x {} epochs) | batch {} = {} rank(s) x {} micro x {} "
      "accumulation | {} threads per rank",
      total_steps, steps_per_epoch, args.loop.max_epochs, TB, world, MB, accum, threads);

  std::unique_ptr<io::MetricsWriter> metrics;
  if (rank == 0) metrics = std::make_unique<io::MetricsWriter>(args.ckpt.save_path, true);

  // --- loop
  const auto t_start = Clock::now();
  rl::EpochOrder order(n_samples, static_cast<uint64_t>(args.common.seed));
  std::vector<float> lp, dlp;
  int64_t epoch = 0;
  for (int64_t step = 0; step < total_steps; ++step) {
    const auto t_step = Clock::now();
    parallel::maybe_inject_failure("sft_step", rank);
    const parallel::CommStats comm_before = comm.stats();
    epoch = step / steps_per_epoch;
    // This rank's slice of the global batch, then its micro-batches.
    const int64_t base = epoch * n_samples + (step % steps_per_epoch) * TB + rank * (TB / world);
    double local_loss_tokens = 0;
    for (int64_t i = 0; i < TB / world; ++i)
      local_loss_tokens += double(io::sft_loss_tokens(data.samples[size_t(order.at(base + i))]));
    const double n_loss_tokens = allreduce_sum(comm, local_loss_tokens);
    RLHF_CHECK(n_loss_tokens > 0, "step {}: the batch has no loss tokens", step + 1);

    store.zero_grads();
    double loss_sum = 0, real_tokens = 0;
    for (int64_t a = 0; a < accum; ++a) {
      std::vector<int64_t> idx;
      for (int64_t i = 0; i < MB; ++i) idx.push_back(order.at(base + a * MB + i));
      const io::TokenBatch batch = io::collate_sft(data.samples, idx, tokenizer->pad_id());
      const int64_t N = batch.B * batch.T;
      lp.resize(size_t(N));
      dlp.resize(size_t(N));
      net->forward_lm(batch.tokens.data(), batch.targets.data(), batch.B, batch.T, lp.data(),
                      nullptr, true);
      for (int64_t n = 0; n < N; ++n) {
        const bool on = batch.targets[size_t(n)] >= 0;
        loss_sum -= on ? double(lp[size_t(n)]) : 0.0;
        dlp[size_t(n)] = on ? static_cast<float>(-1.0 / n_loss_tokens) : 0.0f;
      }
      net->backward_lm(dlp.data(), nullptr);
      real_tokens += double(batch.real_tokens);
    }
    const double loss = allreduce_sum(comm, loss_sum) / n_loss_tokens;
    RLHF_CHECK(std::isfinite(loss),
               "loss is not finite ({}) at step {}\nhint: lower --learning_rate", loss, step + 1);
    const double lr = sched.lr_at(step);
    const double grad_norm =
        parallel::clip_and_step(store, adam, lr, step + 1, args.optim.max_norm);
    const double step_s = seconds_since(t_step);
    const double comm_s = comm.stats().seconds - comm_before.seconds;
    const double comm_gb = double(comm.stats().bytes - comm_before.bytes) / 1e9;
    if (step == 0) parallel::log_memory(store, net->activation_bytes(), comm);
    const double tokens = allreduce_sum(comm, real_tokens);
    const double tok_s = tokens / step_s;
    const double gflops =
        tokens * model::training_flops_per_token(cfg, args.data.max_len) / step_s / 1e9;
    if ((step + 1) % args.ckpt.logging_steps == 0 || step + 1 == total_steps) {
      const double elapsed = seconds_since(t_start);
      const double eta = elapsed / double(step + 1) * double(total_steps - step - 1);
      LOG0_INFO(
          "step {}/{} ({:.1f}%) | loss {:.4f} | lr {:.3e} | grad_norm {:.3f} | {:.0f} tok/s | "
          "{:.1f} GFLOP/s | {:.2f}s/step (comm {:.2f}s) | elapsed {:.1f}s | eta {:.0f}s",
          step + 1, total_steps, 100.0 * double(step + 1) / double(total_steps), loss, lr,
          grad_norm, tok_s, gflops, step_s, comm_s, elapsed, eta);
      if (metrics)
        metrics->write(nlohmann::json{{"step", step + 1},
                                      {"epoch", epoch},
                                      {"loss", loss},
                                      {"lr", lr},
                                      {"grad_norm", grad_norm},
                                      {"tokens", tokens},
                                      {"loss_tokens", n_loss_tokens},
                                      {"tokens_per_s", tok_s},
                                      {"gflops_per_s", gflops},
                                      {"step_time_s", step_s},
                                      {"comm_time_s", comm_s},
                                      {"comm_gb", comm_gb},
                                      {"elapsed_s", elapsed}});
    }
    if (args.ckpt.save_steps > 0 && (step + 1) % args.ckpt.save_steps == 0 &&
        step + 1 < total_steps) {
      const std::string path =
          (std::filesystem::path(args.ckpt.save_path) / fmt::format("model_step{}.h5", step + 1))
              .string();
      rl::save_model(store, path, rank, tokenizer.get());
      LOG0_INFO("saved {}", path);
    }
  }
  const std::string path = (std::filesystem::path(args.ckpt.save_path) / "model.h5").string();
  rl::save_model(store, path, rank, tokenizer.get());
  LOG0_INFO("done: {} steps in {:.1f}s | final model {}", total_steps, seconds_since(t_start),
            path);
  return 0;
}

}  // namespace rlhf::app
