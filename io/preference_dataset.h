// Preference pairs for reward-model training (`rlhf rm`): chosen / rejected texts per record.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "io/tokenizer.h"

namespace rlhf::io {

/// One pair, tokenized: BOS + enc(prompt + text) + EOS for each side (the reward is read at EOS).
struct PreferencePair {
  std::vector<int32_t> chosen, rejected;
};

struct PreferenceDatasetOptions {
  std::string chosen_key = "chosen";
  std::string rejected_key = "rejected";
  std::string prompt_key;  ///< "" = the texts are whole transcripts (hh-rlhf)
  int64_t max_len = 512;   ///< longer sides are cut to max_len tokens, keeping EOS last
  int64_t max_samples = -1;
};

struct PreferenceDatasetStats {
  int64_t total = 0, truncated = 0, identical_skipped = 0;
  std::string summary() const;
};

struct PreferenceDataset {
  std::vector<PreferencePair> pairs;
  PreferenceDatasetStats stats;
};

/// Reads a JSONL file of pairs. Pairs whose two sides are identical after tokenization are skipped
/// (they carry no signal) and counted. Errors name the file and line: missing file, malformed
/// line, missing or non-string key, no usable pair.
PreferenceDataset build_preference_dataset(const std::string& path, const Tokenizer& tok,
                                           const PreferenceDatasetOptions& opt);

}  // namespace rlhf::io
