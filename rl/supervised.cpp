#include "rl/supervised.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <memory>
#include <vector>

#include "core/error.h"
#include "core/log.h"
#include "io/metrics.h"
#include "optim/schedule.h"
#include "parallel/failure_injection.h"
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
  LOG0_INFO("{}", task.step_line(r));
  if (!metrics) return;
  nlohmann::json rec{{"step", r.step},           {"epoch", r.epoch},
                     {"loss", r.loss},           {"lr", r.lr},
                     {"grad_norm", r.grad_norm}, {"step_time_s", r.step_s},
                     {"elapsed_s", r.elapsed_s}};
  task.add_metrics(r, rec);
  metrics->write(rec);
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
  const int rank = comm.rank();
  const std::string point = o.name + "_step";
  const std::filesystem::path dir(o.save_path);
  Optimizer opt(
      net.store(), o.adam,
      optim::LrSchedule::openrlhf(o.lr_scheduler, o.adam.lr, plan.total_steps, o.lr_warmup_ratio),
      o.max_norm);
  std::unique_ptr<io::MetricsWriter> metrics;
  if (rank == 0) metrics = std::make_unique<io::MetricsWriter>(o.save_path, true);

  const auto t_start = Clock::now();
  EpochOrder order(plan.n_samples, static_cast<uint64_t>(o.seed));
  const size_t n_metrics = size_t(task.num_metrics());
  std::vector<int64_t> samples(size_t(plan.per_rank()));
  std::vector<double> sums(n_metrics), global(n_metrics);
  for (int64_t step = 0; step < plan.total_steps; ++step) {
    const auto t_step = Clock::now();
    parallel::maybe_inject_failure(point.c_str(), rank);
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
    if (step == 0) parallel::log_memory(net.store(), net.activation_bytes(), comm);
    if (r.step % o.logging_steps == 0 || r.step == plan.total_steps) {
      r.elapsed_s = since(t_start);
      r.eta_s = r.elapsed_s / double(r.step) * double(plan.total_steps - r.step);
      report_step(r, task, metrics.get());
    }
    if (o.save_steps > 0 && r.step % o.save_steps == 0 && r.step < plan.total_steps) {
      const std::string path = (dir / fmt::format("model_step{}.h5", r.step)).string();
      save_model(net.store(), path, rank, task.saved_tokenizer());
      LOG0_INFO("saved {}", path);
    }
  }
  SupervisedResult res;
  res.steps = plan.total_steps;
  res.model_path = (dir / "model.h5").string();
  save_model(net.store(), res.model_path, rank, task.saved_tokenizer());
  res.seconds = since(t_start);
  return res;
}

}  // namespace rlhf::rl
