#include "rl/tracking.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "core/log.h"
#include "io/tensorboard.h"
#include "rl/subprocess.h"

namespace rlhf::rl {

namespace {

/// `s` as one single-quoted /bin/sh word.
std::string sh_quote(const std::string& s) {
  std::string out(1, '\'');
  for (char c : s) {
    if (c == '\'')
      out.append("'\\''");
    else
      out.push_back(c);
  }
  out.push_back('\'');
  return out;
}

/// Waits up to timeout_s for the leader of `child` to exit.
bool wait_exit(subprocess::ChildGroup& child, double timeout_s) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (!child.exited()) {
    if (std::chrono::steady_clock::now() >= until) return false;
    if (child.pidfd() >= 0) {
      pollfd p{child.pidfd(), POLLIN, 0};
      ::poll(&p, 1, 100);
    } else {
      ::usleep(20000);
    }
  }
  return true;
}

/// Whether `python3 -c "import wandb"` succeeds (within 120 s).
bool wandb_importable() {
  subprocess::Fd null(::open("/dev/null", O_RDWR | O_CLOEXEC));
  RLHF_CHECK(null.open(), "--use_wandb: cannot open /dev/null");
  subprocess::ChildGroup probe("python3 -c 'import wandb'", null.get(), null.get(), null.get(),
                               "--use_wandb");
  if (!wait_exit(probe, 120)) {
    probe.kill_and_reap();
    return false;
  }
  const int status = probe.reap();
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

}  // namespace

std::string wandb_sidecar_path() {
  if (const char* env = std::getenv("RLHF_WANDB_SIDECAR"); env != nullptr && *env != '\0') {
    RLHF_CHECK(std::filesystem::is_regular_file(env),
               "RLHF_WANDB_SIDECAR={}: no such file (the W&B sidecar script)", env);
    return env;
  }
  std::error_code ec;
  const auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  std::vector<std::filesystem::path> tried;
  if (!ec) {
    const auto root = exe.parent_path().parent_path();
    tried = {root / "scripts" / "wandb_sidecar.py", root / "share" / "rlhf" / "wandb_sidecar.py"};
    for (const auto& p : tried)
      if (std::filesystem::is_regular_file(p)) return p.string();
  }
  std::string places;
  for (const auto& p : tried) places.append(" ").append(p.string());
  RLHF_FAIL(
      "--use_wandb: cannot find wandb_sidecar.py (tried{})\nhint: set RLHF_WANDB_SIDECAR to the "
      "path of scripts/wandb_sidecar.py",
      places);
}

RunTracker::RunTracker(const TrackingOptions& o, const std::string& save_path,
                       const std::string& command, const nlohmann::json& config) {
  if (!o.tensorboard_dir.empty()) {
    tb_ = std::make_unique<io::TensorBoardWriter>(o.tensorboard_dir);
    LOG0_INFO("TensorBoard: {} (tensorboard --logdir {})", tb_->path(), o.tensorboard_dir);
  }
  if (o.wandb.empty()) return;
  RLHF_CHECK(wandb_importable(),
             "--use_wandb: the W&B client is not installed for python3 (`python3 -c \"import "
             "wandb\"` fails)\nhint: pip install wandb (in the environment whose python3 is on "
             "PATH), or drop --use_wandb; WANDB_MODE=offline logs without a network");
  const std::string script = wandb_sidecar_path();
  if (o.wandb != "true") ::setenv("WANDB_API_KEY", o.wandb.c_str(), 1);  // OpenRLHF's token form
  const std::filesystem::path dir(save_path);
  const std::string config_path = (dir / "wandb_config.json").string();
  std::ofstream(config_path) << config.dump(2) << "\n";
  std::string cmd = fmt::format(
      "exec python3 {} --metrics {} --samples {} --config {} --project {} --job_type {}",
      sh_quote(script), sh_quote((dir / "metrics.jsonl").string()),
      sh_quote((dir / "samples.jsonl").string()), sh_quote(config_path), sh_quote(o.wandb_project),
      sh_quote(command));
  if (!o.wandb_group.empty()) cmd.append(" --group ").append(sh_quote(o.wandb_group));
  if (!o.wandb_run_name.empty()) cmd.append(" --name ").append(sh_quote(o.wandb_run_name));
  if (!o.wandb_org.empty()) cmd.append(" --entity ").append(sh_quote(o.wandb_org));
  subprocess::Fd rd, wr;
  subprocess::make_pipe(rd, wr, false, false, "--use_wandb");
  sidecar_ = std::make_unique<subprocess::ChildGroup>(cmd, rd.get(), STDOUT_FILENO, STDERR_FILENO,
                                                      "--use_wandb");
  sidecar_stdin_ = std::make_unique<subprocess::Fd>(::fcntl(wr.get(), F_DUPFD_CLOEXEC, 3));
  wr.reset();
  LOG0_INFO("W&B: sidecar {} following {}/metrics.jsonl (project {})", script, save_path,
            o.wandb_project);
}

RunTracker::~RunTracker() {
  try {
    finish();
  } catch (...) {  // a destructor must not throw; finish() already logged
  }
}

void RunTracker::record(const nlohmann::json& record) {
  if (tb_) tb_->add_record(record);
}

void RunTracker::text(int64_t step, const std::string& markdown) {
  if (tb_) tb_->add_text("completions", step, markdown);
}

void RunTracker::finish(double timeout_s) {
  if (!sidecar_ || sidecar_->reaped()) return;
  if (sidecar_stdin_) sidecar_stdin_->reset();  // EOF: the sidecar drains the files and exits
  if (!wait_exit(*sidecar_, timeout_s)) {
    LOG0_WARN("W&B sidecar still running after {:.0f} s: stopped (the run's data stay in {})",
              timeout_s, "metrics.jsonl");
    sidecar_->kill_and_reap();
    return;
  }
  const int status = sidecar_->reap();
  if (!(WIFEXITED(status) && WEXITSTATUS(status) == 0))
    LOG0_WARN(
        "W&B sidecar ended with {} (metrics.jsonl is complete; `wandb sync` can upload an "
        "offline run)",
        subprocess::describe_status(status));
}

std::string completions_markdown(const std::vector<std::string>& prompts,
                                 const std::vector<std::string>& completions,
                                 const std::vector<double>& scores) {
  auto cell = [](const std::string& s) {
    std::string out;
    for (char c : s) {
      if (c == '|')
        out += "\\|";
      else if (c == '\n')
        out += "<br>";
      else if (c != '\r')
        out += c;
    }
    return out;
  };
  std::string md = "| prompt | completion | score |\n|---|---|---|\n";
  for (size_t i = 0; i < prompts.size() && i < completions.size() && i < scores.size(); ++i)
    md += fmt::format("| {} | {} | {} |\n", cell(prompts[i]), cell(completions[i]), scores[i]);
  return md;
}

}  // namespace rlhf::rl
