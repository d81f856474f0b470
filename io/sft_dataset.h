// SFT samples from prompt/response JSONL (or a JSON list) or from plain text (pre-training style).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "io/tokenizer.h"

namespace rlhf::io {

/// One SFT sequence. The loss is on tokens[t] for t >= max(prompt_len, 1) (the response and its
/// EOS); prompt_len = 0 means the loss is on every token that has a predecessor, i.e. t >= 1.
struct SftSample {
  std::vector<int32_t> tokens;
  int32_t prompt_len = 0;
};

/// What to do with a prompt+response sample longer than max_len tokens.
enum class OverlongPolicy {
  kTruncate,  ///< keep the first max_len tokens (a sample whose response is cut entirely is
              ///< skipped)
  kSkip,      ///< drop the sample
};
/// "truncate" | "skip"; throws rlhf::Error otherwise.
OverlongPolicy overlong_policy_from_string(const std::string& s);
const char* to_string(OverlongPolicy p);

/// Options, named after OpenRLHF's flags (--input_key, --output_key, --max_len, --max_samples).
struct SftDatasetOptions {
  std::string input_key = "input";    ///< JSON key of the prompt
  std::string output_key = "output";  ///< JSON key of the response
  int64_t max_len = 2048;             ///< tokens per sample (>= 2); text windows have this length
  OverlongPolicy overlong = OverlongPolicy::kTruncate;
  int64_t max_samples = -1;  ///< read at most this many records / text windows; -1 = all
  /// --apply_chat_template: render JSON records with the tokenizer's chat template (see
  /// build_sft_dataset); plain text files are not affected.
  bool apply_chat_template = false;
  std::string model_type;  ///< picks the built-in chat format of a tokenizer without a template
};

/// Counts of one build. total = records read (JSON) or windows cut (text);
/// samples used = total - skipped.
struct SftDatasetStats {
  int64_t total = 0;
  int64_t truncated = 0;  ///< cut to max_len and kept
  int64_t skipped = 0;    ///< dropped (too long under kSkip, response cut entirely, 1-token window)
  int64_t tokens = 0;     ///< Σ tokens of the kept samples
  int64_t loss_tokens = 0;  ///< Σ tokens that carry a loss
  bool limited = false;     ///< reading stopped at max_samples
  /// "N samples (T truncated, S skipped of R read), X tokens, Y loss tokens[, limited by
  /// --max_samples]".
  std::string summary() const;
};

struct SftDataset {
  std::vector<SftSample> samples;
  SftDatasetStats stats;
  std::string format;  ///< "jsonl" | "json" | "text"
};

/// Builds SFT samples from `path`:
///  - `.jsonl` (or `.json` not starting with '['): one object per line with string values at
///    input_key (prompt) and output_key (response); tokens = BOS + enc(prompt) + enc(response) +
///    EOS, prompt_len = 1 + |enc(prompt)|;
///    with apply_chat_template, as OpenRLHF's SFTDataset: the input (a string = one user turn, or
///    chat messages) rendered with the generation prompt is the prompt, and the response is the
///    rest of render(input + output) (output: a string = one assistant turn, or chat messages);
///    a record without output_key whose input is a conversation takes its last message as the
///    response. tokens = enc(prompt) + enc(response, trailing newlines dropped) + EOS unless the
///    response already ends with the EOS token (no BOS added: templates write their own);
///    prompt_len = |enc(prompt)|;
///  - `.json` holding a list of such objects: the same, record by record;
///  - anything else: plain text. Documents are separated by blank lines; the stream is
///    BOS doc1 EOS BOS doc2 EOS ... cut into consecutive windows of max_len tokens (the last may
///    be shorter; a 1-token remainder is skipped), prompt_len = 0.
/// Errors (rlhf::Error, one line + hint): missing file, malformed JSON (file:line), a record that
/// is not an object, missing key (which key, which line), non-string value, compressed input,
/// bad options, a template that cannot render a record, and an empty result (saying why: empty
/// file, or every sample skipped).
SftDataset build_sft_dataset(const std::string& path, const Tokenizer& tokenizer,
                             const SftDatasetOptions& options);

}  // namespace rlhf::io

namespace rlhf::io {

/// A right-padded micro-batch for next-token training: tokens (B, T) int32 (pad_id after each
/// sample's end), targets (B, T) int32 with targets[b, t] = tokens[b, t+1] where token t+1 is a
/// loss token (t+1 >= max(prompt_len, 1) and inside the sample), else −1. T = the longest sample.
struct TokenBatch {
  std::vector<int32_t> tokens, targets;
  int64_t B = 0, T = 0;
  int64_t real_tokens = 0;  ///< non-padding tokens
  int64_t loss_tokens = 0;  ///< targets >= 0
};

/// Collates samples[indices[i]] into a TokenBatch. Throws rlhf::Error if indices is empty.
TokenBatch collate_sft(const std::vector<SftSample>& samples, const std::vector<int64_t>& indices,
                       int32_t pad_id);

/// Loss tokens sample s contributes (the number of targets >= 0 collate_sft gives it).
int64_t sft_loss_tokens(const SftSample& s);

}  // namespace rlhf::io
