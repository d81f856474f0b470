// The training part of a step's metrics record (rl/train_record.h): one key set for every step,
// the empty step's (dynamic filtering kept nothing: a default record) and a trained step's alike.
// tests/e2e/offpolicy.sh checks the same on the records of real runs.
#include "rl/train_record.h"

#include <set>
#include <string>

#include "tests/test_util.h"

using namespace rlhf;

namespace {
std::set<std::string> keys(const nlohmann::json& j) {
  std::set<std::string> k;
  for (auto it = j.begin(); it != j.end(); ++it) k.insert(it.key());
  return k;
}
}  // namespace

TEST_CASE("train record: an empty step and a trained step write the same keys") {
  rl::TrainRecord empty;
  rl::TrainRecord trained;
  trained.stats.policy_loss = 0.5;
  trained.stats.optimizer_steps = 4;
  trained.stats.mismatch.mismatch_kl = 1e-4;
  trained.stats.mismatch.is_weight_mean = 1;
  trained.logprob_s = 0.25;
  trained.logprob_old_skipped = true;
  trained.trained_samples = 16;
  trained.train_s = 2;
  trained.train_tokens = 400;
  const nlohmann::json e = empty.to_json(), t = trained.to_json();
  CHECK(keys(e) == keys(t));
  // Among them the keys the empty step used to leave out, and the mismatch metrics.
  for (const char* k : {"logprob_comm_bytes",
                        "logprob_old_skipped",
                        "kl_coef",
                        "actor_grad_norm",
                        "critic_grad_norm",
                        "actor_lr",
                        "critic_lr",
                        "optimizer_steps",
                        "train_comm_bytes",
                        "train_tokens",
                        "mismatch_kl",
                        "mismatch_abs_logp_mean",
                        "mismatch_abs_logp_max",
                        "vllm_kl",
                        "is_weight_mean",
                        "is_weight_min",
                        "is_weight_max",
                        "is_masked_fraction",
                        "trained_samples",
                        "train_micro_batches"})
    CHECK_MESSAGE(e.contains(k), k);
  for (auto it = e.begin(); it != e.end(); ++it) {
    INFO(it.key());
    CHECK(it->is_number());
    CHECK(it->get<double>() == 0.0);  // an empty step reports zeros
  }
  CHECK(t.at("train_tokens_per_s").get<double>() == 200.0);
  CHECK(t.at("logprob_old_skipped").get<int>() == 1);
  CHECK(t.at("mismatch_kl").get<double>() == 1e-4);
}
