#include "io/sft_dataset.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>

#include "core/error.h"
#include "core/strings.h"
#include "io/chat_template.h"
#include "io/jsonl.h"

namespace rlhf::io {

OverlongPolicy overlong_policy_from_string(const std::string& s) {
  if (s == "truncate") return OverlongPolicy::kTruncate;
  if (s == "skip") return OverlongPolicy::kSkip;
  RLHF_FAIL("unknown --truncation policy '{}'\nhint: truncate or skip", s);
}

const char* to_string(OverlongPolicy p) {
  return p == OverlongPolicy::kTruncate ? "truncate" : "skip";
}

std::string SftDatasetStats::summary() const {
  return fmt::format(
      "{} samples ({} truncated, {} skipped of {} read), {} tokens, {} loss tokens{}",
      total - skipped, truncated, skipped, total, tokens, loss_tokens,
      limited ? ", limited by --max_samples" : "");
}

namespace {

// Builder state shared by the JSON formats.
struct JsonBuilder {
  const std::string& path;
  const Tokenizer& tok;
  const SftDatasetOptions& opt;
  SftDataset& ds;
  int64_t skipped_overlong = 0;  // kSkip
  int64_t skipped_prompt = 0;    // prompt fills max_len

  // obj[key], or an error naming the key, its flag and the keys the record has.
  const nlohmann::json& require(const nlohmann::json& obj, const std::string& key, const char* flag,
                                const std::string& where) const {
    if (!obj.contains(key)) {
      std::vector<std::string> keys;
      for (auto it = obj.begin(); it != obj.end(); ++it) keys.push_back("'" + it.key() + "'");
      RLHF_FAIL(
          "{}: missing key '{}' ({})\nhint: the record's keys are {}; choose them with "
          "--input_key / --output_key",
          where, key, flag, keys.empty() ? "none" : fmt::format("{}", fmt::join(keys, ", ")));
    }
    return obj[key];
  }

  std::string field(const nlohmann::json& obj, const std::string& key, const char* flag,
                    const std::string& where) const {
    const nlohmann::json& v = require(obj, key, flag, where);
    RLHF_CHECK(v.is_string(), "{}: key '{}' must be a string, got {} ({})", where, key,
               v.type_name(), flag);
    return v.get<std::string>();
  }

  // --apply_chat_template: the prompt and response texts of the record (OpenRLHF's SFTDataset),
  // and whether the response still needs an EOS.
  void chat_texts(const nlohmann::json& obj, const std::string& where, std::string& prompt,
                  std::string& response, bool& add_eos) const {
    const nlohmann::json& in = require(obj, opt.input_key, "--input_key", where);
    const std::string in_where = fmt::format("{}: key '{}'", where, opt.input_key);
    std::vector<ChatMessage> prompt_msgs = chat_messages_from_json(in, in_where);
    std::vector<ChatMessage> response_msgs;
    if (obj.contains(opt.output_key)) {
      const nlohmann::json& out = obj[opt.output_key];
      if (out.is_string())
        response_msgs.push_back({"assistant", out.get<std::string>()});
      else
        response_msgs =
            chat_messages_from_json(out, fmt::format("{}: key '{}'", where, opt.output_key));
    } else {
      // A whole conversation under --input_key: its last message is the response.
      RLHF_CHECK(in.is_array() && prompt_msgs.size() >= 2,
                 "{}: missing key '{}' (--output_key)\nhint: without a response key, --input_key "
                 "must hold a conversation (chat messages) whose last message is the response",
                 where, opt.output_key);
      response_msgs.push_back(prompt_msgs.back());
      prompt_msgs.pop_back();
    }
    const ChatSplit split =
        render_chat_split(tok, opt.model_type, prompt_msgs, response_msgs, where);
    prompt = split.prompt;
    response = split.response;
    while (!response.empty() && response.back() == '\n') response.pop_back();
    const int32_t eos = tok.eos_id();
    const std::string eos_text = eos >= 0 ? tok.id_to_token(eos) : std::string();
    add_eos = eos_text.empty() || response.size() < eos_text.size() ||
              response.compare(response.size() - eos_text.size(), eos_text.size(), eos_text) != 0;
  }

  // Adds the record; `where` is "file:line" or "file: record i".
  void add(const nlohmann::json& obj, const std::string& where) {
    RLHF_CHECK(obj.is_object(), "{}: expected a JSON object, got {}", where, obj.type_name());
    std::string prompt, response;
    bool add_eos = true;
    if (opt.apply_chat_template) {
      chat_texts(obj, where, prompt, response, add_eos);
    } else {
      prompt = field(obj, opt.input_key, "--input_key", where);
      response = field(obj, opt.output_key, "--output_key", where);
    }
    ++ds.stats.total;
    SftSample s;
    // The chat template writes its own BOS where the model has one.
    s.tokens = tok.encode(prompt, /*add_bos=*/!opt.apply_chat_template, /*add_eos=*/false);
    const int64_t prompt_len = static_cast<int64_t>(s.tokens.size());
    const std::vector<int32_t> r = tok.encode(response, false, add_eos);
    s.tokens.insert(s.tokens.end(), r.begin(), r.end());
    if (static_cast<int64_t>(s.tokens.size()) > opt.max_len) {
      if (opt.overlong == OverlongPolicy::kSkip) {
        ++ds.stats.skipped;
        ++skipped_overlong;
        return;
      }
      if (prompt_len >= opt.max_len) {  // nothing of the response would remain
        ++ds.stats.skipped;
        ++skipped_prompt;
        return;
      }
      s.tokens.resize(static_cast<size_t>(opt.max_len));
      ++ds.stats.truncated;
    }
    s.prompt_len = static_cast<int32_t>(prompt_len);
    ds.stats.tokens += static_cast<int64_t>(s.tokens.size());
    ds.stats.loss_tokens += static_cast<int64_t>(s.tokens.size()) - prompt_len;
    ds.samples.push_back(std::move(s));
  }

  bool full() const { return opt.max_samples >= 0 && ds.stats.total >= opt.max_samples; }

  void check_not_empty() const {
    RLHF_CHECK(ds.stats.total > 0, "{}: no SFT samples: the file holds no JSON records", path);
    RLHF_CHECK(!ds.samples.empty(),
               "{}: no usable SFT sample: all {} were skipped ({} longer than --max_len {} with "
               "--truncation skip, {} whose prompt alone fills --max_len)\nhint: raise --max_len, "
               "or use --truncation truncate",
               path, ds.stats.total, skipped_overlong, opt.max_len, skipped_prompt);
  }
};

std::string lower_extension(const std::string& path) {
  return to_lower_ascii(std::filesystem::path(path).extension().string());
}

bool is_blank_line(std::string_view s) {
  return s.find_first_not_of(" \t\r\f\v") == std::string_view::npos;
}

void build_text(const std::string& path, const Tokenizer& tok, const SftDatasetOptions& opt,
                SftDataset& ds) {
  const std::string text = read_text_file(path);
  // The token stream: BOS doc EOS for every blank-line-separated document.
  std::vector<int32_t> stream;
  std::string doc;
  auto flush_doc = [&] {
    if (doc.empty()) return;
    const std::vector<int32_t> ids = tok.encode(doc, true, true);
    stream.insert(stream.end(), ids.begin(), ids.end());
    doc.clear();
  };
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    std::string_view line(text.data() + pos, end - pos);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (is_blank_line(line)) {
      flush_doc();
    } else {
      if (!doc.empty()) doc += '\n';
      doc += line;
    }
    pos = end + 1;
  }
  flush_doc();
  RLHF_CHECK(!stream.empty(), "{}: no SFT samples: the text file is empty (or only blank lines)",
             path);
  for (size_t start = 0; start < stream.size(); start += static_cast<size_t>(opt.max_len)) {
    if (opt.max_samples >= 0 && ds.stats.total >= opt.max_samples) {
      ds.stats.limited = true;
      break;
    }
    ++ds.stats.total;
    const size_t end = std::min(stream.size(), start + static_cast<size_t>(opt.max_len));
    if (end - start < 2) {  // nothing to predict
      ++ds.stats.skipped;
      continue;
    }
    SftSample s;
    s.tokens.assign(stream.begin() + static_cast<std::ptrdiff_t>(start),
                    stream.begin() + static_cast<std::ptrdiff_t>(end));
    s.prompt_len = 0;
    ds.stats.tokens += static_cast<int64_t>(s.tokens.size());
    ds.stats.loss_tokens += static_cast<int64_t>(s.tokens.size()) - 1;
    ds.samples.push_back(std::move(s));
  }
  RLHF_CHECK(!ds.samples.empty(),
             "{}: no usable SFT sample: the text is a single token\nhint: the file needs at least "
             "one character",
             path);
}

}  // namespace

SftDataset build_sft_dataset(const std::string& path, const Tokenizer& tok,
                             const SftDatasetOptions& opt) {
  RLHF_CHECK(opt.max_len >= 2, "--max_len must be >= 2, got {}", opt.max_len);
  RLHF_CHECK(opt.max_samples == -1 || opt.max_samples >= 1,
             "--max_samples must be >= 1 (or -1 for all), got {}", opt.max_samples);
  RLHF_CHECK(!opt.input_key.empty() && !opt.output_key.empty(),
             "--input_key and --output_key must not be empty");
  std::error_code ec;
  RLHF_CHECK(std::filesystem::exists(path, ec), "cannot open {}: no such file", path);
  RLHF_CHECK(!std::filesystem::is_directory(path, ec), "cannot read {}: it is a directory", path);
  const std::string ext = lower_extension(path);
  RLHF_CHECK(ext != ".gz" && ext != ".bz2" && ext != ".xz" && ext != ".zst",
             "{}: compressed datasets are not supported\nhint: decompress it first (e.g. gunzip "
             "-k {})",
             path, path);

  SftDataset ds;
  bool json_list = false;
  if (ext == ".json") {
    const std::string text = read_text_file(path);
    const size_t first = text.find_first_not_of(" \t\r\n\xEF\xBB\xBF");
    json_list = first != std::string::npos && text[first] == '[';
  }
  if (ext == ".jsonl" || (ext == ".json" && !json_list)) {
    ds.format = "jsonl";
    JsonBuilder b{path, tok, opt, ds};
    JsonlReader reader(path);
    nlohmann::json obj;
    while (true) {
      if (b.full()) {
        // Limited only if something is left to read (a malformed line counts as something).
        try {
          ds.stats.limited = reader.next(obj);
        } catch (const Error&) {
          ds.stats.limited = true;
        }
        break;
      }
      if (!reader.next(obj)) break;
      b.add(obj, fmt::format("{}:{}", path, reader.line()));
    }
    b.check_not_empty();
  } else if (json_list) {
    ds.format = "json";
    const nlohmann::json list = parse_json_file(path);
    RLHF_CHECK(list.is_array(), "{}: expected a JSON list of records", path);
    JsonBuilder b{path, tok, opt, ds};
    for (size_t i = 0; i < list.size(); ++i) {
      if (b.full()) {
        ds.stats.limited = true;
        break;
      }
      b.add(list[i], fmt::format("{}: record {}", path, i + 1));
    }
    b.check_not_empty();
  } else {
    ds.format = "text";
    build_text(path, tok, opt, ds);
  }
  return ds;
}

}  // namespace rlhf::io

namespace rlhf::io {

int64_t sft_loss_tokens(const SftSample& s) {
  const int64_t n = static_cast<int64_t>(s.tokens.size());
  const int64_t first = std::max<int64_t>(s.prompt_len, 1);
  return std::max<int64_t>(0, n - first);
}

TokenBatch collate_sft(const std::vector<SftSample>& samples, const std::vector<int64_t>& indices,
                       int32_t pad_id) {
  RLHF_CHECK(!indices.empty(), "collate_sft: empty micro-batch");
  TokenBatch b;
  b.B = static_cast<int64_t>(indices.size());
  for (int64_t i : indices)
    b.T = std::max<int64_t>(b.T, static_cast<int64_t>(samples.at(size_t(i)).tokens.size()));
  b.tokens.assign(static_cast<size_t>(b.B * b.T), pad_id);
  b.targets.assign(static_cast<size_t>(b.B * b.T), -1);
  for (int64_t r = 0; r < b.B; ++r) {
    const SftSample& s = samples[size_t(indices[size_t(r)])];
    const int64_t n = static_cast<int64_t>(s.tokens.size());
    const int64_t first = std::max<int64_t>(s.prompt_len, 1);
    std::copy(s.tokens.begin(), s.tokens.end(), b.tokens.begin() + r * b.T);
    for (int64_t t = first; t < n; ++t) b.targets[size_t(r * b.T + t - 1)] = s.tokens[size_t(t)];
    b.real_tokens += n;
    b.loss_tokens += std::max<int64_t>(0, n - first);
  }
  return b;
}

}  // namespace rlhf::io
