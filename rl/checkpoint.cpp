#include "rl/checkpoint.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <regex>

#include "core/error.h"
#include "core/log.h"
#include "io/h5_verify.h"
#include "io/hdf5_ckpt.h"
#include "io/sharded_ckpt.h"
#include "io/tokenizer_hdf5.h"
#include "parallel/comm.h"
#include "parallel/lora_store.h"
#include "rl/checkpoint_sharded.h"

namespace rlhf::rl {

namespace fs = std::filesystem;

namespace {

constexpr const char* kTrainFormat = "rlhf-train-checkpoint";

void write_group_model(io::CheckpointWriter& w, const std::string& group,
                       const model::ParamLayout& layout) {
  const std::string g = "/" + group;
  w.create_group(g);
  w.write_string_attr(g, "config", layout.config().to_json().dump());
  w.write_string_attr(g, "head", model::to_string(layout.head()));
}

// "checkpoint <path>: <GB> GB in <s> s (<GB/s> GB/s, <n> shards)" on rank 0's log: the bytes of
// the index (or single file) and every shard, over the wall time of the whole save.
void log_checkpoint_speed(const std::string& path, const nlohmann::json& index,
                          std::chrono::steady_clock::duration took) {
  std::error_code ec;
  double bytes = double(fs::file_size(path, ec));
  if (ec) bytes = 0;
  int n = 1;
  if (index.is_object()) {
    n = index["ranks"].get<int>();
    for (const auto& f : index["files"]) bytes += double(f["bytes"].get<int64_t>());
  }
  const double s = std::chrono::duration<double>(took).count();
  LOG_INFO("checkpoint {}: {:.3f} GB in {:.2f} s ({:.2f} GB/s, {})", path, bytes / 1e9, s,
           s > 0 ? bytes / 1e9 / s : 0.0, n > 1 ? fmt::format("{} shards", n) : "one file");
}

}  // namespace

bool sharded_checkpoints(const std::string& format, int train_ranks) {
  if (format == "single") return false;
  if (format == "sharded") return true;
  RLHF_CHECK(format == "auto", "--ckpt_format {}: expected single, sharded or auto", format);
  return train_ranks > 1;
}

std::string checkpoint_path(const std::string& dir, int64_t step) {
  return (fs::path(dir) / fmt::format("step_{}.h5", step)).string();
}

std::vector<std::string> list_checkpoints(const std::string& dir) {
  std::vector<std::pair<int64_t, std::string>> found;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return {};
  static const std::regex re(R"(step_(\d+)\.h5)");
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    std::smatch m;
    const std::string name = e.path().filename().string();
    if (std::regex_match(name, m, re)) found.emplace_back(std::stoll(m[1]), e.path().string());
  }
  std::sort(found.begin(), found.end());
  std::vector<std::string> out;
  for (auto& f : found) out.push_back(f.second);
  return out;
}

namespace {

// The LoRA settings a checkpoint's slot records (and a resume must match).
nlohmann::json lora_json(const model::LoraConfig& c) {
  nlohmann::json j = {{"r", c.rank},
                      {"lora_alpha", c.alpha},
                      {"target_modules", model::target_modules_string(c.targets)}};
  if (c.save_score) j["modules_to_save"] = "score";  // the score head trains (reward model, critic)
  return j;
}

// A LoRA slot: the adapters (under /<group>/<adapter tensor name>) and their moments only. The
// frozen base is not stored: the group's "lora" attribute records that the base weights are the
// run's --pretrain (or --model_config init), which a resumed run loads again.
void save_lora_slot(io::CheckpointWriter* w, const CheckpointSlot& s, parallel::LoraStore& ls) {
  const model::LoraLayout& ll = ls.lora_layout();
  std::vector<float> m(size_t(ll.numel())), v(m.size());
  if (s.optimizer) ls.gather_adapter_moments(m.data(), v.data());  // collective
  if (w == nullptr) return;
  const std::string g = "/" + s.group;
  nlohmann::json attr = lora_json(ll.config());
  attr["base"] = "not stored: the run's --pretrain / --model_config";
  w->write_string_attr(g, "lora", attr.dump());
  for (const model::TensorInfo& t : ll.tensors()) {
    w->write_dataset<float>(g + "/" + t.name, ls.adapters() + t.offset, t.shape);
    if (!s.optimizer) continue;
    w->write_dataset<float>("/optimizer/" + s.group + "/m/" + t.name, m.data() + t.offset, t.shape);
    w->write_dataset<float>("/optimizer/" + s.group + "/v/" + t.name, v.data() + t.offset, t.shape);
  }
}

void load_lora_slot(io::CheckpointReader& r, const std::string& path, const CheckpointSlot& s,
                    parallel::LoraStore& ls) {
  const model::LoraLayout& ll = ls.lora_layout();
  const std::string g = "/" + s.group;
  RLHF_CHECK(r.has_attr(g, "lora"),
             "{}: {} holds a full model, this run trains LoRA adapters (--lora_rank {})", path, g,
             ll.config().rank);
  nlohmann::json stored = nlohmann::json::parse(r.read_string_attr(g, "lora"));
  stored.erase("base");
  RLHF_CHECK(stored == lora_json(ll.config()), "{}: {} was saved with LoRA {}, this run has {}",
             path, g, stored.dump(), lora_json(ll.config()).dump());
  std::vector<float> p(size_t(ll.numel()), 0.0f), m(p.size(), 0.0f), v(p.size(), 0.0f);
  for (const model::TensorInfo& t : ll.tensors()) {
    r.read_dataset<float>(g + "/" + t.name, p.data() + t.offset, t.shape);
    if (!s.optimizer) continue;
    r.read_dataset<float>("/optimizer/" + s.group + "/m/" + t.name, m.data() + t.offset, t.shape);
    r.read_dataset<float>("/optimizer/" + s.group + "/v/" + t.name, v.data() + t.offset, t.shape);
  }
  ls.load_adapters(p.data());
  if (s.optimizer) ls.load_adapter_moments(m.data(), v.data());
}

}  // namespace

LoraCheckpoint read_lora_checkpoint(const std::string& path, const std::string& group) {
  io::CheckpointReader r(path);
  io::check_checkpoint_format(r);
  const std::string g = "/" + group;
  RLHF_CHECK(r.exists(g) && r.has_attr(g, "lora"),
             "{}: not a LoRA training checkpoint (its {} group has no adapters)", path, g);
  LoraCheckpoint out;
  out.config = model::ModelConfig::from_json(nlohmann::json::parse(r.read_string_attr(g, "config")),
                                             path + ":" + g, model::ConfigKeys::kHuggingFace);
  const nlohmann::json j = nlohmann::json::parse(r.read_string_attr(g, "lora"));
  out.lora.rank = j.at("r").get<int>();
  out.lora.alpha = j.at("lora_alpha").get<double>();
  out.lora.targets = model::parse_target_modules(j.at("target_modules").get<std::string>());
  out.lora.save_score = j.value("modules_to_save", std::string()) == "score";
  const model::LoraLayout ll(model::layer_spec(out.config), int(out.config.num_hidden_layers),
                             out.lora);
  out.adapters.assign(size_t(ll.numel()), 0.0f);
  for (const model::TensorInfo& t : ll.tensors())
    r.read_dataset<float>(g + "/" + t.name, out.adapters.data() + t.offset, t.shape);
  return out;
}

bool has_lora_group(const std::string& path, const std::string& group) {
  io::CheckpointReader r(path);
  return r.exists("/" + group) && r.has_attr("/" + group, "lora");
}

std::string hf_checkpoint_dir(const std::string& ckpt_file) {
  const fs::path p(ckpt_file);
  return (p.parent_path() / (p.stem().string() + "_hf")).string();
}

void save_train_checkpoint(const std::string& path, const std::vector<CheckpointSlot>& slots,
                           const nlohmann::json& trainer_state, bool writer, int max_keep,
                           const io::Tokenizer* tokenizer, parallel::Comm* shard_comm) {
  const auto t0 = std::chrono::steady_clock::now();
  std::unique_ptr<ShardedCheckpointWriter> shards;
  if (shard_comm != nullptr) {
    RLHF_CHECK(writer == (shard_comm->rank() == 0),
               "internal error: a sharded checkpoint's index is written by rank 0 of its ranks");
    shards = std::make_unique<ShardedCheckpointWriter>(path, *shard_comm);
  }
  std::unique_ptr<io::CheckpointWriter> w;
  if (writer) w = std::make_unique<io::CheckpointWriter>(path);
  for (const CheckpointSlot& s : slots) {
    const model::ParamLayout& layout = s.store->layout();
    if (w) {
      if (s.group == "model")
        io::write_model_config_hdf5(*w, layout);
      else
        write_group_model(*w, s.group, layout);
      if (s.optimizer) {
        w->create_group("/optimizer/" + s.group + "/m");
        w->create_group("/optimizer/" + s.group + "/v");
      }
    }
    if (auto* ls = dynamic_cast<parallel::LoraStore*>(s.store)) {
      save_lora_slot(w.get(), s, *ls);
      continue;
    }
    if (shards) {
      shards->write_slot(s);
      continue;
    }
    std::vector<float> full, m, v;
    for (int u = 0; u < layout.num_units(); ++u) {
      const model::UnitLayout& unit = layout.unit(u);
      full.resize(size_t(unit.numel));
      s.store->gather_unit(u, full.data());  // collective
      if (s.optimizer) {
        m.resize(size_t(unit.numel));
        v.resize(size_t(unit.numel));
        s.store->gather_moments(u, m.data(), v.data());  // collective
      }
      if (!w) continue;
      for (const model::TensorInfo& t : unit.tensors) {
        w->write_dataset<float>("/" + s.group + "/" + t.name, full.data() + t.offset, t.shape);
        if (s.optimizer) {
          w->write_dataset<float>("/optimizer/" + s.group + "/m/" + t.name, m.data() + t.offset,
                                  t.shape);
          w->write_dataset<float>("/optimizer/" + s.group + "/v/" + t.name, v.data() + t.offset,
                                  t.shape);
        }
      }
    }
  }
  nlohmann::json index;
  if (shards) index = shards->finish();  // collective: every shard committed, the folder renamed
  if (!w) {
    if (shard_comm != nullptr) shard_comm->barrier();  // returns once the index is committed
    return;
  }
  if (tokenizer != nullptr) io::write_tokenizer_hdf5(*w, *tokenizer);
  w->create_group("/trainer");
  w->write_string_attr("/trainer", "format", kTrainFormat);
  // Rollouts generated ahead (--async_train) can pass an attribute's 64 KiB: their JSON text goes
  // to a dataset of bytes, /trainer/async_queue.
  nlohmann::json attr_state = trainer_state;
  if (attr_state.contains("async_queue")) {
    const std::string q = attr_state["async_queue"].dump();
    w->write_dataset<uint8_t>("/trainer/async_queue", reinterpret_cast<const uint8_t*>(q.data()),
                              {int64_t(q.size())});
    attr_state.erase("async_queue");
  }
  w->write_string_attr("/trainer", "state", attr_state.dump());
  if (trainer_state.contains("step"))
    w->write_int_attr("/trainer", "step", trainer_state["step"].get<int64_t>());
  if (shards) io::write_shard_index(*w, index);
  w->commit();  // the commit of the whole checkpoint (the shards are in place already)
  if (shard_comm != nullptr) shard_comm->barrier();
  log_checkpoint_speed(path, index, std::chrono::steady_clock::now() - t0);
  if (max_keep > 0) {
    auto all = list_checkpoints(fs::path(path).parent_path().string());
    for (size_t i = 0; i + size_t(max_keep) < all.size(); ++i) {
      std::error_code ec;
      fs::remove(all[i], ec);
      fs::remove_all(hf_checkpoint_dir(all[i]), ec);
      fs::remove_all(io::shard_dir(all[i]), ec);
      LOG_DEBUG("removed old checkpoint {}", all[i]);
    }
  }
}

nlohmann::json load_train_checkpoint(const std::string& path,
                                     const std::vector<CheckpointSlot>& slots) {
  io::CheckpointReader r(path);
  io::check_checkpoint_format(r);
  RLHF_CHECK(r.exists("/trainer") && r.has_attr("/trainer", "state"),
             "{}: not a training checkpoint (no /trainer state)\nhint: use --pretrain for a model "
             "checkpoint",
             path);
  std::unique_ptr<io::ShardSet> shards;
  if (io::is_sharded_checkpoint(r)) shards = std::make_unique<io::ShardSet>(r);
  for (const CheckpointSlot& s : slots) {
    const model::ParamLayout& layout = s.store->layout();
    const std::string g = "/" + s.group;
    RLHF_CHECK(r.exists(g), "{}: no {} group", path, g);
    auto stored =
        model::ModelConfig::from_json(nlohmann::json::parse(r.read_string_attr(g, "config")),
                                      path + ":" + g, model::ConfigKeys::kHuggingFace);
    RLHF_CHECK(stored.to_json() == layout.config().to_json(),
               "{}: {} was saved for a different model config", path, g);
    if (auto* ls = dynamic_cast<parallel::LoraStore*>(s.store)) {
      load_lora_slot(r, path, s, *ls);
      continue;
    }
    RLHF_CHECK(!r.has_attr(g, "lora"),
               "{}: {} holds LoRA adapters; resume it with the same --lora_rank", path, g);
    if (shards) {
      load_sharded_slot(*shards, s);
      continue;
    }
    std::vector<float> full, m, v;
    for (int u = 0; u < layout.num_units(); ++u) {
      const model::UnitLayout& unit = layout.unit(u);
      full.assign(size_t(unit.numel), 0.0f);
      for (const model::TensorInfo& t : unit.tensors)
        r.read_dataset<float>(g + "/" + t.name, full.data() + t.offset, t.shape);
      s.store->load_unit(u, full.data());
      if (!s.optimizer) continue;
      m.assign(size_t(unit.numel), 0.0f);
      v.assign(size_t(unit.numel), 0.0f);
      for (const model::TensorInfo& t : unit.tensors) {
        r.read_dataset<float>("/optimizer/" + s.group + "/m/" + t.name, m.data() + t.offset,
                              t.shape);
        r.read_dataset<float>("/optimizer/" + s.group + "/v/" + t.name, v.data() + t.offset,
                              t.shape);
      }
      s.store->load_moments(u, m.data(), v.data());
    }
  }
  nlohmann::json state = nlohmann::json::parse(r.read_string_attr("/trainer", "state"));
  if (r.exists("/trainer/async_queue")) {
    const std::vector<uint8_t> q = r.read_dataset_vector<uint8_t>("/trainer/async_queue");
    state["async_queue"] = nlohmann::json::parse(q.begin(), q.end());
  }
  return state;
}

std::string latest_valid_checkpoint(const std::string& dir) {
  auto all = list_checkpoints(dir);
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    try {
      io::CheckpointReader r(*it);
      io::check_checkpoint_format(r);
      RLHF_CHECK(r.exists("/trainer") && r.has_attr("/trainer", "state"), "no /trainer state");
      const auto state = nlohmann::json::parse(r.read_string_attr("/trainer", "state"));
      RLHF_CHECK(state.is_object(), "the trainer state is not an object");
      // Every dataset read once: a flipped bit fails its chunk's Fletcher32 checksum here,
      // before any store is touched, instead of in the middle of the load.
      io::verify_hdf5_file(*it);
      if (io::is_sharded_checkpoint(r)) io::ShardSet(r).verify();
      return *it;
    } catch (const std::exception& e) {
      LOG0_WARN("checkpoint {} is unusable ({}); trying the previous one", *it, e.what());
    }
  }
  return "";
}

std::vector<std::string> changed_settings(const nlohmann::json& saved, const nlohmann::json& now) {
  std::vector<std::string> out;
  if (!now.is_object()) return out;
  for (const auto& [key, value] : now.items()) {
    const bool known = saved.is_object() && saved.contains(key);
    if (known && saved.at(key) == value) continue;
    out.push_back(fmt::format("{} {} -> {}", key, known ? saved.at(key).dump() : "(not saved)",
                              value.dump()));
  }
  return out;
}

void warn_changed_settings(const std::string& path, const nlohmann::json& trainer_state,
                           const nlohmann::json& settings) {
  const std::vector<std::string> changed =
      changed_settings(trainer_state.value("settings", nlohmann::json()), settings);
  if (changed.empty()) return;
  LOG0_WARN(
      "resuming from {} with settings that differ from the checkpoint's: {}\nthe run goes "
      "on from step {} under the new values",
      path, fmt::format("{}", fmt::join(changed, ", ")), trainer_state.value("step", int64_t(0)));
}

}  // namespace rlhf::rl
