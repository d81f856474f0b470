// OpenRLHF's option names (v0.10.2+ namespaced, `--actor.model_name_or_path`, and the flat names
// of earlier releases that rlhf spells differently) and what each means in rlhf: an alias of an
// rlhf flag (it parses, shows under that flag in --help and works as a TOML key), a performance or
// placement setting whose effect rlhf always has or does not need (accepted and ignored, with a
// notice), or a capability rlhf lacks (refused with a one-line reason).
#pragma once

#include <span>
#include <string>
#include <string_view>

namespace rlhf::app {

class OptionSet;

/// What rlhf does with an OpenRLHF name when its rlhf flag is not one of the command's.
enum class OpenRlhfFallback {
  kReject,  ///< unknown option, the note says why and what to use
  kIgnore,  ///< accepted, ignored with a notice (the note says why that is safe)
};

/// One OpenRLHF name.
struct OpenRlhfName {
  const char* name;           ///< without dashes: "actor.adam.lr", "packing_samples"
  const char* key;            ///< the rlhf option it sets ("" = none)
  OpenRlhfFallback fallback;  ///< when `key` is empty or not an option of the command
  int nargs;                  ///< values an ignored option takes: 0 (a switch), 1 or 2
  const char* note;           ///< the reason (kReject) or what rlhf does instead (kIgnore)
  const char* commands;       ///< kIgnore: the commands that accept it, e.g. "grpo ppo"
};

/// Every name of the table, in OpenRLHF's groups (actor, critic, reward, ref, data, rollout,
/// train, algo, ds, vllm, ckpt, logger, eval) and then the flat names.
std::span<const OpenRlhfName> openrlhf_names();

/// The entry for `name` (without dashes) whose key `set` has, else its first entry, else nullptr.
const OpenRlhfName* find_openrlhf_name(std::string_view name, const OptionSet* set = nullptr);

/// Registers the table on `set`: an alias for each name whose key is an option of the command, an
/// ignored option for each kIgnore name that lists the command.
void add_openrlhf_names(OptionSet& set);

/// "\nhint: ..." for an OpenRLHF name `set` does not accept (the reason, or the flag of another
/// command), else "".
std::string openrlhf_hint(std::string_view name, const OptionSet& set);

}  // namespace rlhf::app
