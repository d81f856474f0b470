// Checkpoints keep the tokenizer: a training checkpoint (rl::save_train_checkpoint, what SFT, RM,
// GRPO and PPO write as <ckpt_path>/step_N.h5) and a model checkpoint (rl::save_model) opened as
// --pretrain bring back the tokenizer they were saved with (same kind, same ids), and
// --save_hf_ckpt's folder (rl::save_hf_model) holds the weights and tokenizer files that load
// back as the same model and tokenizer. Uses llama2.c's tok512.bin from ../shared/data when
// present, the byte tokenizer always.
#include <filesystem>

#include "io/pretrained.h"
#include "model/init.h"
#include "parallel/param_store.h"
#include "rl/checkpoint.h"
#include "rl/weights.h"
#include "tests/io/io_test_util.h"
#include "tests/test_util.h"

using namespace rlhf;

namespace {

model::ModelConfig small() {
  model::ModelConfig c;
  c.hidden_size = 32;
  c.intermediate_size = 48;
  c.num_hidden_layers = 1;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.vocab_size = 512;  // tok512's; the byte tokenizer's 259 fit
  c.max_position_embeddings = 64;
  c.bos_token_id = 1;
  c.eos_token_id = 2;
  return c;
}

std::vector<std::unique_ptr<io::Tokenizer>> tokenizers() {
  std::vector<std::unique_ptr<io::Tokenizer>> out;
  out.push_back(io::make_tokenizer("byte"));
  const std::string tok512 = test::shared_data_path("stories260K/tok512.bin");
  if (tok512.empty())
    MESSAGE("skipped the llama2.c tokenizer: ../shared/data not found (set RLHF_SHARED_DATA)");
  else
    out.push_back(io::make_tokenizer(tok512));
  return out;
}

void check_same_tokenizer(const io::Tokenizer& want, const io::PretrainedModel& m) {
  REQUIRE(m.tokenizer != nullptr);
  const std::string text = "Once upon a time, Tom saw 42 birds.  caf\xC3\xA9 \xF0\x9F\x99\x82";
  CHECK(m.tokenizer->encode(text, true, true) == want.encode(text, true, true));
  CHECK(m.tokenizer->vocab_size() == want.vocab_size());
}

// Every tensor of `m` equals the store's, bitwise.
void check_weights(parallel::LocalParamStore& store, const io::PretrainedModel& m) {
  const model::ParamLayout& layout = store.layout();
  for (int u = 0; u < layout.num_units(); ++u) {
    std::vector<float> want(size_t(layout.unit(u).numel)), got(want.size(), -1.0f);
    store.gather_unit(u, want.data());
    io::load_pretrained_unit(m, layout, u, got.data());
    for (const model::TensorInfo& t : layout.unit(u).tensors) {
      INFO("tensor " << t.name);
      CHECK(std::equal(want.begin() + t.offset, want.begin() + t.offset + t.numel,
                       got.begin() + t.offset));
    }
  }
}

}  // namespace

TEST_CASE("checkpoints keep the tokenizer: training and model checkpoints, --save_hf_ckpt") {
  const model::ParamLayout layout(small(), model::HeadKind::kLM);
  parallel::LocalParamStore store(layout);
  for (int u = 0; u < layout.num_units(); ++u)
    model::init_unit_params(store.local().params(u), layout.unit(u), 7, 0.3);
  for (const auto& tok : tokenizers()) {
    INFO("tokenizer " << tok->name());
    test::TempDir dir;
    const std::vector<rl::CheckpointSlot> slots = {{"model", &store, true}};
    const std::string ckpt = rl::checkpoint_path(dir.path().string(), 3);
    rl::save_train_checkpoint(ckpt, slots, {{"step", 3}}, true, 0, tok.get());
    const io::PretrainedModel from_ckpt = io::open_pretrained(ckpt);
    CHECK(from_ckpt.tokenizer->kind() == tok->kind());
    check_same_tokenizer(*tok, from_ckpt);
    check_weights(store, from_ckpt);

    const std::string model = dir.file("model.h5");
    rl::save_model(store, model, 0, tok.get());
    check_same_tokenizer(*tok, io::open_pretrained(model));

    const std::string hf = rl::hf_checkpoint_dir(ckpt);
    CHECK(hf == dir.file("step_3_hf"));
    rl::save_hf_model(store, hf, 0, tok.get());
    for (const char* f : {"config.json", "model.safetensors", "generation_config.json",
                          "tokenizer.json", "tokenizer_config.json"})
      CHECK(std::filesystem::exists(hf + "/" + f));
    CHECK_FALSE(std::filesystem::exists(hf + ".tmp"));
    const io::PretrainedModel from_hf = io::open_pretrained(hf);
    check_same_tokenizer(*tok, from_hf);
    check_weights(store, from_hf);
  }
}

TEST_CASE("checkpoints: pruning old checkpoints removes their Hugging Face folders too") {
  const model::ParamLayout layout(small(), model::HeadKind::kLM);
  parallel::LocalParamStore store(layout);
  for (int u = 0; u < layout.num_units(); ++u)
    model::init_unit_params(store.local().params(u), layout.unit(u), 7, 0.3);
  test::TempDir dir;
  const std::vector<rl::CheckpointSlot> slots = {{"model", &store, false}};
  const io::ByteTokenizer tok;
  for (int step = 1; step <= 3; ++step) {
    const std::string ckpt = rl::checkpoint_path(dir.path().string(), step);
    rl::save_train_checkpoint(ckpt, slots, {{"step", step}}, true, 2, &tok);
    rl::save_hf_model(store, rl::hf_checkpoint_dir(ckpt), 0, &tok);
  }
  // Saving step 3 pruned step 1 (and its folder); step 3's folder is written after the prune.
  CHECK_FALSE(std::filesystem::exists(dir.file("step_1.h5")));
  CHECK_FALSE(std::filesystem::exists(dir.file("step_1_hf")));
  CHECK(std::filesystem::exists(dir.file("step_2_hf")));
  CHECK(std::filesystem::exists(dir.file("step_3_hf/model.safetensors")));
}
