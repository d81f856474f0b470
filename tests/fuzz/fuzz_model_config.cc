// libFuzzer harness: model configs as --model_config and a HF folder's config.json read them. The
// bytes go through io::load_model_config_file as a TOML file (strict keys) and as a JSON file
// (lenient keys), and, when they are a JSON object, through model::ModelConfig::from_json in both
// key modes. Every config that is accepted must then be usable without a crash or a huge
// allocation: its layout (ParamLayout, every head), parameter count, RoPE frequencies, and a
// to_json → from_json round trip that gives the same config back.
#include <unistd.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "io/model_config_file.h"
#include "model/config.h"
#include "model/layout.h"
#include "tests/fuzz/fuzz_common.h"

namespace {

std::string temp_file(const char* ext) {
  return (std::filesystem::temp_directory_path() /
          ("rlhf_fuzz_model_config_" + std::to_string(::getpid()) + ext))
      .string();
}

void write_file(const std::string& path, const uint8_t* data, size_t size) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) std::abort();
  if (size > 0 && std::fwrite(data, 1, size, f) != size) std::abort();
  std::fclose(f);
}

// What a run does with an accepted config; anything but rlhf::Error escaping is a bug, and so is a
// round trip that changes the config.
void use(const rlhf::model::ModelConfig& c) {
  using rlhf::model::HeadKind;
  for (HeadKind h : {HeadKind::kLM, HeadKind::kValue, HeadKind::kReward}) {
    const rlhf::model::ParamLayout layout(c, h);
    int64_t n = 0;
    for (const auto& u : layout.units()) n += u.numel;
    if (n < c.num_parameters(h)) {
      std::fprintf(stderr, "layout holds %lld elements, fewer than the %lld parameters\n",
                   static_cast<long long>(n), static_cast<long long>(c.num_parameters(h)));
      std::abort();
    }
  }
  (void)rlhf::model::rope_inv_freq(c);
  const nlohmann::json j = c.to_json();
  const rlhf::model::ModelConfig back =
      rlhf::model::ModelConfig::from_json(j, "round trip", rlhf::model::ConfigKeys::kStrict);
  if (back.to_json() != j) {
    std::fprintf(stderr, "to_json/from_json round trip changed the config:\n%s\n%s\n",
                 j.dump().c_str(), back.to_json().dump().c_str());
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string toml = temp_file(".toml"), json = temp_file(".json");
  write_file(toml, data, size);
  write_file(json, data, size);
  rlhf::fuzz::expect_only_rlhf_errors([&] { use(rlhf::io::load_model_config_file(toml)); });
  rlhf::fuzz::expect_only_rlhf_errors([&] { use(rlhf::io::load_model_config_file(json)); });
  const nlohmann::json j = nlohmann::json::parse(data, data + size, nullptr, false);
  if (j.is_discarded()) return 0;
  for (auto keys : {rlhf::model::ConfigKeys::kStrict, rlhf::model::ConfigKeys::kHuggingFace})
    rlhf::fuzz::expect_only_rlhf_errors(
        [&] { use(rlhf::model::ModelConfig::from_json(j, "fuzz.json", keys)); });
  return 0;
}
