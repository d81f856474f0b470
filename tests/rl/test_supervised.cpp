// The trainer skeleton of `rlhf sft` and `rlhf rm` (rl/supervised.h): the batch arithmetic and its
// errors, the samples each rank takes, and the loop driven by a recording task on one rank — the
// pre-pass before the micro-batches, the micro-batch split, the epoch order, the optimizer's step
// numbering and schedule, the metrics records, the periodic and final saves, the finite-loss check
// and the failure-injection hook. (N ranks == 1 rank for the real tasks: tests/e2e/sft_mpi.sh and
// rm.sh.)
#include "rl/supervised.h"

#include <mpi.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <set>

#include "core/error.h"
#include "model/layout.h"
#include "optim/schedule.h"
#include "parallel/param_store.h"
#include "rl/epoch_order.h"
#include "tests/test_util.h"

using namespace rlhf;

namespace {

rl::SupervisedOptions options(int64_t TB, int64_t MB) {
  rl::SupervisedOptions o;
  o.train_batch_size = TB;
  o.micro_train_batch_size = MB;
  return o;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// Records what the skeleton asks of it; leaves the gradients at zero. Metric sums: [0] samples
// seen (loss = sums[0] / TB = 1, or `bad_loss` at step `bad_step`), [1] Σ sample index.
class RecordingTask final : public rl::SupervisedTask {
 public:
  explicit RecordingTask(int64_t TB) : TB_(TB) {}
  int num_metrics() const override { return 2; }
  void begin_step(int64_t step, std::span<const int64_t> samples, parallel::Comm&) override {
    CHECK(step == int64_t(steps.size()));
    steps.emplace_back(samples.begin(), samples.end());
    micro.emplace_back();
  }
  void micro_batch(std::span<const int64_t> samples, std::span<double> sums) override {
    micro.back().push_back(std::vector<int64_t>(samples.begin(), samples.end()));
    for (const int64_t s : samples) {
      sums[0] += 1;
      sums[1] += double(s);
    }
  }
  double loss(std::span<const double> sums) const override {
    return int64_t(steps.size()) == bad_step ? bad_loss : sums[0] / double(TB_);
  }
  std::string step_line(const rl::StepReport& r) const override {
    return fmt::format("step {}/{} | loss {:.4f}", r.step, r.total_steps, r.loss);
  }
  void add_metrics(const rl::StepReport& r, nlohmann::json& rec) const override {
    rec["index_sum"] = r.sums[1];
  }

  std::vector<std::vector<int64_t>> steps;               // begin_step's samples per step
  std::vector<std::vector<std::vector<int64_t>>> micro;  // micro-batches per step
  int64_t bad_step = -1;                                 // 1-based step with bad_loss
  double bad_loss = std::numeric_limits<double>::quiet_NaN();

 private:
  int64_t TB_;
};

model::ModelConfig tiny_config() {
  model::ModelConfig c;
  c.hidden_size = 16;
  c.intermediate_size = 24;
  c.num_hidden_layers = 1;
  c.num_attention_heads = 2;
  c.num_key_value_heads = 1;
  c.vocab_size = 11;
  c.max_position_embeddings = 8;
  return c;
}

std::vector<nlohmann::json> read_metrics(const std::filesystem::path& dir) {
  std::vector<nlohmann::json> out;
  std::ifstream in(dir / "metrics.jsonl");
  for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line));
  return out;
}

}  // namespace

TEST_CASE("supervised: batch arithmetic (OpenRLHF: TB global, MB per rank, accumulation)") {
  rl::SupervisedOptions o = options(16, 2);
  o.max_epochs = 3;
  rl::BatchPlan p = rl::plan_batches(o, 70, 4, "d.jsonl", "samples");
  CHECK(p.accumulation == 2);  // 16 / (2 x 4)
  CHECK(p.per_rank() == 4);
  CHECK(p.steps_per_epoch == 4);  // floor(70 / 16): the tail of 6 is dropped
  CHECK(p.total_steps == 12);
  o.max_steps = 5;
  CHECK(rl::plan_batches(o, 70, 4, "d.jsonl", "samples").total_steps == 5);
  o.max_steps = 100;  // max_steps caps, never extends
  CHECK(rl::plan_batches(o, 70, 4, "d.jsonl", "samples").total_steps == 12);

  const std::string split = error_of([&] { rl::plan_batches(options(6, 4), 70, 1, "d", "x"); });
  CHECK(split.find("--train_batch_size 6 must be a multiple of --micro_train_batch_size 4 x 1 "
                   "rank(s)") != std::string::npos);
  CHECK(!error_of([&] { rl::plan_batches(options(16, 4), 70, 3, "d", "x"); }).empty());
  const std::string few =
      error_of([&] { rl::plan_batches(options(16, 2), 15, 2, "p.jsonl", "pairs"); });
  CHECK(few.find("p.jsonl: 15 usable pairs, fewer than one --train_batch_size (16)") !=
        std::string::npos);
}

TEST_CASE("supervised: the ranks' samples of a step tile its global batch, for any rank count") {
  for (const int world : {1, 2, 4, 8}) {
    rl::SupervisedOptions o = options(16, 2);
    o.max_epochs = 2;
    const rl::BatchPlan p = rl::plan_batches(o, 37, world, "d", "samples");
    for (int64_t step = 0; step < p.total_steps; ++step) {
      const int64_t epoch = step / 2, begin = epoch * 37 + (step % 2) * 16;
      CHECK(p.epoch_of(step) == epoch);
      for (int r = 0; r < world; ++r) CHECK(p.first_position(step, r) == begin + r * (16 / world));
    }
  }
}

TEST_CASE(
    "supervised: the loop on one rank (pre-pass, micro-batches, order, steps, records, saves)") {
  test::init_mpi();
  auto comm = parallel::make_comm(MPI_COMM_SELF, "train_comm");
  const model::ParamLayout layout(tiny_config(), model::HeadKind::kLM);
  auto net = parallel::make_cpu_train_model(
      parallel::make_param_store(layout, *comm, parallel::ZeroOptions{}), false);
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / fmt::format("rlhf_test_supervised_{}", ::getpid());
  std::filesystem::remove_all(dir);

  rl::SupervisedOptions o = options(4, 2);
  o.name = "sft";
  o.seed = 9;
  o.max_epochs = 3;
  o.max_steps = 5;
  o.adam.lr = 1e-3;
  o.save_path = dir.string();
  o.ckpt_path = (dir / "checkpoints").string();  // not the default ./ckpt of the working folder
  o.save_steps = 2;
  o.logging_steps = 2;
  const rl::BatchPlan plan = rl::plan_batches(o, 10, 1, "d", "samples");  // 2 steps per epoch
  REQUIRE(plan.total_steps == 5);
  RecordingTask task(4);
  const rl::SupervisedResult res = rl::train_supervised(o, plan, task, *net, *comm);

  // Every step: one pre-pass with the step's samples, then TB / MB micro-batches of MB in order.
  REQUIRE(task.steps.size() == 5);
  rl::EpochOrder order(10, 9);
  for (size_t s = 0; s < 5; ++s) {
    REQUIRE(task.micro[s].size() == 2);
    std::vector<int64_t> joined;
    for (const auto& m : task.micro[s]) {
      CHECK(m.size() == 2);
      joined.insert(joined.end(), m.begin(), m.end());
    }
    CHECK(joined == task.steps[s]);
    for (size_t i = 0; i < 4; ++i)
      CHECK(task.steps[s][i] == order.at(plan.first_position(int64_t(s), 0) + int64_t(i)));
  }
  // Within an epoch no sample repeats; the next epoch draws a new permutation.
  std::set<int64_t> epoch0(task.steps[0].begin(), task.steps[0].end());
  epoch0.insert(task.steps[1].begin(), task.steps[1].end());
  CHECK(epoch0.size() == 8);
  CHECK(task.steps[2] != task.steps[0]);

  // Records every --logging_steps steps and at the last; AdamW's 1-based step; the schedule.
  const auto recs = read_metrics(dir);
  REQUIRE(recs.size() == 3);
  const auto sched = optim::LrSchedule::openrlhf(o.lr_scheduler, o.adam.lr, 5, o.lr_warmup_ratio);
  const int64_t want_steps[3] = {2, 4, 5};
  for (size_t i = 0; i < 3; ++i) {
    const auto& r = recs[i];
    CHECK(r["step"].get<int64_t>() == want_steps[i]);
    CHECK(r["epoch"].get<int64_t>() == (want_steps[i] - 1) / 2);
    CHECK(r["loss"].get<double>() == 1.0);
    CHECK(r["lr"].get<double>() == sched.lr_at(want_steps[i] - 1));
    CHECK(r["grad_norm"].get<double>() == 0.0);
    CHECK(r.contains("step_time_s"));
    CHECK(r.contains("elapsed_s"));
    double index_sum = 0;
    for (const int64_t s : task.steps[size_t(want_steps[i] - 1)]) index_sum += double(s);
    CHECK(r["index_sum"].get<double>() == index_sum);
  }
  // model_stepN.h5 every --save_steps steps but the last, and model.h5.
  CHECK(res.steps == 5);
  CHECK(res.model_path == (dir / "model.h5").string());
  CHECK(std::filesystem::exists(dir / "model_step2.h5"));
  CHECK(std::filesystem::exists(dir / "model_step4.h5"));
  CHECK(!std::filesystem::exists(dir / "model_step5.h5"));
  CHECK(std::filesystem::exists(dir / "model.h5"));
  // Training checkpoints go to --ckpt_path, here inside dir.
  CHECK(std::filesystem::exists(dir / "checkpoints" / "step_2.h5"));
  CHECK(std::filesystem::exists(dir / "checkpoints" / "step_4.h5"));

  // A non-finite loss stops the run before its optimizer step, naming the step.
  RecordingTask nan_task(4);
  nan_task.bad_step = 3;
  o.save_steps = -1;
  const std::string err = error_of([&] { rl::train_supervised(o, plan, nan_task, *net, *comm); });
  CHECK(err.find("loss is not finite (nan) at step 3") != std::string::npos);
  CHECK(nan_task.steps.size() == 3);

  // The failure-injection point is "<name>_step".
  o.name = "rm";
  ::setenv("RLHF_INJECT_FAILURE", "rm_step:0", 1);
  RecordingTask inj_task(4);
  const std::string inj = error_of([&] { rl::train_supervised(o, plan, inj_task, *net, *comm); });
  ::unsetenv("RLHF_INJECT_FAILURE");
  CHECK(inj.find("injected failure at rm_step on rank 0") != std::string::npos);
  CHECK(inj_task.steps.empty());
  std::filesystem::remove_all(dir);
}
