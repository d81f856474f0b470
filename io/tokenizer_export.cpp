#include "io/tokenizer_export.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <functional>
#include <optional>
#include <tuple>
#include <unordered_map>

#include "core/error.h"
#include "core/log.h"
#include "io/bytes.h"
#include "io/gguf.h"
#include "io/hf_tokenizer.h"
#include "io/sp_tokenizer.h"
#include "io/spm_tokenizer.h"
#include "io/text_util.h"

namespace rlhf::io {

namespace {

using json = nlohmann::json;

constexpr const char* kSpace = "\xE2\x96\x81";  // U+2581 '▁'

std::string spaces_to_meta(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == ' ')
      out += kSpace;
    else
      out += c;
  }
  return out;
}

json parse(const std::string& text, const std::string& where) {
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    RLHF_FAIL("{}: malformed JSON: {}", where, e.what());
  }
}

// --- score-based (SentencePiece-style) vocabularies ------------------------------------------

// A score-based vocabulary with its Hugging Face token names ('▁' for spaces; llama2.c's
// "\n<s>\n" control pieces as <unk>, <s>, </s>) and the ids that become added tokens.
struct SpmExport {
  ScoreVocab v;
  std::vector<std::string> names;
  std::vector<bool> added;  // matched as a whole in the text (control, user-defined, ...)
};

// The vocabulary of a score-based tokenizer (llama2c, gguf "llama", sentencepiece), or nullopt.
std::optional<SpmExport> spm_export(const Tokenizer& t) {
  SpmExport s;
  if (const auto* st = dynamic_cast<const ScoreTokenizer*>(&t)) {
    s.v = st->vocab();
  } else if (t.kind() == "sentencepiece") {
    s.v = sentencepiece_score_vocab(t);
  } else {
    return std::nullopt;
  }
  const size_t n = s.v.pieces.size();
  s.names.resize(n);
  s.added.assign(n, false);
  for (size_t i = 0; i < n; ++i) {
    s.names[i] = spaces_to_meta(s.v.pieces[i]);
    const TokenType ty = s.v.types[i];
    s.added[i] = ty == TokenType::kControl || ty == TokenType::kUserDefined ||
                 (ty == TokenType::kUnknown && t.kind() == "sentencepiece");
  }
  if (t.kind() == "llama2c") {  // ScoreTokenizer matches these spellings in the text
    for (auto [id, name] : {std::pair<int32_t, const char*>{s.v.unk_id, "<unk>"},
                            {s.v.bos_id, "<s>"},
                            {s.v.eos_id, "</s>"}}) {
      if (id < 0 || size_t(id) >= n) continue;
      s.names[size_t(id)] = name;
      s.added[size_t(id)] = true;
    }
  }
  return s;
}

// Merges derived from the scores as transformers' SentencePieceExtractor does: every split of a
// piece into two pieces (at a UTF-8 character boundary), ordered by (left id, right id) within the
// piece, then by the piece's score, highest first (stable). Only normal and user-defined pieces
// take part: they are the ones the score-based encoder merges.
json spm_merges(const SpmExport& s) {
  std::unordered_map<std::string, int32_t> index;
  for (size_t i = 0; i < s.v.pieces.size(); ++i)
    if (s.v.types[i] == TokenType::kNormal || s.v.types[i] == TokenType::kUserDefined)
      index.emplace(s.v.pieces[i], static_cast<int32_t>(i));
  struct Merge {
    int32_t l, r;
    float score;
  };
  std::vector<Merge> merges;
  for (size_t i = 0; i < s.v.pieces.size(); ++i) {
    const std::string& p = s.v.pieces[i];
    if (index.count(p) == 0 || index.at(p) != static_cast<int32_t>(i)) continue;
    std::vector<Merge> local;
    for (size_t k = utf8_char_len(p, 0); k < p.size(); k += utf8_char_len(p, k)) {
      auto l = index.find(p.substr(0, k)), r = index.find(p.substr(k));
      if (l != index.end() && r != index.end()) local.push_back({l->second, r->second, 0.0f});
    }
    std::sort(local.begin(), local.end(), [](const Merge& a, const Merge& b) {
      return std::tie(a.l, a.r) < std::tie(b.l, b.r);
    });
    for (Merge& m : local) m.score = s.v.scores[i];
    merges.insert(merges.end(), local.begin(), local.end());
  }
  std::stable_sort(merges.begin(), merges.end(),
                   [](const Merge& a, const Merge& b) { return a.score > b.score; });
  json out = json::array();
  for (const Merge& m : merges) out.push_back({s.names[size_t(m.l)], s.names[size_t(m.r)]});
  return out;
}

json added_token(int32_t id, const std::string& content, bool special) {
  return {{"id", id},        {"content", content},  {"single_word", false}, {"lstrip", false},
          {"rstrip", false}, {"normalized", false}, {"special", special}};
}

// TemplateProcessing that puts `prefix` before the text (null for an empty prefix).
json template_processor(const std::vector<int32_t>& prefix,
                        const std::function<std::string(int32_t)>& name) {
  if (prefix.empty()) return nullptr;
  json single = json::array(), pair = json::array(), specials = json::object();
  for (int32_t id : prefix) {
    const std::string n = name(id);
    single.push_back({{"SpecialToken", {{"id", n}, {"type_id", 0}}}});
    pair.push_back({{"SpecialToken", {{"id", n}, {"type_id", 0}}}});
    specials[n] = {{"id", n}, {"ids", {id}}, {"tokens", {n}}};
  }
  single.push_back({{"Sequence", {{"id", "A"}, {"type_id", 0}}}});
  pair.push_back({{"Sequence", {{"id", "A"}, {"type_id", 0}}}});
  pair.push_back({{"Sequence", {{"id", "B"}, {"type_id", 1}}}});
  return {{"type", "TemplateProcessing"},
          {"single", single},
          {"pair", pair},
          {"special_tokens", specials}};
}

json bpe_model(json vocab, json merges, const json& unk, bool byte_fallback, bool fuse_unk) {
  return {{"type", "BPE"},
          {"dropout", nullptr},
          {"unk_token", unk},
          {"continuing_subword_prefix", nullptr},
          {"end_of_word_suffix", nullptr},
          {"fuse_unk", fuse_unk},
          {"byte_fallback", byte_fallback},
          {"ignore_merges", false},
          {"vocab", std::move(vocab)},
          {"merges", std::move(merges)}};
}

json tokenizer_json_skeleton() {
  return {{"version", "1.0"}, {"truncation", nullptr}, {"padding", nullptr}};
}

json spm_tokenizer_json(const SpmExport& s, const std::vector<int32_t>& prefix) {
  json tj = tokenizer_json_skeleton();
  json added = json::array(), vocab = json::object();
  for (size_t i = 0; i < s.names.size(); ++i) {
    if (s.added[i])
      added.push_back(added_token(int32_t(i), s.names[i], s.v.types[i] != TokenType::kUserDefined));
    if (!vocab.contains(s.names[i])) vocab[s.names[i]] = i;
  }
  bool all_bytes = true;
  for (int b = 0; b < 256; ++b) all_bytes = all_bytes && vocab.contains(byte_piece(b));
  tj["added_tokens"] = added;
  json replace = {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", kSpace}};
  json norms = json::array();
  if (s.v.add_space_prefix) norms.push_back({{"type", "Prepend"}, {"prepend", kSpace}});
  norms.push_back(replace);
  tj["normalizer"] = {{"type", "Sequence"}, {"normalizers", norms}};
  tj["pre_tokenizer"] = nullptr;
  tj["post_processor"] =
      template_processor(prefix, [&](int32_t id) { return s.names[size_t(id)]; });
  json decs =
      json::array({{{"type", "Replace"}, {"pattern", {{"String", kSpace}}}, {"content", " "}},
                   {{"type", "ByteFallback"}},
                   {{"type", "Fuse"}}});
  if (s.v.add_space_prefix)
    decs.push_back({{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}});
  tj["decoder"] = {{"type", "Sequence"}, {"decoders", decs}};
  const json unk = s.v.unk_id >= 0 ? json(s.names[size_t(s.v.unk_id)]) : json(nullptr);
  tj["model"] = bpe_model(std::move(vocab), spm_merges(s), unk, all_bytes, true);
  return tj;
}

// The byte tokenizer: <0x00>..<0xFF> reached through byte_fallback, then <s>, </s>, <pad>.
json byte_tokenizer_json() {
  json tj = tokenizer_json_skeleton();
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_piece(b)] = b;
  const char* names[] = {"<s>", "</s>", "<pad>"};
  json added = json::array();
  for (int i = 0; i < 3; ++i) {
    vocab[names[i]] = 256 + i;
    added.push_back(added_token(256 + i, names[i], true));
  }
  tj["added_tokens"] = added;
  tj["normalizer"] = nullptr;
  tj["pre_tokenizer"] = nullptr;
  tj["post_processor"] =
      template_processor({ByteTokenizer::kBos}, [](int32_t) { return std::string("<s>"); });
  tj["decoder"] = {{"type", "Sequence"},
                   {"decoders", json::array({{{"type", "ByteFallback"}}, {{"type", "Fuse"}}})}};
  tj["model"] = bpe_model(std::move(vocab), json::array(), nullptr, true, false);
  return tj;
}

// tokenizer_config.json for `t` (names of ids through `name`).
json tokenizer_config(const Tokenizer& t, int64_t max_len,
                      const std::function<std::string(int32_t)>& name, int32_t unk_id) {
  const std::vector<int32_t> prefix = t.encode("", true, false);
  const auto token = [&](int32_t id) { return id >= 0 ? json(name(id)) : json(nullptr); };
  json cfg = {{"tokenizer_class", "PreTrainedTokenizerFast"},
              {"bos_token", token(t.bos_id())},
              {"eos_token", token(t.eos_id())},
              {"pad_token", token(t.pad_id())},
              {"unk_token", token(unk_id)},
              {"add_bos_token", prefix.size() == 1 && prefix[0] == t.bos_id()},
              {"add_eos_token", false},
              {"clean_up_tokenization_spaces", false},
              {"model_max_length", max_len}};
  if (!t.chat_template().empty()) cfg["chat_template"] = t.chat_template();
  return cfg;
}

// The files of an HfTokenizer (kind "hf": its own; kind "gguf": the JSON its GGUF vocabulary
// builds) and the tokenizer.json as parsed.
std::vector<TokenizerFile> hf_files_of_hf(const Tokenizer& t, int64_t max_len) {
  const auto name = [&](int32_t id) { return t.id_to_token(id); };
  std::vector<TokenizerFile> out;
  if (t.kind() == "hf") {
    bool has_config = false;
    for (const TokenizerFile& f : t.files()) {
      if (f.name == "tokenizer_config.json" || f.name == "special_tokens_map.json") {
        has_config = has_config || f.name == "tokenizer_config.json";
        out.push_back(f);
      } else {
        out.push_back({"tokenizer.json", f.bytes});  // any *.json name: the tokenizer itself
      }
    }
    if (!has_config)
      out.push_back({"tokenizer_config.json", tokenizer_config(t, max_len, name, -1).dump(2)});
    return out;
  }
  // kind "gguf": the byte-level BPE of the stored tokenizer.gguf.
  const std::vector<TokenizerFile> files = t.files();
  RLHF_CHECK(files.size() == 1, "tokenizer {} (kind gguf): expected one stored file", t.name());
  const GgufFile g = parse_gguf(blob_from_string(files[0].bytes, files[0].name));
  json tj, cfg;
  if (g.metadata.contains("tokenizer.huggingface.json") &&
      g.metadata.at("tokenizer.huggingface.json").is_string()) {
    tj = parse(g.metadata.at("tokenizer.huggingface.json").get<std::string>(),
               files[0].name + ":tokenizer.huggingface.json");
  } else {
    gguf_bpe_tokenizer_json(g, gguf_token_types(g), &tj, &cfg);
    json merged = tokenizer_json_skeleton();
    merged.update(tj);
    tj = std::move(merged);
    tj["post_processor"] = template_processor(t.encode("", true, false), name);
    // The library's ByteLevel components need every field.
    for (json& p : tj["pre_tokenizer"]["pretokenizers"])
      if (p["type"] == "ByteLevel") p["trim_offsets"] = true;
    tj["decoder"] = {{"type", "ByteLevel"},
                     {"add_prefix_space", true},
                     {"trim_offsets", true},
                     {"use_regex", true}};
    tj["normalizer"] = nullptr;
    json& m = tj["model"];
    for (const char* k :
         {"dropout", "unk_token", "continuing_subword_prefix", "end_of_word_suffix"})
      m[k] = nullptr;
    m["fuse_unk"] = false;
  }
  out.push_back({"tokenizer.json", tj.dump()});
  out.push_back({"tokenizer_config.json", tokenizer_config(t, max_len, name, -1).dump(2)});
  return out;
}

// Differences between `t` and `u` on the probe text (with and without BOS/EOS): "" when none.
std::string probe_difference(const Tokenizer& t, const Tokenizer& u) {
  const std::string text = tokenizer_probe_text(t);
  for (bool special : {false, true}) {
    const std::vector<int32_t> a = t.encode(text, special, special);
    const std::vector<int32_t> b = u.encode(text, special, special);
    if (a == b) continue;
    size_t k = 0;
    while (k < a.size() && k < b.size() && a[k] == b[k]) ++k;
    return fmt::format("{} ids vs {}, first difference at token {} ({} vs {})", a.size(), b.size(),
                       k, k < a.size() ? std::to_string(a[k]) : "end",
                       k < b.size() ? std::to_string(b[k]) : "end");
  }
  return "";
}

}  // namespace

std::string tokenizer_probe_text(const Tokenizer& t) {
  std::string text =
      "Once upon a time, there was a little girl named Lily.  She liked\tto   play!\n\n"
      "Numbers: 0 7 42 1234567 3.14159, -5 and 2024-11-25. Caf\xC3\xA9 na\xC3\xAFve "
      "\xC3\xBC\x62\x65r \xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E \xF0\x9F\x99\x82 don't "
      "I'll we've  end ";
  const auto name = [&](int32_t id) -> std::string {
    if (id < 0 || id >= t.vocab_size()) return "";
    const std::string n = t.id_to_token(id);
    return n.find('\n') == std::string::npos ? n : "";  // llama2.c's "\n<s>\n"
  };
  text += name(t.bos_id()) + "after bos " + name(t.eos_id()) + " after eos";
  return text;
}

std::vector<TokenizerFile> hf_tokenizer_files(const Tokenizer& t, int64_t model_max_length) {
  const std::string kind = t.kind();
  std::vector<TokenizerFile> out;
  if (kind == "byte") {
    json cfg = tokenizer_config(
        t, model_max_length, [&](int32_t id) { return t.decode(std::span(&id, 1), false); }, -1);
    cfg["split_special_tokens"] = true;
    out = {{"tokenizer.json", byte_tokenizer_json().dump()},
           {"tokenizer_config.json", cfg.dump(2)}};
  } else if (dynamic_cast<const HfTokenizer*>(&t) != nullptr) {
    out = hf_files_of_hf(t, model_max_length);
  } else if (std::optional<SpmExport> s = spm_export(t)) {
    const auto name = [&](int32_t id) { return s->names[size_t(id)]; };
    out = {{"tokenizer.json", spm_tokenizer_json(*s, t.encode("", true, false)).dump()},
           {"tokenizer_config.json",
            tokenizer_config(t, model_max_length, name, s->v.unk_id).dump(2)}};
  } else {
    RLHF_FAIL("tokenizer {} (kind '{}') cannot be written as Hugging Face tokenizer files",
              t.name(), kind);
  }
  const std::unique_ptr<HfTokenizer> back = hf_tokenizer_from_files(out, "exported tokenizer");
  const std::string diff = probe_difference(t, *back);
  RLHF_CHECK(diff.empty(),
             "tokenizer {} (kind '{}'): the tokenizer.json written for it tokenizes the probe "
             "text differently ({}); refusing to write a tokenizer that disagrees with rlhf's",
             t.name(), kind, diff);
  return out;
}

// --- GGUF ------------------------------------------------------------------------------------

namespace {

// The tokenizer.* keys of `t` as a GGUF writer's content; `embed_json` adds
// tokenizer.huggingface.json (the exact tokenizer for rlhf).
void gguf_tokenizer_keys(GgufWriter& w, const Tokenizer& t, int64_t vocab, bool embed_json);

void pad_vocab(std::vector<std::string>& tokens, std::vector<float>& scores,
               std::vector<int32_t>& types, int64_t vocab) {
  for (int64_t i = static_cast<int64_t>(tokens.size()); i < vocab; ++i) {
    tokens.push_back(fmt::format("<rlhf_unused_{}>", i));
    scores.push_back(0.0f);
    types.push_back(static_cast<int32_t>(TokenType::kUnused));
  }
}

void add_ids(GgufWriter& w, int32_t bos, int32_t eos, int32_t unk, int32_t pad) {
  if (bos >= 0) w.add_u32("tokenizer.ggml.bos_token_id", static_cast<uint32_t>(bos));
  if (eos >= 0) w.add_u32("tokenizer.ggml.eos_token_id", static_cast<uint32_t>(eos));
  if (unk >= 0) w.add_u32("tokenizer.ggml.unknown_token_id", static_cast<uint32_t>(unk));
  if (pad >= 0) w.add_u32("tokenizer.ggml.padding_token_id", static_cast<uint32_t>(pad));
}

// tokenizer.ggml.pre of a byte-level tokenizer.json's pre-tokenizer (the split regex rlhf and
// llama.cpp select by this name), "gpt-2" when none of the known ones matches.
std::string bpe_pre_name(const json& tj) {
  const std::string pre = tj.contains("pre_tokenizer") ? tj["pre_tokenizer"].dump() : "";
  if (pre.find("\\\\p{N}{1,3}") != std::string::npos) return "llama-bpe";
  if (pre.find("[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?\\\\p{L}+|\\\\p{N}|") != std::string::npos)
    return "qwen2";
  if (pre.find("\"individual_digits\":true") != std::string::npos) return "smollm";
  return "gpt-2";
}

void gguf_keys_of_hf(GgufWriter& w, const Tokenizer& t, int64_t vocab) {
  json tj;
  for (const TokenizerFile& f : t.files())
    if (f.name != "tokenizer_config.json" && f.name != "special_tokens_map.json")
      tj = parse(f.bytes, f.name);
  const auto* h = dynamic_cast<const HfTokenizer*>(&t);
  std::vector<std::string> tokens;
  std::vector<float> scores;
  std::vector<int32_t> types;
  std::unordered_map<std::string, bool> added;  // content → special
  if (tj.contains("added_tokens") && tj["added_tokens"].is_array())
    for (const json& a : tj["added_tokens"])
      added[a.value("content", "")] = a.value("special", false);
  // Merge ranks give the score-based form: a piece made by merge r scores -r.
  std::unordered_map<std::string, float> rank_score;
  std::vector<std::string> merges;
  const json& mg = tj["model"].value("merges", json::array());
  for (size_t r = 0; r < mg.size(); ++r) {
    std::string a, b;
    if (mg[r].is_string()) {
      const std::string s = mg[r].get<std::string>();
      a = s.substr(0, s.find(' '));
      b = s.substr(s.find(' ') + 1);
    } else {
      a = mg[r][0].get<std::string>();
      b = mg[r][1].get<std::string>();
    }
    merges.push_back(a + " " + b);
    rank_score.emplace(a + b, -static_cast<float>(r));
  }
  for (int32_t i = 0; i < static_cast<int32_t>(t.vocab_size()); ++i) {
    const std::string tok = t.id_to_token(i);
    tokens.push_back(tok);
    int dummy = 0;
    TokenType ty = TokenType::kNormal;
    auto it = added.find(tok);
    if (it != added.end())
      ty = it->second ? TokenType::kControl : TokenType::kUserDefined;
    else if (!h->byte_level() && parse_byte_piece(tok, &dummy))
      ty = TokenType::kByte;
    if (tok.empty()) ty = TokenType::kUnused;
    types.push_back(static_cast<int32_t>(ty));
    auto rs = rank_score.find(tok);
    scores.push_back(rs != rank_score.end() ? rs->second : 0.0f);
  }
  pad_vocab(tokens, scores, types, vocab);
  const std::vector<int32_t> prefix = t.encode("", true, false);
  if (h->byte_level()) {
    w.add_string("tokenizer.ggml.model", "gpt2");
    w.add_string("tokenizer.ggml.pre", bpe_pre_name(tj));
    w.add_string_array("tokenizer.ggml.tokens", tokens);
    w.add_i32_array("tokenizer.ggml.token_type", types);
    w.add_string_array("tokenizer.ggml.merges", merges);
  } else {
    w.add_string("tokenizer.ggml.model", "llama");
    w.add_string_array("tokenizer.ggml.tokens", tokens);
    w.add_f32_array("tokenizer.ggml.scores", scores);
    w.add_i32_array("tokenizer.ggml.token_type", types);
  }
  const json& unk_j = tj["model"]["unk_token"];
  const std::string unk = unk_j.is_string() ? unk_j.get<std::string>() : "";
  add_ids(w, t.bos_id(), t.eos_id(), unk.empty() ? -1 : t.token_to_id(unk), t.pad_id());
  w.add_bool("tokenizer.ggml.add_bos_token", prefix.size() == 1 && prefix[0] == t.bos_id());
  w.add_bool("tokenizer.ggml.add_eos_token", false);
}

void gguf_tokenizer_keys(GgufWriter& w, const Tokenizer& t, int64_t vocab, bool embed_json) {
  if (t.kind() == "byte") {
    std::vector<std::string> tokens;
    std::vector<float> scores(ByteTokenizer::kVocabSize, 0.0f);
    std::vector<int32_t> types;
    for (int b = 0; b < 256; ++b) {
      tokens.push_back(byte_piece(b));
      types.push_back(static_cast<int32_t>(TokenType::kByte));
    }
    for (const char* s : {"<s>", "</s>", "<pad>"}) {
      tokens.push_back(s);
      types.push_back(static_cast<int32_t>(TokenType::kControl));
    }
    pad_vocab(tokens, scores, types, vocab);
    w.add_string("tokenizer.ggml.model", "llama");
    w.add_string_array("tokenizer.ggml.tokens", tokens);
    w.add_f32_array("tokenizer.ggml.scores", scores);
    w.add_i32_array("tokenizer.ggml.token_type", types);
    add_ids(w, ByteTokenizer::kBos, ByteTokenizer::kEos, -1, ByteTokenizer::kPad);
    w.add_bool("tokenizer.ggml.add_bos_token", true);
    w.add_bool("tokenizer.ggml.add_eos_token", false);
    w.add_bool("tokenizer.ggml.add_space_prefix", false);
  } else if (t.kind() == "gguf" && dynamic_cast<const HfTokenizer*>(&t) != nullptr) {
    // A GGUF byte-level vocabulary: its own keys, as they were, the arrays padded to `vocab`.
    const TokenizerFile f = t.files().at(0);
    const GgufFile g = parse_gguf(blob_from_string(f.bytes, f.name));
    const char* kTokens = "tokenizer.ggml.tokens";
    const char* kTypes = "tokenizer.ggml.token_type";
    const char* kScores = "tokenizer.ggml.scores";
    copy_gguf_tokenizer_keys(w, g, {kTokens, kTypes, kScores});
    std::vector<std::string> tokens = g.metadata.at(kTokens).get<std::vector<std::string>>();
    std::vector<float> scores(tokens.size(), 0.0f);
    if (g.metadata.contains(kScores)) scores = g.metadata.at(kScores).get<std::vector<float>>();
    std::vector<int32_t> types;
    for (TokenType ty : gguf_token_types(g)) types.push_back(static_cast<int32_t>(ty));
    const bool has_scores = g.metadata.contains(kScores);
    pad_vocab(tokens, scores, types, vocab);
    w.add_string_array(kTokens, tokens);
    w.add_i32_array(kTypes, types);
    if (has_scores) w.add_f32_array(kScores, scores);
    return;
  } else if (dynamic_cast<const HfTokenizer*>(&t) != nullptr) {
    gguf_keys_of_hf(w, t, vocab);
  } else if (std::optional<SpmExport> s = spm_export(t)) {
    std::vector<std::string> tokens = s->names;
    std::vector<float> scores = s->v.scores;
    std::vector<int32_t> types;
    for (TokenType ty : s->v.types) types.push_back(static_cast<int32_t>(ty));
    pad_vocab(tokens, scores, types, vocab);
    w.add_string("tokenizer.ggml.model", "llama");
    w.add_string_array("tokenizer.ggml.tokens", tokens);
    w.add_f32_array("tokenizer.ggml.scores", scores);
    w.add_i32_array("tokenizer.ggml.token_type", types);
    add_ids(w, s->v.bos_id, s->v.eos_id, s->v.unk_id, s->v.pad_id);
    w.add_bool("tokenizer.ggml.add_bos_token", true);
    w.add_bool("tokenizer.ggml.add_eos_token", false);
    w.add_bool("tokenizer.ggml.add_space_prefix", s->v.add_space_prefix);
  } else {
    RLHF_FAIL("tokenizer {} (kind '{}') cannot be written as GGUF tokenizer metadata", t.name(),
              t.kind());
  }
  if (!t.chat_template().empty()) w.add_string("tokenizer.chat_template", t.chat_template());
  if (embed_json) {
    for (const TokenizerFile& f : hf_tokenizer_files(t, 0)) {
      if (f.name == "tokenizer.json") w.add_string("tokenizer.huggingface.json", f.bytes);
      if (f.name == "tokenizer_config.json" &&
          parse(f.bytes, f.name).value("split_special_tokens", false))
        w.add_bool("tokenizer.rlhf.split_special_tokens", true);
    }
  }
}

}  // namespace

void write_gguf_tokenizer(GgufWriter& w, const Tokenizer& t, int64_t model_vocab_size) {
  // Write the keys to a tokenizer-only GGUF first and read it back as rlhf will.
  GgufWriter probe;
  gguf_tokenizer_keys(probe, t, model_vocab_size, false);
  const GgufFile g = parse_gguf(blob_from_string(probe.to_bytes(), "tokenizer.ggml.*"));
  const std::unique_ptr<Tokenizer> back = load_gguf_tokenizer(g);
  const std::string diff = back ? probe_difference(t, *back) : "no tokenizer";
  if (!diff.empty())
    LOG_WARN(
        "tokenizer {} (kind '{}'): the tokenizer.ggml.* keys do not reproduce it exactly ({}); "
        "the GGUF also carries its tokenizer.json as tokenizer.huggingface.json, which rlhf "
        "reads (llama.cpp may tokenize differently)",
        t.name(), t.kind(), diff);
  gguf_tokenizer_keys(w, t, model_vocab_size, !diff.empty());
}

}  // namespace rlhf::io
