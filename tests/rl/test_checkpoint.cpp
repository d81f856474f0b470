// Training checkpoints pick the newest file that reads back whole: byte flips in several places of
// the newest checkpoint either change nothing that is loaded (free space) or make it skipped for
// the previous one — never a crash, never a silently different model.
#include "rl/checkpoint.h"

#include <cstring>
#include <filesystem>

#include "model/init.h"
#include "parallel/param_store.h"
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
  c.vocab_size = 64;
  c.max_position_embeddings = 32;
  c.bos_token_id = c.eos_token_id = c.pad_token_id = 0;
  return c;
}

void fill_weights(parallel::LocalParamStore& s, uint64_t seed) {
  for (int u = 0; u < s.layout().num_units(); ++u)
    model::init_unit_params(s.local().params(u), s.layout().unit(u), seed, 0.3);
}

std::vector<std::vector<float>> weights(parallel::LocalParamStore& s) {
  std::vector<std::vector<float>> w;
  for (int u = 0; u < s.layout().num_units(); ++u) {
    w.emplace_back(size_t(s.layout().unit(u).numel));
    s.gather_unit(u, w.back().data());
  }
  return w;
}

}  // namespace

TEST_CASE("checkpoints: a corrupted newest checkpoint is skipped for the previous one") {
  test::TempDir dir;
  const model::ParamLayout layout(small(), model::HeadKind::kLM);
  parallel::LocalParamStore store(layout);
  std::vector<rl::CheckpointSlot> slots = {{"model", &store, true}};
  fill_weights(store, 1);
  const auto w1 = weights(store);
  rl::save_train_checkpoint(rl::checkpoint_path(dir.path().string(), 1), slots, {{"step", 1}}, true,
                            0);
  fill_weights(store, 2);
  const auto w2 = weights(store);
  const std::string newest = rl::checkpoint_path(dir.path().string(), 2);
  rl::save_train_checkpoint(newest, slots, {{"step", 2}}, true, 0);
  REQUIRE(rl::latest_valid_checkpoint(dir.path().string()) == newest);
  const std::string bytes = test::slurp(newest);

  // A flip inside a tensor's data (found by its bytes: datasets are stored raw, checksummed by
  // Fletcher32) must make the newest file unusable.
  const auto& emb = w2[0];
  const std::string needle(reinterpret_cast<const char*>(emb.data()), 64);
  const size_t at = bytes.find(needle);
  REQUIRE(at != std::string::npos);
  // A spread of positions over the whole file, plus three inside that tensor.
  std::vector<size_t> flips = {at + 3, at + 40, at + 63};
  for (size_t k = 0; k < 60; ++k) flips.push_back(k * bytes.size() / 60 + (k * 7919) % 13);
  int skipped = 0, harmless = 0;
  for (size_t pos : flips) {
    if (pos >= bytes.size()) continue;
    std::string bad = bytes;
    bad[pos] = static_cast<char>(bad[pos] ^ 0x5a);
    std::filesystem::remove(newest);
    dir.write(std::filesystem::path(newest).filename().string(), bad);
    CAPTURE(pos);
    const std::string chosen = rl::latest_valid_checkpoint(dir.path().string());
    fill_weights(store, 9);
    const nlohmann::json st = rl::load_train_checkpoint(chosen, slots);
    if (chosen == newest) {
      // Undetected: the flip was in bytes that are never read; the model is exactly B.
      CHECK(st.at("step") == 2);
      CHECK(weights(store) == w2);
      ++harmless;
    } else {
      CHECK(st.at("step") == 1);
      CHECK(weights(store) == w1);
      ++skipped;
    }
    if (pos >= at && pos < at + 64) CHECK(chosen != newest);
  }
  MESSAGE(skipped << " flips skipped the newest checkpoint, " << harmless << " changed nothing");
  CHECK(skipped >= 3);
}

TEST_CASE("checkpoints: a resumed run's changed settings are listed") {
  const nlohmann::json saved = {
      {"rollout_batch_size", 16}, {"total_steps", 100}, {"learning_rate", 1e-6}, {"old_only", 1}};
  // Unchanged (doubles round-trip through the JSON text of the checkpoint exactly).
  const nlohmann::json same = nlohmann::json::parse(saved.dump());
  CHECK(rlhf::rl::changed_settings(saved, same).empty());
  const nlohmann::json now = {{"rollout_batch_size", 32},
                              {"total_steps", 100},
                              {"learning_rate", 1e-6},
                              {"dynamic_filtering", true}};
  const std::vector<std::string> changed = rlhf::rl::changed_settings(saved, now);
  REQUIRE(changed.size() == 2);
  CHECK(changed[0] == "dynamic_filtering (not saved) -> true");  // nlohmann sorts object keys
  CHECK(changed[1] == "rollout_batch_size 16 -> 32");
  // A checkpoint from before settings were recorded: every setting is "(not saved)".
  CHECK(rlhf::rl::changed_settings(nlohmann::json(), now).size() == 4);
}
