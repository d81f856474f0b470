// TRL option names (GRPOConfig, SFTConfig, RewardConfig and their TrainingArguments base) and the
// rlhf flags that mean the same, for the hint an unknown option gets and docs/migrating.md's table.
#pragma once

#include <span>
#include <string>
#include <string_view>

namespace rlhf::app {

/// One TRL option and what rlhf calls it.
struct TrlName {
  const char* trl;   ///< TRL's name, e.g. "num_generations"
  const char* rlhf;  ///< the rlhf flag(s) and how they relate, e.g. "--n_samples_per_prompt"
};

/// Every TRL name with a different rlhf spelling in some subcommand (names spelled the same in
/// both are left out).
std::span<const TrlName> trl_names();

/// "\nhint: TRL's --<name> is <rlhf> in rlhf" when `name` (without dashes) is a TRL option name in
/// the table, else "".
std::string trl_hint(std::string_view name);

}  // namespace rlhf::app
