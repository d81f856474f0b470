#include "rl/supervised.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <memory>
#include <vector>

#include "core/error.h"
#include "core/log.h"
#include "core/memory.h"
#include "io/metrics.h"
#include "optim/schedule.h"
#include "parallel/failure_injection.h"
#include "parallel/preemption.h"
#include "parallel/watchdog.h"
#include "rl/checkpoint.h"
#include "rl/epoch_order.h"
#include "rl/optimizer.h"
#include "rl/weights.h"

namespace rlhf::rl {

namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// The step line and, on rank 0, the metrics.jsonl record of a finished step.
void report_step(const StepReport& r, const SupervisedTask& task, io::MetricsWriter* metrics) {
  LOG0_INFO("{} | peak RSS {}", task.step_line(r), format_bytes(double(r.peak_rss_bytes)));
  if (!metrics) return;
  nlohmann::json rec{{"step", r.step},           {"epoch", r.epoch},
                     {"loss", r.loss},           {"lr", r.lr},
                     {"grad_norm", r.grad_norm}, {"step_time_s", r.step_s},
                     {"elapsed_s", r.elapsed_s}, {"peak_rss_bytes", r.peak_rss_bytes}};
  task.add_metrics(r, rec);
  metrics->write(rec);
}

// The settings a checkpoint records and a resumed run compares (changed_settings).
nlohmann::json supervised_settings(const SupervisedOptions& o, const BatchPlan& plan) {
  return {{"train_batch_size", o.train_batch_size},
          {"micro_train_batch_size", o.micro_train_batch_size},
          {"max_epochs", o.max_epochs},
          {"total_steps", plan.total_steps},
          {"samples", plan.n_samples},
          {"learning_rate", o.adam.lr},
          {"lr_scheduler", o.lr_scheduler}};
}

// --load_checkpoint: the newest valid checkpoint of o.ckpt_path into the store and the optimizer's
// step count; returns the step to continue from (0 when there is none). Collective over the
// store's communicator.
int64_t resume(const SupervisedOptions& o, const std::vector<CheckpointSlot>& slots,
               const nlohmann::json& settings, Optimizer& opt) {
  const std::string path = latest_valid_checkpoint(o.ckpt_path);
  if (path.empty()) {
    LOG0_WARN("--load_checkpoint: no checkpoint in {}; starting from step 0", o.ckpt_path);
    return 0;
  }
  const nlohmann::json st = load_train_checkpoint(path, slots);
  RLHF_CHECK(st.value("seed", int64_t(-1)) == o.seed,
             "{} was made with --seed {}, this run has --seed {}", path,
             st.value("seed", int64_t(-1)), o.seed);
  const int64_t step = st.at("step").get<int64_t>();
  warn_changed_settings(path, st, settings);
  opt.set_steps(step);
  LOG0_INFO("resumed from {} at step {}", path, step);
  return step;
}

}  // namespace

BatchPlan plan_batches(const SupervisedOptions& o, int64_t n_samples, int world,
                       const std::string& dataset, const char* unit) {
  BatchPlan p;
  p.n_samples = n_samples;
  p.train_batch_size = o.train_batch_size;
  p.micro_batch_size = o.micro_train_batch_size;
  p.world = world;
  const int64_t TB = p.train_batch_size, MB = p.micro_batch_size;
  RLHF_CHECK(TB > 0 && MB > 0 && TB % (MB * world) == 0,
             "--train_batch_size {} must be a multiple of --micro_train_batch_size {} x {} rank(s)",
             TB, MB, world);
  p.accumulation = TB / (MB * world);
  p.steps_per_epoch = n_samples / TB;
  RLHF_CHECK(p.steps_per_epoch >= 1,
             "{}: {} usable {}, fewer than one --train_batch_size ({})\nhint: lower "
             "--train_batch_size or add data",
             dataset, n_samples, unit, TB);
  p.total_steps = p.steps_per_epoch * o.max_epochs;
  if (o.max_steps > 0) p.total_steps = std::min(p.total_steps, o.max_steps);
  return p;
}

SupervisedResult train_supervised(const SupervisedOptions& o, const BatchPlan& plan,
                                  SupervisedTask& task, parallel::TrainModel& net,
                                  parallel::Comm& comm) {
  parallel::install_preemption_handlers();
  const int rank = comm.rank();
  const std::string point = o.name + "_step";
  const std::filesystem::path dir(o.save_path);
  Optimizer opt(
      net.store(), o.adam,
      optim::LrSchedule::openrlhf(o.lr_scheduler, o.adam.lr, plan.total_steps, o.lr_warmup_ratio),
      o.max_norm);
  const std::vector<CheckpointSlot> slots = {{"model", &net.store(), true}};
  const nlohmann::json settings = supervised_settings(o, plan);
  const int64_t start_step = o.load_checkpoint ? resume(o, slots, settings, opt) : 0;
  std::unique_ptr<io::MetricsWriter> metrics;
  if (rank == 0) {
    if (start_step > 0) io::trim_records(o.save_path, "metrics.jsonl", start_step);
    metrics = std::make_unique<io::MetricsWriter>(o.save_path, start_step == 0);
  }
  std::unique_ptr<RunTracker> tracker;
  if (metrics && o.tracking.enabled()) {
    tracker = std::make_unique<RunTracker>(o.tracking, o.save_path, o.name, settings);
    metrics->set_mirror([&](const nlohmann::json& r) { tracker->record(r); });
  }

  const auto t_start = Clock::now();
  EpochOrder order(plan.n_samples, static_cast<uint64_t>(o.seed));
  const size_t n_metrics = size_t(task.num_metrics());
  std::vector<int64_t> samples(size_t(plan.per_rank()));
  std::vector<double> sums(n_metrics), global(n_metrics);
  SupervisedResult res;
  for (int64_t step = start_step; step < plan.total_steps; ++step) {
    const auto t_step = Clock::now();
    reset_peak_rss();  // the step's own peak (peak_rss_bytes below)
    parallel::maybe_inject_failure(point.c_str(), rank);
    parallel::maybe_inject_stop(point.c_str(), rank);
    parallel::set_watch_context(fmt::format("{} step {}/{}", o.name, step + 1, plan.total_steps));
    const parallel::CommStats comm_before = comm.stats();
    const int64_t first = plan.first_position(step, rank);
    for (size_t i = 0; i < samples.size(); ++i) samples[i] = order.at(first + int64_t(i));
    task.begin_step(step, samples, comm);

    opt.zero_grad();
    std::fill(sums.begin(), sums.end(), 0.0);
    const std::span<const int64_t> mine(samples);
    for (int64_t a = 0; a < plan.accumulation; ++a)
      task.micro_batch(
          mine.subspan(size_t(a * plan.micro_batch_size), size_t(plan.micro_batch_size)), sums);
    comm.all_reduce(sums.data(), global.data(), int64_t(n_metrics));
    const double loss = task.loss(global);
    RLHF_CHECK(std::isfinite(loss),
               "loss is not finite ({}) at step {}\nhint: lower --learning_rate", loss, step + 1);
    const Optimizer::StepResult sr = opt.step();
    const int64_t rss = peak_rss_bytes();

    StepReport r;
    r.step = sr.step;
    r.total_steps = plan.total_steps;
    r.epoch = plan.epoch_of(step);
    r.loss = loss;
    r.lr = sr.lr;
    r.grad_norm = sr.grad_norm;
    r.step_s = since(t_step);
    r.comm_s = comm.stats().seconds - comm_before.seconds;
    r.comm_gb = double(comm.stats().bytes - comm_before.bytes) / 1e9;
    r.sums = global;
    comm.all_reduce(&rss, &r.peak_rss_bytes, 1, parallel::ReduceOp::kMax);
    if (step == 0) parallel::log_memory(net.store(), net.activation_bytes(), comm);
    if (r.step % o.logging_steps == 0 || r.step == plan.total_steps) {
      r.elapsed_s = since(t_start);
      r.eta_s = r.elapsed_s / double(r.step - start_step) * double(plan.total_steps - r.step);
      report_step(r, task, metrics.get());
    }
    // SIGTERM/SIGUSR1 on any rank: every rank stops after this step, with a checkpoint.
    res.signal = parallel::agree_preemption(comm);
    const bool periodic = o.save_steps > 0 && r.step % o.save_steps == 0;
    if (periodic && r.step < plan.total_steps) {
      const std::string path = (dir / fmt::format("model_step{}.h5", r.step)).string();
      save_model(net.store(), path, rank, task.saved_tokenizer());
      LOG0_INFO("saved {}", path);
    }
    if ((periodic || res.signal != 0) && r.step < plan.total_steps) {
      const std::string path = checkpoint_path(o.ckpt_path, r.step);
      save_train_checkpoint(path, slots,
                            {{"step", r.step}, {"seed", o.seed}, {"settings", settings}}, rank == 0,
                            int(o.max_ckpt_num), task.saved_tokenizer(),
                            sharded_checkpoints(o.ckpt_format, comm.size()) ? &comm : nullptr);
      if (o.save_hf_ckpt)
        save_hf_model(net.store(), hf_checkpoint_dir(path), rank, task.saved_tokenizer());
      LOG0_INFO("checkpoint {}", path);
      if (res.signal != 0) {
        comm.barrier();
        LOG0_WARN(
            "{} received: stopped after step {}/{} with checkpoint {}\nresume with the "
            "same command and --load_checkpoint (exit status {})",
            parallel::signal_name(res.signal), r.step, plan.total_steps, path,
            parallel::kExitPreempted);
        res.steps = r.step;
        res.seconds = since(t_start);
        return res;
      }
    }
  }
  res.signal = 0;  // a signal during the last step: the run is complete
  res.steps = plan.total_steps;
  res.model_path = (dir / "model.h5").string();
  save_model(net.store(), res.model_path, rank, task.saved_tokenizer());
  res.seconds = since(t_start);
  return res;
}

}  // namespace rlhf::rl
