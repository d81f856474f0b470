// `rlhf sft`: the flags of supervised fine-tuning turned into rl::SftConfig, and the run
// (rl/sft.h holds the task, rl/supervised.h the loop it shares with `rlhf rm`).
#include "app/commands.h"
#include "app/runtime.h"
#include "io/sft_dataset.h"
#include "rl/sft.h"

namespace rlhf::app {

namespace {

rl::SftConfig sft_config(const SftArgs& a) {
  rl::SftConfig c;
  c.runtime = runtime_options(a.parallel, 1);
  c.zero = zero_options(a.zero);
  c.zero.lora = lora_options(a.lora);
  c.zero.lora.seed = uint64_t(a.common.seed);  // the LoRA dropout masks
  c.model_config = a.model.model_config;
  c.pretrain = a.model.pretrain;
  c.tokenizer = a.model.tokenizer;
  c.dataset = a.data.dataset;
  c.data.input_key = a.input_key;
  c.data.output_key = a.output_key;
  c.data.max_len = a.data.max_len;
  c.data.overlong = io::overlong_policy_from_string(a.data.truncation);
  c.data.max_samples = a.data.max_samples;
  c.data.apply_chat_template = a.apply_chat_template;
  c.train = supervised_options("sft", a.common, a.loop, a.optim, a.ckpt);
  c.train.tracking = tracking_options(a.tracking);
  return c;
}

}  // namespace

int run_sft(const SftArgs& args) {
  return rl::run_sft(sft_config(args));
}

}  // namespace rlhf::app
