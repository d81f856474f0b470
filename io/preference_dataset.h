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
  /// --apply_chat_template: each side is rendered with the tokenizer's chat template (see
  /// build_preference_dataset).
  bool apply_chat_template = false;
  std::string model_type;  ///< picks the built-in chat format of a tokenizer without a template
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
/// (they carry no signal) and counted. With apply_chat_template, as OpenRLHF's RewardDataset: with
/// a prompt_key, a side is render(prompt + side) (prompt: a string = one user turn, or chat
/// messages; side: a string = one assistant turn, or chat messages), checked to start with the
/// prompt rendered with the generation prompt; without one, each side must be a conversation
/// (chat messages) and is rendered whole. Then trailing newlines are dropped and the side is
/// encoded without BOS (templates write their own), with EOS unless it already ends with the EOS
/// token. Errors name the file and line: missing file, malformed line, missing or non-string key
/// (chat messages where the template takes them), a template that cannot render, no usable
/// pair.
PreferenceDataset build_preference_dataset(const std::string& path, const Tokenizer& tok,
                                           const PreferenceDatasetOptions& opt);

}  // namespace rlhf::io
