// `rlhf rm`: the flags of reward-model training turned into rl::RmConfig, and the run (rl/rm.h
// holds the Bradley–Terry task, rl/supervised.h the loop it shares with `rlhf sft`).
#include "app/commands.h"
#include "app/runtime.h"
#include "rl/rm.h"

namespace rlhf::app {

namespace {

rl::RmConfig rm_config(const RmArgs& a) {
  rl::RmConfig c;
  c.runtime = runtime_options(a.parallel, 1);
  c.zero = zero_options(a.zero);
  c.zero.lora = lora_options(a.lora);
  c.zero.lora.seed = uint64_t(a.common.seed);  // the LoRA dropout masks
  c.model_config = a.model.model_config;
  c.pretrain = a.model.pretrain;
  c.tokenizer = a.model.tokenizer;
  c.dataset = a.dataset;
  c.data.chosen_key = a.chosen_key;
  c.data.rejected_key = a.rejected_key;
  c.data.prompt_key = a.prompt_key;
  c.data.apply_chat_template = a.apply_chat_template;
  c.data.max_len = a.max_len;
  c.data.max_samples = a.max_samples;
  c.train = supervised_options("rm", a.common, a.loop, a.optim, a.ckpt);
  c.train.tracking = tracking_options(a.tracking);
  return c;
}

}  // namespace

int run_rm(const RmArgs& args) {
  return rl::run_rm(rm_config(args));
}

}  // namespace rlhf::app
