#include "io/spm_tokenizer.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <queue>
#include <set>

#include "core/error.h"
#include "io/gguf.h"
#include "io/hf_tokenizer.h"
#include "io/text_util.h"

namespace rlhf::io {

namespace {

constexpr int64_t kMaxPieceBytes = 1 << 20;
constexpr const char* kSpaceSymbol = "\xE2\x96\x81";  // U+2581 '▁'

std::string replace_all(std::string s, std::string_view from, std::string_view to) {
  if (from.empty()) return s;
  std::string out;
  size_t i = 0;
  while (true) {
    const size_t j = s.find(from, i);
    if (j == std::string::npos) break;
    out.append(s, i, j - i);
    out.append(to);
    i = j + from.size();
  }
  out.append(s, i, std::string::npos);
  return out;
}

}  // namespace

ScoreTokenizer::ScoreTokenizer(ScoreVocab vocab, std::string kind, std::vector<TokenizerFile> files,
                               std::string label)
    : v_(std::move(vocab)),
      kind_(std::move(kind)),
      label_(std::move(label)),
      files_(std::move(files)) {
  const size_t n = v_.pieces.size();
  RLHF_ASSERT(v_.scores.size() == n && v_.types.size() == n);
  std::fill(std::begin(byte_ids_), std::end(byte_ids_), -1);
  for (size_t i = 0; i < n; ++i) {
    const int32_t id = static_cast<int32_t>(i);
    const std::string& p = v_.pieces[i];
    int byte = -1;
    if (parse_byte_piece(p, &byte) && byte_ids_[byte] < 0) byte_ids_[byte] = id;
    // Normal pieces are what the merges look up; the first id of a duplicated piece wins.
    if (v_.types[i] == TokenType::kNormal || v_.types[i] == TokenType::kUserDefined)
      index_.emplace(p, id);
    if (v_.types[i] == TokenType::kControl || v_.types[i] == TokenType::kUserDefined) {
      if (!p.empty()) specials_.emplace_back(p, id);
    }
  }
  if (kind_ == "llama2c") {
    // llama2.c stores the control pieces as "\n<s>\n" / "\n</s>\n": match the usual spellings.
    for (auto [text, id] : {std::pair<const char*, int32_t>{"<unk>", v_.unk_id},
                            {"<s>", v_.bos_id},
                            {"</s>", v_.eos_id}})
      if (id >= 0 && static_cast<size_t>(id) < n) specials_.emplace_back(text, id);
  }
  std::stable_sort(specials_.begin(), specials_.end(),
                   [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
}

bool ScoreTokenizer::is_special(int32_t id) const {
  if (id < 0 || id >= static_cast<int32_t>(v_.pieces.size())) return false;
  const TokenType t = v_.types[static_cast<size_t>(id)];
  return t == TokenType::kControl || t == TokenType::kUnknown || id == v_.bos_id ||
         id == v_.eos_id || id == v_.pad_id;
}

int32_t ScoreTokenizer::token_to_id(std::string_view token) const {
  for (const auto& [text, id] : specials_)
    if (text == token) return id;
  auto it = index_.find(std::string(token));
  if (it != index_.end()) return it->second;
  // Vocabulary pieces use ' ' for '▁': accept either spelling.
  it = index_.find(replace_all(std::string(token), kSpaceSymbol, " "));
  return it != index_.end() ? it->second : -1;
}

std::string ScoreTokenizer::id_to_token(int32_t id) const {
  RLHF_CHECK(id >= 0 && id < static_cast<int32_t>(v_.pieces.size()),
             "token id {} is outside the vocabulary [0, {})", id, v_.pieces.size());
  return replace_all(v_.pieces[static_cast<size_t>(id)], " ", kSpaceSymbol);
}

void ScoreTokenizer::encode_text(std::string_view text, std::vector<int32_t>& out) const {
  if (text.empty()) return;
  // Symbols: ids, in a doubly linked list over positions.
  std::vector<int32_t> sym;
  std::string buf;
  auto push_piece = [&](std::string_view piece) {
    buf.assign(piece);
    auto it = index_.find(buf);
    if (it != index_.end()) {
      sym.push_back(it->second);
      return;
    }
    for (unsigned char c : piece) {
      if (byte_ids_[c] >= 0)
        sym.push_back(byte_ids_[c]);
      else if (v_.unk_id >= 0)
        sym.push_back(v_.unk_id);
    }
  };
  if (v_.add_space_prefix) push_piece(" ");
  for (size_t i = 0; i < text.size();) {
    const size_t len = utf8_char_len(text, i);
    push_piece(text.substr(i, len));
    i += len;
  }
  const int64_t n = static_cast<int64_t>(sym.size());
  std::vector<int64_t> prev(static_cast<size_t>(n)), next(static_cast<size_t>(n));
  std::vector<std::string> text_of(static_cast<size_t>(n));
  std::vector<bool> alive(static_cast<size_t>(n), true);
  for (int64_t i = 0; i < n; ++i) {
    prev[size_t(i)] = i - 1;
    next[size_t(i)] = i + 1 < n ? i + 1 : -1;
    text_of[size_t(i)] = v_.pieces[size_t(sym[size_t(i)])];
  }
  // Candidate merges: highest score first, then leftmost.
  struct Cand {
    float score;
    int64_t left;
    int32_t id;
    size_t left_len, right_len;  // to detect stale entries
  };
  auto worse = [](const Cand& a, const Cand& b) {
    if (a.score != b.score) return a.score < b.score;
    return a.left > b.left;
  };
  std::priority_queue<Cand, std::vector<Cand>, decltype(worse)> heap(worse);
  auto try_pair = [&](int64_t l) {
    if (l < 0) return;
    const int64_t r = next[size_t(l)];
    if (r < 0) return;
    buf = text_of[size_t(l)];
    buf += text_of[size_t(r)];
    auto it = index_.find(buf);
    if (it == index_.end()) return;
    heap.push(Cand{v_.scores[size_t(it->second)], l, it->second, text_of[size_t(l)].size(),
                   text_of[size_t(r)].size()});
  };
  for (int64_t i = 0; i + 1 < n; ++i) try_pair(i);
  while (!heap.empty()) {
    const Cand c = heap.top();
    heap.pop();
    const int64_t l = c.left;
    if (!alive[size_t(l)]) continue;
    const int64_t r = next[size_t(l)];
    if (r < 0 || text_of[size_t(l)].size() != c.left_len ||
        text_of[size_t(r)].size() != c.right_len)
      continue;  // a neighbour changed since this candidate was pushed
    sym[size_t(l)] = c.id;
    text_of[size_t(l)] += text_of[size_t(r)];
    alive[size_t(r)] = false;
    next[size_t(l)] = next[size_t(r)];
    if (next[size_t(r)] >= 0) prev[size_t(next[size_t(r)])] = l;
    try_pair(prev[size_t(l)]);
    try_pair(l);
  }
  for (int64_t i = 0; i >= 0 && i < n; i = next[size_t(i)]) out.push_back(sym[size_t(i)]);
}

std::vector<int32_t> ScoreTokenizer::encode(std::string_view text, bool add_bos,
                                            bool add_eos) const {
  std::vector<int32_t> out;
  if (add_bos && v_.bos_id >= 0) out.push_back(v_.bos_id);
  for (const TextOrToken& seg : split_on_special_tokens(text, specials_)) {
    if (seg.id >= 0)
      out.push_back(seg.id);
    else
      encode_text(seg.text, out);
  }
  if (add_eos && v_.eos_id >= 0) out.push_back(v_.eos_id);
  return out;
}

std::string ScoreTokenizer::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  std::string out;
  bool first = true;
  for (size_t i = 0; i < ids.size(); ++i) {
    const int32_t id = ids[i];
    RLHF_CHECK(id >= 0 && id < static_cast<int32_t>(v_.pieces.size()),
               "token id {} at position {} is outside the vocabulary [0, {})", id, i,
               v_.pieces.size());
    const std::string& p = v_.pieces[size_t(id)];
    if (is_special(id)) {
      if (skip_special_tokens) continue;
      if (kind_ == "llama2c" && id == v_.bos_id)
        out += "<s>";
      else if (kind_ == "llama2c" && id == v_.eos_id)
        out += "</s>";
      else if (kind_ == "llama2c" && id == v_.unk_id)
        out += "<unk>";
      else
        out += p;
      continue;
    }
    int byte = -1;
    if (parse_byte_piece(p, &byte)) {
      out.push_back(static_cast<char>(byte));
      first = false;
      continue;
    }
    if (first && v_.add_space_prefix && !p.empty() && p[0] == ' ')
      out.append(p, 1, std::string::npos);
    else
      out += p;
    first = false;
  }
  return out;
}

// --- llama2.c tokenizer.bin ------------------------------------------------------------------

ScoreVocab parse_llama2c_tokenizer(const Blob& blob) {
  ByteReader r(blob);
  const int32_t max_len = r.read<int32_t>("max_token_length");
  RLHF_CHECK(max_len > 0 && max_len <= kMaxPieceBytes,
             "{}: not a llama2.c tokenizer or corrupt: max_token_length {} is not in [1, {}]",
             blob.source, max_len, kMaxPieceBytes);
  ScoreVocab v;
  while (!r.at_end()) {
    const float score = r.read<float>("token score");
    const int32_t len = r.read<int32_t>("token length");
    RLHF_CHECK(len >= 0 && len <= max_len,
               "{}: corrupt token {} at byte {}: length {} is not in [0, max_token_length {}]",
               blob.source, v.pieces.size(), r.pos() - 4, len, max_len);
    RLHF_CHECK(std::isfinite(score), "{}: corrupt token {}: score is {}", blob.source,
               v.pieces.size(), score);
    v.pieces.push_back(r.read_string(static_cast<uint64_t>(len), "token bytes"));
    v.scores.push_back(score);
  }
  RLHF_CHECK(v.pieces.size() >= 3,
             "{}: a llama2.c tokenizer needs at least 3 tokens (<unk>, <s>, </s>), found {}",
             blob.source, v.pieces.size());
  v.types.assign(v.pieces.size(), TokenType::kNormal);
  v.types[0] = TokenType::kUnknown;
  v.types[1] = TokenType::kControl;
  v.types[2] = TokenType::kControl;
  for (size_t i = 3; i < v.pieces.size(); ++i) {
    int byte = -1;
    if (parse_byte_piece(v.pieces[i], &byte)) v.types[i] = TokenType::kByte;
  }
  v.unk_id = 0;
  v.bos_id = 1;
  v.eos_id = 2;
  v.pad_id = -1;
  return v;
}

std::unique_ptr<ScoreTokenizer> load_llama2c_tokenizer(const Blob& blob) {
  ScoreVocab v = parse_llama2c_tokenizer(blob);
  const std::string name = std::filesystem::path(blob.source).filename().string();
  const std::string label = fmt::format("llama2.c {} (vocab {})", name, v.pieces.size());
  std::vector<TokenizerFile> files = {
      {name.empty() ? "tokenizer.bin" : name, std::string(blob.view())}};
  return std::make_unique<ScoreTokenizer>(std::move(v), "llama2c", std::move(files), label);
}

// --- GGUF vocabularies -----------------------------------------------------------------------

namespace {

const nlohmann::json* get(const GgufFile& f, const char* key) {
  auto it = f.metadata.find(key);
  return it == f.metadata.end() ? nullptr : &*it;
}

int32_t get_id(const GgufFile& f, const char* key, int32_t def, size_t n) {
  const nlohmann::json* j = get(f, key);
  if (j == nullptr || !j->is_number_integer()) return def;
  const int64_t v = j->get<int64_t>();
  RLHF_CHECK(v >= 0 && static_cast<size_t>(v) < n, "{}: {} = {} is outside the vocabulary [0, {})",
             f.blob.source, key, v, n);
  return static_cast<int32_t>(v);
}

// The vocabulary export_gguf writes for the byte tokenizer: <0x00>..<0xFF> (byte tokens), then
// <s>, </s>, <pad> (control), then only unused padding tokens.
bool is_byte_vocabulary(const nlohmann::json& tokens, const std::vector<TokenType>& types) {
  if (tokens.size() < static_cast<size_t>(ByteTokenizer::kVocabSize)) return false;
  for (size_t i = ByteTokenizer::kVocabSize; i < tokens.size(); ++i)
    if (types[i] != TokenType::kUnused) return false;  // padding rows only
  for (int b = 0; b < 256; ++b)
    if (tokens[size_t(b)] != byte_piece(b) || types[size_t(b)] != TokenType::kByte) return false;
  return tokens[256] == "<s>" && tokens[257] == "</s>" && tokens[258] == "<pad>" &&
         types[256] == TokenType::kControl && types[257] == TokenType::kControl &&
         types[258] == TokenType::kControl;
}

// A tokenizer.json embedded as tokenizer.huggingface.json (written by export_gguf when the
// tokenizer.ggml.* keys cannot express the tokenizer exactly); special token names, add_bos_token
// and the chat template from the tokenizer.ggml.* / tokenizer.chat_template keys.
std::unique_ptr<Tokenizer> gguf_embedded_hf_tokenizer(const GgufFile& f, const std::string& text,
                                                      std::vector<TokenizerFile> files) {
  const std::string src = f.blob.source + ":tokenizer.huggingface.json";
  nlohmann::json tj;
  try {
    tj = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    RLHF_FAIL("{}: malformed JSON: {}", src, e.what());
  }
  const nlohmann::json& tokens = f.metadata.at("tokenizer.ggml.tokens");
  nlohmann::json cfg = nlohmann::json::object();
  for (auto [key, name] :
       {std::pair<const char*, const char*>{"tokenizer.ggml.bos_token_id", "bos_token"},
        {"tokenizer.ggml.eos_token_id", "eos_token"},
        {"tokenizer.ggml.padding_token_id", "pad_token"},
        {"tokenizer.ggml.unknown_token_id", "unk_token"}}) {
    const int32_t id = get_id(f, key, -1, tokens.size());
    if (id >= 0) cfg[name] = tokens[size_t(id)];
  }
  if (const nlohmann::json* b = get(f, "tokenizer.ggml.add_bos_token"); b && b->is_boolean())
    cfg["add_bos_token"] = b->get<bool>();
  if (const nlohmann::json* c = get(f, "tokenizer.chat_template"); c && c->is_string())
    cfg["chat_template"] = *c;
  if (const nlohmann::json* sp = get(f, "tokenizer.rlhf.split_special_tokens");
      sp && sp->is_boolean())
    cfg["split_special_tokens"] = sp->get<bool>();
  return std::make_unique<HfTokenizer>(tj, cfg, std::move(files), src, "gguf");
}

}  // namespace

std::vector<TokenType> gguf_token_types(const GgufFile& f) {
  const std::string& src = f.blob.source;
  const nlohmann::json* tokens = get(f, "tokenizer.ggml.tokens");
  const size_t n = tokens != nullptr && tokens->is_array() ? tokens->size() : 0;
  const nlohmann::json* types = get(f, "tokenizer.ggml.token_type");
  std::vector<TokenType> tt(n, TokenType::kNormal);
  if (types == nullptr) return tt;
  RLHF_CHECK(types->is_array() && types->size() == n,
             "{}: tokenizer.ggml.token_type has {} entries for {} tokens", src,
             types->is_array() ? types->size() : 0, n);
  for (size_t i = 0; i < n; ++i) {
    const auto& x = (*types)[i];
    RLHF_CHECK(x.is_number_integer() && x.get<int64_t>() >= 1 && x.get<int64_t>() <= 6,
               "{}: tokenizer.ggml.token_type[{}] = {} is not a token type (1..6)", src, i,
               x.dump());
    tt[i] = static_cast<TokenType>(x.get<int32_t>());
  }
  return tt;
}

std::unique_ptr<Tokenizer> load_gguf_tokenizer(const GgufFile& f) {
  const std::string& src = f.blob.source;
  const nlohmann::json* tokens = get(f, "tokenizer.ggml.tokens");
  if (tokens == nullptr) return nullptr;
  RLHF_CHECK(tokens->is_array() && !tokens->empty(),
             "{}: tokenizer.ggml.tokens must be a non-empty array of strings", src);
  const size_t n = tokens->size();
  for (const auto& t : *tokens)
    RLHF_CHECK(t.is_string(), "{}: tokenizer.ggml.tokens must hold strings", src);
  const nlohmann::json* model = get(f, "tokenizer.ggml.model");
  const std::string type = model && model->is_string() ? model->get<std::string>() : "llama";
  const std::vector<TokenType> tt = gguf_token_types(f);
  if (is_byte_vocabulary(*tokens, tt)) return std::make_unique<ByteTokenizer>();
  const std::string file = gguf_tokenizer_file(f);
  std::vector<TokenizerFile> files = {{"tokenizer.gguf", file}};
  if (const nlohmann::json* hf = get(f, "tokenizer.huggingface.json"); hf && hf->is_string())
    return gguf_embedded_hf_tokenizer(f, hf->get<std::string>(), std::move(files));
  if (type == "llama") {
    ScoreVocab v;
    v.pieces.reserve(n);
    for (const auto& t : *tokens)
      v.pieces.push_back(replace_all(t.get<std::string>(), kSpaceSymbol, " "));
    v.types = tt;
    const nlohmann::json* scores = get(f, "tokenizer.ggml.scores");
    if (scores != nullptr) {
      RLHF_CHECK(scores->is_array() && scores->size() == n,
                 "{}: tokenizer.ggml.scores has {} entries for {} tokens", src,
                 scores->is_array() ? scores->size() : 0, n);
      for (const auto& s : *scores) {
        RLHF_CHECK(s.is_number(), "{}: tokenizer.ggml.scores must hold numbers", src);
        v.scores.push_back(s.get<float>());
      }
    } else {
      v.scores.assign(n, 0.0f);
    }
    v.unk_id = get_id(f, "tokenizer.ggml.unknown_token_id", 0, n);
    v.bos_id = get_id(f, "tokenizer.ggml.bos_token_id", n > 1 ? 1 : -1, n);
    v.eos_id = get_id(f, "tokenizer.ggml.eos_token_id", n > 2 ? 2 : -1, n);
    v.pad_id = get_id(f, "tokenizer.ggml.padding_token_id", -1, n);
    const nlohmann::json* prefix = get(f, "tokenizer.ggml.add_space_prefix");
    if (prefix != nullptr && prefix->is_boolean()) v.add_space_prefix = prefix->get<bool>();
    if (const nlohmann::json* t = get(f, "tokenizer.chat_template"); t && t->is_string())
      v.chat_template = t->get<std::string>();
    const std::string label = fmt::format("GGUF llama vocabulary (vocab {})", n);
    return std::make_unique<ScoreTokenizer>(std::move(v), "gguf", std::move(files), label);
  }
  if (type == "gpt2") return load_gguf_bpe_tokenizer(f, tt, std::move(files));
  RLHF_FAIL(
      "{}: GGUF tokenizer model '{}' is not supported\nhint: llama (SentencePiece) and gpt2 "
      "(byte-level BPE) are; give another tokenizer with --tokenizer",
      src, type);
}

std::string gguf_tokenizer_file(const GgufFile& f) {
  GgufWriter w;
  copy_gguf_tokenizer_keys(w, f);
  return w.to_bytes();
}

void copy_gguf_tokenizer_keys(GgufWriter& w, const GgufFile& f, const std::set<std::string>& skip) {
  // Re-encode the tokenizer.* keys with their GGUF types.
  for (auto it = f.metadata.begin(); it != f.metadata.end(); ++it) {
    const std::string& key = it.key();
    if (key.rfind("tokenizer.", 0) != 0 || skip.count(key) != 0) continue;
    const nlohmann::json& v = it.value();
    const GgufType t = f.metadata_types.at(key);
    if (v.is_string()) {
      w.add_string(key, v.get<std::string>());
    } else if (v.is_boolean()) {
      w.add_bool(key, v.get<bool>());
    } else if (t == GgufType::kF32 || t == GgufType::kF64) {
      w.add_f32(key, v.get<float>());
    } else if (v.is_number_integer()) {
      if (v.is_number_unsigned() && v.get<uint64_t>() <= UINT32_MAX)
        w.add_u32(key, v.get<uint32_t>());
      else
        w.add_i32(key, v.get<int32_t>());
    } else if (v.is_array()) {
      if (!v.empty() && v[0].is_string()) {
        std::vector<std::string> s;
        for (const auto& x : v) s.push_back(x.is_string() ? x.get<std::string>() : std::string());
        w.add_string_array(key, s);
      } else if (!v.empty() && v[0].is_number_float()) {
        std::vector<float> s;
        for (const auto& x : v) s.push_back(x.is_number() ? x.get<float>() : 0.0f);
        w.add_f32_array(key, s);
      } else {
        std::vector<int32_t> s;
        for (const auto& x : v) s.push_back(x.is_number() ? x.get<int32_t>() : 0);
        w.add_i32_array(key, s);
      }
    }
  }
}

}  // namespace rlhf::io
