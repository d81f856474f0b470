// The prompts of an RL run: read from JSONL (or a builtin task), rendered (chat template or plain
// text), tokenized, with their labels, and visited in a seeded order per episode.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "io/tokenizer.h"
#include "model/config.h"
#include "rl/epoch_order.h"

namespace rlhf::rl {

/// One prompt.
struct Prompt {
  std::string text;             ///< as given to the model (after the chat template, if any)
  std::vector<int32_t> tokens;  ///< its token ids (BOS included where the format has one)
  nlohmann::json label;         ///< the value at --label_key, null when no label key is set
  nlohmann::json record;        ///< the whole record (rewards may read any field)
};

/// Where the prompts come from and how they are rendered (OpenRLHF's flag names).
struct PromptOptions {
  std::string prompt_data;          ///< --prompt_data: JSONL file, or builtin:<task>
  std::string input_key = "input";  ///< --input_key: dotted path to a string or chat messages
  std::string label_key;  ///< --label_key: dotted path of the reference answer ("" = none)
  bool apply_chat_template = false;  ///< --apply_chat_template
  /// --input_template (OpenRLHF's), without apply_chat_template: the text is put at "{}"; a
  /// literal backslash-n becomes a newline; "" = the text as is
  std::string input_template;
  int64_t prompt_max_len = 1024;    ///< --prompt_max_len: longer prompts are skipped, counted
  int64_t max_samples = 100000000;  ///< --max_samples: use at most this many prompts
  std::string save_dir;  ///< a builtin task's records are written here (rank 0) for inspection
};

/// OpenRLHF's --input_template: `tmpl` with its first "{}" replaced by `text` and every literal
/// backslash-n a newline (the shell passes "User: {}\nAssistant: " so). Throws rlhf::Error when
/// tmpl has no "{}".
std::string apply_input_template(const std::string& tmpl, const std::string& text);

/// Reads and tokenizes every usable prompt: records in file order, each rendered as chat messages
/// (a string is one user turn; an array of {role, content}) through the model's own chat template
/// with --apply_chat_template, else their contents joined by newlines. Prompts longer than
/// prompt_max_len (or leaving no room under the model's context) are skipped and counted in a
/// warning. Throws rlhf::Error naming the file and line for a record that is not an object, a
/// missing key or label, an empty prompt, or a template that cannot render; and when no prompt
/// is usable.
std::vector<Prompt> load_prompts(const PromptOptions& options, const io::Tokenizer& tokenizer,
                                 const model::ModelConfig& config, int world_rank);

/// The prompts in the order an RL run draws them: position p of the run is prompt
/// order(p / n)[p % n] with a fresh seeded permutation per episode (EpochOrder), the same on
/// every rank and for every rank count.
class PromptSource {
 public:
  /// Throws rlhf::Error for an empty list.
  PromptSource(std::vector<Prompt> prompts, uint64_t seed);
  int64_t size() const { return int64_t(prompts_.size()); }
  /// The prompt at global position pos (>= 0).
  const Prompt& at(int64_t pos);

 private:
  std::vector<Prompt> prompts_;
  EpochOrder order_;
};

}  // namespace rlhf::rl
