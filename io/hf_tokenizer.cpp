#include "io/hf_tokenizer.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <queue>

#include "core/error.h"
#include "io/file_util.h"
#include "io/gguf.h"
#include "io/regex.h"
#include "io/text_util.h"

namespace rlhf::io {

const char* const kGpt2SplitPattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

namespace {

constexpr const char* kLlama3SplitPattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr const char* kQwen2SplitPattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr int64_t kMaxVocab = int64_t{1} << 24;

using json = nlohmann::json;

// GPT-2's reversible byte → printable character map (bytes_to_unicode): printable Latin-1 bytes
// map to themselves, the other 68 to U+0100 onwards, in byte order.
struct ByteMap {
  std::string to_char[256];                   // UTF-8 of the character for each byte
  std::unordered_map<uint32_t, int> to_byte;  // code point → byte
  ByteMap() {
    int extra = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
      const uint32_t cp =
          printable ? static_cast<uint32_t>(b) : 256u + static_cast<uint32_t>(extra++);
      std::string s;
      if (cp < 0x80) {
        s.push_back(static_cast<char>(cp));
      } else {
        s.push_back(static_cast<char>(0xC0 | (cp >> 6)));
        s.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
      }
      to_char[b] = s;
      to_byte[cp] = b;
    }
  }
};
const ByteMap& byte_map() {
  static const ByteMap m;
  return m;
}

// Decodes one UTF-8 character at s[i] (len from utf8_char_len) to its code point; an invalid byte
// gives 0x110000 + byte (never in the byte map).
uint32_t code_point(std::string_view s, size_t i, size_t len) {
  const auto u = [&](size_t k) {
    return static_cast<uint32_t>(static_cast<unsigned char>(s[i + k]));
  };
  switch (len) {
    case 2:
      return ((u(0) & 0x1F) << 6) | (u(1) & 0x3F);
    case 3:
      return ((u(0) & 0x0F) << 12) | ((u(1) & 0x3F) << 6) | (u(2) & 0x3F);
    case 4:
      return ((u(0) & 0x07) << 18) | ((u(1) & 0x3F) << 12) | ((u(2) & 0x3F) << 6) | (u(3) & 0x3F);
    default:
      return u(0) < 0x80 ? u(0) : 0x110000 + u(0);
  }
}

std::string replace_all(std::string_view s, std::string_view from, std::string_view to) {
  if (from.empty()) return std::string(s);
  std::string out;
  size_t i = 0;
  while (true) {
    const size_t j = s.find(from, i);
    if (j == std::string_view::npos) break;
    out.append(s.substr(i, j - i));
    out.append(to);
    i = j + from.size();
  }
  out.append(s.substr(i));
  return out;
}

bool is_space(unsigned char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}
bool is_word(unsigned char c) {
  return std::isalnum(c) || c == '_' || c >= 0x80;
}

const json& member(const json& j, const char* key, const std::string& where) {
  RLHF_CHECK(j.is_object() && j.contains(key), "{}: missing '{}'", where, key);
  return j.at(key);
}
std::string str_member(const json& j, const char* key, const std::string& where,
                       const std::string& def = "") {
  if (!j.is_object() || !j.contains(key) || j.at(key).is_null()) return def;
  RLHF_CHECK(j.at(key).is_string(), "{}: '{}' must be a string", where, key);
  return j.at(key).get<std::string>();
}
bool bool_member(const json& j, const char* key, bool def) {
  if (!j.is_object() || !j.contains(key) || !j.at(key).is_boolean()) return def;
  return j.at(key).get<bool>();
}

// "<s>" or {"content": "<s>", ...} or null → the token text ("" for none).
std::string token_name(const json& j) {
  if (j.is_string()) return j.get<std::string>();
  if (j.is_object() && j.contains("content") && j.at("content").is_string())
    return j.at("content").get<std::string>();
  return "";
}

enum class Behavior { kIsolated, kRemoved, kMergedWithPrevious, kMergedWithNext, kContiguous };

Behavior behavior_from(const std::string& s, const std::string& where) {
  if (s == "Isolated") return Behavior::kIsolated;
  if (s == "Removed") return Behavior::kRemoved;
  if (s == "MergedWithPrevious") return Behavior::kMergedWithPrevious;
  if (s == "MergedWithNext") return Behavior::kMergedWithNext;
  if (s == "Contiguous") return Behavior::kContiguous;
  RLHF_FAIL("{}: split behavior '{}' is not supported", where, s);
}

// A pre-token: its text and whether it starts at offset 0 of the original input.
struct Piece {
  std::string text;
  bool at_start = false;
};

// Splits `p` at the delimiter ranges `matches` (sorted, non-overlapping) with HF's behaviours.
void split_piece(const Piece& p, const std::vector<std::pair<size_t, size_t>>& matches,
                 Behavior behavior, bool invert, std::vector<Piece>& out) {
  // Full partition of the text: (begin, end, is_match).
  struct Part {
    size_t b, e;
    bool m;
  };
  std::vector<Part> parts;
  size_t pos = 0;
  for (auto [b, e] : matches) {
    if (b > pos) parts.push_back({pos, b, invert});
    parts.push_back({b, e, !invert});
    pos = e;
  }
  if (pos < p.text.size()) parts.push_back({pos, p.text.size(), invert});
  std::vector<Part> merged;
  switch (behavior) {
    case Behavior::kIsolated:
      merged = parts;
      break;
    case Behavior::kRemoved:
      for (const Part& x : parts)
        if (!x.m) merged.push_back(x);
      break;
    case Behavior::kContiguous: {
      bool prev = false;
      for (const Part& x : parts) {
        if (x.m && prev && !merged.empty())
          merged.back().e = x.e;
        else
          merged.push_back(x);
        prev = x.m;
      }
      break;
    }
    case Behavior::kMergedWithPrevious: {
      bool prev = false;
      for (const Part& x : parts) {
        if (x.m && !prev && !merged.empty())
          merged.back().e = x.e;
        else
          merged.push_back(x);
        prev = x.m;
      }
      break;
    }
    case Behavior::kMergedWithNext: {
      bool prev = false;
      for (auto it = parts.rbegin(); it != parts.rend(); ++it) {
        if (it->m && !prev && !merged.empty())
          merged.back().b = it->b;
        else
          merged.push_back(*it);
        prev = it->m;
      }
      std::reverse(merged.begin(), merged.end());
      break;
    }
  }
  for (const Part& x : merged) {
    if (x.e <= x.b) continue;
    out.push_back({p.text.substr(x.b, x.e - x.b), p.at_start && x.b == 0});
  }
}

}  // namespace

// --- implementation state ----------------------------------------------------------------------

struct HfTokenizer::Impl {
  struct NormStep {
    enum Kind { kPrepend, kReplace, kIdentity, kStrip } kind;
    std::string a, b;
    bool left = false, right = false;
  };
  struct PreStep {
    enum Kind { kByteLevel, kSplit, kMetaspace } kind;
    bool add_prefix_space = false;
    std::shared_ptr<Regex> re;  // Split, Digits, ByteLevel with use_regex
    Behavior behavior = Behavior::kIsolated;
    bool invert = false;
    std::string replacement;                // Metaspace
    std::string prepend_scheme = "always";  // Metaspace
    bool split = true;                      // Metaspace
  };
  struct DecStep {
    enum Kind { kByteLevel, kReplace, kByteFallback, kFuse, kStrip, kMetaspace } kind;
    std::string a, b;
    int64_t start = 0, stop = 0;
    bool prepend = true;
  };
  struct Added {
    std::string content, match;
    int32_t id = -1;
    bool special = false, lstrip = false, rstrip = false, normalized = false, single_word = false;
  };

  std::string source;
  std::unordered_map<std::string, int32_t> vocab;
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merges;  // (a, b) → (rank, new id)
  bool byte_fallback = false, fuse_unk = false, ignore_merges = false;
  int32_t unk_id = -1;
  int32_t byte_ids[256];
  std::vector<NormStep> norm;
  std::vector<PreStep> pre;
  std::vector<DecStep> dec;
  bool has_decoder = false;
  std::vector<Added> added_raw, added_norm;  // longest match first
  std::unordered_map<std::string, int32_t> added_index;
  std::unordered_set<int32_t> special_ids;
  std::vector<int32_t> prefix, suffix;
  bool have_template = false;

  static uint64_t key(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }

  std::string normalize(std::string_view s) const {
    std::string out(s);
    for (const NormStep& n : norm) {
      switch (n.kind) {
        case NormStep::kPrepend:
          if (!out.empty()) out = n.a + out;
          break;
        case NormStep::kReplace:
          out = replace_all(out, n.a, n.b);
          break;
        case NormStep::kStrip: {
          size_t b = 0, e = out.size();
          if (n.left)
            while (b < e && is_space(static_cast<unsigned char>(out[b]))) ++b;
          if (n.right)
            while (e > b && is_space(static_cast<unsigned char>(out[e - 1]))) --e;
          out = out.substr(b, e - b);
          break;
        }
        case NormStep::kIdentity:
          break;
      }
    }
    return out;
  }

  // Splits `text` on the added tokens `list` (leftmost, then longest); segments carry their offset.
  struct Seg {
    std::string_view text;
    int32_t id;
    size_t offset;
  };
  std::vector<Seg> split_added(std::string_view text, const std::vector<Added>& list) const {
    std::vector<Seg> out;
    if (list.empty()) {
      if (!text.empty()) out.push_back({text, -1, 0});
      return out;
    }
    size_t start = 0, i = 0;
    while (i < text.size()) {
      const Added* hit = nullptr;
      for (const Added& a : list) {
        if (a.match.empty() || text.compare(i, a.match.size(), a.match) != 0) continue;
        if (a.single_word) {
          const bool left_ok = i == 0 || !is_word(static_cast<unsigned char>(text[i - 1]));
          const size_t e = i + a.match.size();
          const bool right_ok = e >= text.size() || !is_word(static_cast<unsigned char>(text[e]));
          if (!left_ok || !right_ok) continue;
        }
        hit = &a;
        break;
      }
      if (hit == nullptr) {
        ++i;
        continue;
      }
      size_t b = i, e = i + hit->match.size();
      if (hit->lstrip)
        while (b > start && is_space(static_cast<unsigned char>(text[b - 1]))) --b;
      if (hit->rstrip)
        while (e < text.size() && is_space(static_cast<unsigned char>(text[e]))) ++e;
      if (b > start) out.push_back({text.substr(start, b - start), -1, start});
      out.push_back({text.substr(b, e - b), hit->id, b});
      i = start = e;
    }
    if (start < text.size()) out.push_back({text.substr(start), -1, start});
    return out;
  }

  std::vector<Piece> pretokenize(std::string text, bool at_start) const {
    std::vector<Piece> pieces = {{std::move(text), at_start}};
    for (const PreStep& st : pre) {
      std::vector<Piece> next;
      for (Piece& p : pieces) {
        switch (st.kind) {
          case PreStep::kByteLevel: {
            if (st.add_prefix_space && (p.text.empty() || p.text[0] != ' ')) p.text = " " + p.text;
            std::vector<Piece> split;
            if (st.re) {
              std::vector<std::pair<size_t, size_t>> m;
              st.re->for_each_match(p.text, [&](size_t b, size_t e) { m.emplace_back(b, e); });
              split_piece(p, m, Behavior::kIsolated, false, split);
            } else {
              split.push_back(p);
            }
            for (Piece& s : split) {
              std::string mapped;
              for (unsigned char c : s.text) mapped += byte_map().to_char[c];
              next.push_back({std::move(mapped), s.at_start});
            }
            break;
          }
          case PreStep::kSplit: {
            std::vector<std::pair<size_t, size_t>> m;
            st.re->for_each_match(p.text, [&](size_t b, size_t e) { m.emplace_back(b, e); });
            split_piece(p, m, st.behavior, st.invert, next);
            break;
          }
          case PreStep::kMetaspace: {
            Piece q{replace_all(p.text, " ", st.replacement), p.at_start};
            const bool starts = q.text.rfind(st.replacement, 0) == 0;
            if (!starts &&
                (st.prepend_scheme == "always" || (st.prepend_scheme == "first" && q.at_start)))
              q.text = st.replacement + q.text;
            if (!st.split) {
              next.push_back(std::move(q));
              break;
            }
            std::vector<std::pair<size_t, size_t>> m;
            for (size_t k = q.text.find(st.replacement); k != std::string::npos;
                 k = q.text.find(st.replacement, k + st.replacement.size()))
              m.emplace_back(k, k + st.replacement.size());
            split_piece(q, m, Behavior::kMergedWithNext, false, next);
            break;
          }
        }
      }
      pieces = std::move(next);
    }
    return pieces;
  }

  void bpe(std::string_view word, std::vector<int32_t>& out) const {
    if (word.empty()) return;
    if (ignore_merges) {
      auto it = vocab.find(std::string(word));
      if (it != vocab.end()) {
        out.push_back(it->second);
        return;
      }
    }
    std::vector<int32_t> sym;
    int32_t pending_unk = -1;
    std::string buf;
    for (size_t i = 0; i < word.size();) {
      const size_t len = utf8_char_len(word, i);
      buf.assign(word.substr(i, len));
      i += len;
      auto it = vocab.find(buf);
      if (it != vocab.end()) {
        if (pending_unk >= 0) sym.push_back(pending_unk), pending_unk = -1;
        sym.push_back(it->second);
        continue;
      }
      if (byte_fallback) {
        bool all = true;
        for (unsigned char c : buf) all = all && byte_ids[c] >= 0;
        if (all) {
          if (pending_unk >= 0) sym.push_back(pending_unk), pending_unk = -1;
          for (unsigned char c : buf) sym.push_back(byte_ids[c]);
          continue;
        }
      }
      if (unk_id >= 0) {
        if (pending_unk >= 0 && !fuse_unk) sym.push_back(pending_unk);
        pending_unk = unk_id;
      }
      // Without an unknown token the character is dropped, as the library does.
    }
    if (pending_unk >= 0) sym.push_back(pending_unk);
    const int64_t n = static_cast<int64_t>(sym.size());
    std::vector<int64_t> prev(static_cast<size_t>(n)), next(static_cast<size_t>(n));
    std::vector<bool> alive(static_cast<size_t>(n), true);
    for (int64_t i = 0; i < n; ++i) {
      prev[size_t(i)] = i - 1;
      next[size_t(i)] = i + 1 < n ? i + 1 : -1;
    }
    struct Cand {
      int32_t rank;
      int64_t pos;
      int32_t new_id;
    };
    auto worse = [](const Cand& a, const Cand& b) {
      return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos;
    };
    std::priority_queue<Cand, std::vector<Cand>, decltype(worse)> heap(worse);
    auto push = [&](int64_t l) {
      if (l < 0 || next[size_t(l)] < 0) return;
      auto it = merges.find(key(sym[size_t(l)], sym[size_t(next[size_t(l)])]));
      if (it != merges.end()) heap.push(Cand{it->second.first, l, it->second.second});
    };
    for (int64_t i = 0; i + 1 < n; ++i) push(i);
    while (!heap.empty()) {
      const Cand c = heap.top();
      heap.pop();
      if (!alive[size_t(c.pos)] || next[size_t(c.pos)] < 0) continue;
      const int64_t r = next[size_t(c.pos)];
      auto it = merges.find(key(sym[size_t(c.pos)], sym[size_t(r)]));
      if (it == merges.end() || it->second.second != c.new_id) continue;  // stale entry
      sym[size_t(c.pos)] = c.new_id;
      alive[size_t(r)] = false;
      next[size_t(c.pos)] = next[size_t(r)];
      if (next[size_t(r)] >= 0) prev[size_t(next[size_t(r)])] = c.pos;
      push(prev[size_t(c.pos)]);
      push(c.pos);
    }
    for (int64_t i = 0; i >= 0 && i < n; i = next[size_t(i)]) out.push_back(sym[size_t(i)]);
  }
};

// --- construction ------------------------------------------------------------------------------

HfTokenizer::~HfTokenizer() = default;

HfTokenizer::HfTokenizer(const nlohmann::json& tj, const nlohmann::json& cfg,
                         std::vector<TokenizerFile> files, std::string source, std::string kind)
    : impl_(std::make_unique<Impl>()), kind_(std::move(kind)), files_(std::move(files)) {
  Impl& m = *impl_;
  m.source = source;
  const std::string& src = source;
  try {
    RLHF_CHECK(tj.is_object(), "{}: not a tokenizer.json object", src);
    // --- model
    const json& model = member(tj, "model", src);
    const std::string mtype = str_member(model, "type", src + ": model", "BPE");
    RLHF_CHECK(mtype == "BPE",
               "{}: tokenizer model type '{}' is not supported (BPE is)\nhint: give a "
               "SentencePiece tokenizer.model with --tokenizer instead",
               src, mtype);
    RLHF_CHECK(str_member(model, "continuing_subword_prefix", src).empty() &&
                   str_member(model, "end_of_word_suffix", src).empty(),
               "{}: BPE with continuing_subword_prefix / end_of_word_suffix is not supported", src);
    m.byte_fallback = bool_member(model, "byte_fallback", false);
    m.fuse_unk = bool_member(model, "fuse_unk", false);
    m.ignore_merges = bool_member(model, "ignore_merges", false);
    const json& vocab = member(model, "vocab", src + ": model");
    RLHF_CHECK(vocab.is_object(), "{}: model.vocab must be an object", src);
    int64_t max_id = -1;
    const auto check_id = [&](const json& v, const std::string& tok) {
      RLHF_CHECK(v.is_number_integer() && v.get<int64_t>() >= 0 && v.get<int64_t>() < kMaxVocab,
                 "{}: token '{}' has an invalid id {}", src, tok, v.dump());
      return static_cast<int32_t>(v.get<int64_t>());
    };
    for (auto it = vocab.begin(); it != vocab.end(); ++it) {
      const int32_t id = check_id(it.value(), it.key());
      m.vocab.emplace(it.key(), id);
      max_id = std::max<int64_t>(max_id, id);
    }
    // --- added tokens
    std::vector<Impl::Added> added;
    if (tj.contains("added_tokens") && !tj.at("added_tokens").is_null()) {
      const json& at = tj.at("added_tokens");
      RLHF_CHECK(at.is_array(), "{}: added_tokens must be an array", src);
      for (const json& a : at) {
        Impl::Added x;
        x.content = str_member(a, "content", src + ": added token");
        x.id = check_id(member(a, "id", src + ": added token"), x.content);
        x.special = bool_member(a, "special", false);
        x.lstrip = bool_member(a, "lstrip", false);
        x.rstrip = bool_member(a, "rstrip", false);
        x.normalized = bool_member(a, "normalized", !x.special);
        x.single_word = bool_member(a, "single_word", false);
        max_id = std::max<int64_t>(max_id, x.id);
        added.push_back(std::move(x));
      }
    }
    const int64_t count = static_cast<int64_t>(m.vocab.size() + added.size());
    RLHF_CHECK(max_id >= 0, "{}: empty vocabulary", src);
    RLHF_CHECK(max_id < 4 * count + 1024, "{}: corrupt vocabulary: largest id {} for {} tokens",
               src, max_id, count);
    tokens_.assign(static_cast<size_t>(max_id + 1), std::string());
    for (const auto& [tok, id] : m.vocab) tokens_[size_t(id)] = tok;
    for (const auto& a : added) tokens_[size_t(a.id)] = a.content;
    std::fill(std::begin(m.byte_ids), std::end(m.byte_ids), -1);
    for (int b = 0; b < 256; ++b) {
      auto it = m.vocab.find(byte_piece(b));
      if (it != m.vocab.end()) m.byte_ids[b] = it->second;
    }
    const std::string unk = str_member(model, "unk_token", src);
    if (!unk.empty()) {
      auto it = m.vocab.find(unk);
      RLHF_CHECK(it != m.vocab.end(), "{}: unk_token '{}' is not in the vocabulary", src, unk);
      m.unk_id = it->second;
    }
    // --- merges
    if (model.contains("merges") && !model.at("merges").is_null()) {
      const json& merges = model.at("merges");
      RLHF_CHECK(merges.is_array(), "{}: model.merges must be an array", src);
      int32_t rank = 0;
      for (const json& mg : merges) {
        std::string a, b;
        if (mg.is_string()) {
          const std::string s = mg.get<std::string>();
          const size_t sp = s.find(' ');
          RLHF_CHECK(sp != std::string::npos && s.find(' ', sp + 1) == std::string::npos,
                     "{}: merge {} is not two tokens separated by one space", src, rank);
          a = s.substr(0, sp);
          b = s.substr(sp + 1);
        } else {
          RLHF_CHECK(mg.is_array() && mg.size() == 2 && mg[0].is_string() && mg[1].is_string(),
                     "{}: merge {} must be \"a b\" or [a, b]", src, rank);
          a = mg[0].get<std::string>();
          b = mg[1].get<std::string>();
        }
        auto ia = m.vocab.find(a), ib = m.vocab.find(b), iab = m.vocab.find(a + b);
        RLHF_CHECK(ia != m.vocab.end() && ib != m.vocab.end() && iab != m.vocab.end(),
                   "{}: merge {} ('{}' + '{}') refers to a token outside the vocabulary", src, rank,
                   a, b);
        m.merges.emplace(Impl::key(ia->second, ib->second), std::make_pair(rank, iab->second));
        ++rank;
      }
    }
    // --- normalizer
    std::function<void(const json&)> add_norm = [&](const json& n) {
      if (n.is_null()) return;
      const std::string t = str_member(n, "type", src + ": normalizer");
      if (t == "Sequence") {
        const json& list = member(n, "normalizers", src + ": normalizer");
        RLHF_CHECK(list.is_array(), "{}: normalizers must be an array", src);
        for (const json& x : list) add_norm(x);
      } else if (t == "Prepend") {
        m.norm.push_back({Impl::NormStep::kPrepend, str_member(n, "prepend", src), ""});
      } else if (t == "Replace") {
        const json& p = member(n, "pattern", src + ": Replace normalizer");
        RLHF_CHECK(p.is_object() && p.contains("String"),
                   "{}: only string patterns are supported in Replace normalizers", src);
        m.norm.push_back({Impl::NormStep::kReplace, str_member(p, "String", src),
                          str_member(n, "content", src)});
      } else if (t == "NFC") {
        m.norm.push_back({Impl::NormStep::kIdentity, "", ""});
      } else if (t == "Strip") {
        Impl::NormStep s{Impl::NormStep::kStrip, "", ""};
        s.left = bool_member(n, "strip_left", true);
        s.right = bool_member(n, "strip_right", true);
        m.norm.push_back(s);
      } else {
        RLHF_FAIL("{}: normalizer '{}' is not supported", src, t);
      }
    };
    if (tj.contains("normalizer")) add_norm(tj.at("normalizer"));
    // --- pre-tokenizer
    std::function<void(const json&)> add_pre = [&](const json& p) {
      if (p.is_null()) return;
      const std::string t = str_member(p, "type", src + ": pre_tokenizer");
      Impl::PreStep st{};
      if (t == "Sequence") {
        const json& list = member(p, "pretokenizers", src + ": pre_tokenizer");
        RLHF_CHECK(list.is_array(), "{}: pretokenizers must be an array", src);
        for (const json& x : list) add_pre(x);
        return;
      } else if (t == "ByteLevel") {
        st.kind = Impl::PreStep::kByteLevel;
        st.add_prefix_space = bool_member(p, "add_prefix_space", false);
        if (bool_member(p, "use_regex", true))
          st.re = std::make_shared<Regex>(kGpt2SplitPattern, src);
        byte_level_ = true;
      } else if (t == "Split") {
        st.kind = Impl::PreStep::kSplit;
        const json& pat = member(p, "pattern", src + ": Split");
        if (pat.is_object() && pat.contains("Regex"))
          st.re = std::make_shared<Regex>(str_member(pat, "Regex", src), src);
        else if (pat.is_object() && pat.contains("String"))
          st.re = std::make_shared<Regex>(regex_escape(str_member(pat, "String", src)), src);
        else
          RLHF_FAIL("{}: Split pattern must be {{\"Regex\": ...}} or {{\"String\": ...}}", src);
        st.behavior = behavior_from(str_member(p, "behavior", src, "Isolated"), src);
        st.invert = bool_member(p, "invert", false);
      } else if (t == "Metaspace") {
        st.kind = Impl::PreStep::kMetaspace;
        st.replacement = str_member(p, "replacement", src, "\xE2\x96\x81");
        RLHF_CHECK(!st.replacement.empty(), "{}: empty Metaspace replacement", src);
        if (p.contains("prepend_scheme"))
          st.prepend_scheme = str_member(p, "prepend_scheme", src, "always");
        else
          st.prepend_scheme = bool_member(p, "add_prefix_space", true) ? "always" : "never";
        RLHF_CHECK(st.prepend_scheme == "always" || st.prepend_scheme == "first" ||
                       st.prepend_scheme == "never",
                   "{}: unknown Metaspace prepend_scheme '{}'", src, st.prepend_scheme);
        st.split = bool_member(p, "split", true);
      } else if (t == "Digits") {
        st.kind = Impl::PreStep::kSplit;
        const bool individual = bool_member(p, "individual_digits", false);
        st.re = std::make_shared<Regex>(individual ? R"(\p{N})" : R"(\p{N}+)", src);
        st.behavior = Behavior::kIsolated;
      } else {
        RLHF_FAIL("{}: pre-tokenizer '{}' is not supported", src, t);
      }
      m.pre.push_back(std::move(st));
    };
    if (tj.contains("pre_tokenizer")) add_pre(tj.at("pre_tokenizer"));
    // --- decoder
    std::function<void(const json&)> add_dec = [&](const json& d) {
      if (d.is_null()) return;
      m.has_decoder = true;
      const std::string t = str_member(d, "type", src + ": decoder");
      Impl::DecStep st{};
      if (t == "Sequence") {
        const json& list = member(d, "decoders", src + ": decoder");
        RLHF_CHECK(list.is_array(), "{}: decoders must be an array", src);
        for (const json& x : list) add_dec(x);
        return;
      } else if (t == "ByteLevel") {
        st.kind = Impl::DecStep::kByteLevel;
      } else if (t == "Replace") {
        const json& p = member(d, "pattern", src + ": Replace decoder");
        RLHF_CHECK(p.is_object() && p.contains("String"),
                   "{}: only string patterns are supported in Replace decoders", src);
        st.kind = Impl::DecStep::kReplace;
        st.a = str_member(p, "String", src);
        st.b = str_member(d, "content", src);
      } else if (t == "ByteFallback") {
        st.kind = Impl::DecStep::kByteFallback;
      } else if (t == "Fuse") {
        st.kind = Impl::DecStep::kFuse;
      } else if (t == "Strip") {
        st.kind = Impl::DecStep::kStrip;
        st.a = str_member(d, "content", src, " ");
        const json& s = member(d, "start", src + ": Strip decoder");
        const json& e = member(d, "stop", src + ": Strip decoder");
        RLHF_CHECK(s.is_number_unsigned() && e.is_number_unsigned() && s.get<uint64_t>() < 1024 &&
                       e.get<uint64_t>() < 1024,
                   "{}: Strip decoder start/stop must be small non-negative integers", src);
        st.start = s.get<int64_t>();
        st.stop = e.get<int64_t>();
      } else if (t == "Metaspace") {
        st.kind = Impl::DecStep::kMetaspace;
        st.a = str_member(d, "replacement", src, "\xE2\x96\x81");
        if (d.contains("prepend_scheme"))
          st.prepend = str_member(d, "prepend_scheme", src, "always") != "never";
        else
          st.prepend = bool_member(d, "add_prefix_space", true);
      } else {
        RLHF_FAIL("{}: decoder '{}' is not supported", src, t);
      }
      m.dec.push_back(std::move(st));
    };
    if (tj.contains("decoder")) add_dec(tj.at("decoder"));
    // --- added tokens: match strings (normalized ones in their normalized form)
    for (Impl::Added& a : added) {
      m.added_index[a.content] = a.id;
      if (a.special) m.special_ids.insert(a.id);
      if (a.normalized) {
        a.match = m.normalize(a.content);
        m.added_norm.push_back(a);
      } else {
        a.match = a.content;
        m.added_raw.push_back(a);
      }
    }
    auto longest = [](const Impl::Added& x, const Impl::Added& y) {
      return x.match.size() > y.match.size();
    };
    std::stable_sort(m.added_raw.begin(), m.added_raw.end(), longest);
    std::stable_sort(m.added_norm.begin(), m.added_norm.end(), longest);
    // --- post-processor
    std::function<void(const json&)> add_post = [&](const json& p) {
      if (p.is_null()) return;
      const std::string t = str_member(p, "type", src + ": post_processor");
      if (t == "Sequence") {
        const json& list = member(p, "processors", src + ": post_processor");
        RLHF_CHECK(list.is_array(), "{}: processors must be an array", src);
        for (const json& x : list) add_post(x);
      } else if (t == "ByteLevel") {
        // offsets only
      } else if (t == "TemplateProcessing") {
        const json& single = member(p, "single", src + ": TemplateProcessing");
        const json& specials =
            p.contains("special_tokens") ? p.at("special_tokens") : json::object();
        RLHF_CHECK(single.is_array(), "{}: TemplateProcessing.single must be an array", src);
        m.prefix.clear();
        m.suffix.clear();
        bool seen_a = false;
        for (const json& item : single) {
          if (item.is_object() && item.contains("Sequence")) {
            seen_a = true;
            continue;
          }
          const json& sp = member(item, "SpecialToken", src + ": TemplateProcessing item");
          const std::string name = str_member(sp, "id", src);
          RLHF_CHECK(specials.is_object() && specials.contains(name),
                     "{}: TemplateProcessing uses '{}', which is not in its special_tokens", src,
                     name);
          const json& ids = member(specials.at(name), "ids", src + ": special token " + name);
          RLHF_CHECK(ids.is_array(), "{}: special token '{}' ids must be an array", src, name);
          for (const json& id : ids) {
            RLHF_CHECK(id.is_number_integer() && id.get<int64_t>() >= 0 &&
                           id.get<int64_t>() < static_cast<int64_t>(tokens_.size()),
                       "{}: special token '{}' has an id outside the vocabulary", src, name);
            (seen_a ? m.suffix : m.prefix).push_back(id.get<int32_t>());
          }
        }
        m.have_template = true;
      } else {
        RLHF_FAIL("{}: post-processor '{}' is not supported", src, t);
      }
    };
    if (tj.contains("post_processor")) add_post(tj.at("post_processor"));
    // --- special tokens from tokenizer_config.json / special_tokens_map.json
    auto id_of = [&](const std::string& name) -> int32_t {
      if (name.empty()) return -1;
      auto it = m.added_index.find(name);
      if (it != m.added_index.end()) return it->second;
      auto jt = m.vocab.find(name);
      return jt != m.vocab.end() ? jt->second : -1;
    };
    const json cfg_obj = cfg.is_object() ? cfg : json::object();
    const int32_t cfg_bos =
        cfg_obj.contains("bos_token") ? id_of(token_name(cfg_obj.at("bos_token"))) : -1;
    const int32_t cfg_eos =
        cfg_obj.contains("eos_token") ? id_of(token_name(cfg_obj.at("eos_token"))) : -1;
    const int32_t cfg_pad =
        cfg_obj.contains("pad_token") ? id_of(token_name(cfg_obj.at("pad_token"))) : -1;
    bos_id_ = !m.prefix.empty() ? m.prefix.front() : cfg_bos;
    if (!m.have_template && cfg_bos >= 0 && bool_member(cfg_obj, "add_bos_token", false))
      m.prefix = {cfg_bos};
    eos_id_ = cfg_eos >= 0 ? cfg_eos : (!m.suffix.empty() ? m.suffix.back() : -1);
    pad_id_ = cfg_pad >= 0 ? cfg_pad : m.unk_id >= 0 ? m.unk_id : eos_id_ >= 0 ? eos_id_ : 0;
    for (int32_t id : {bos_id_, eos_id_, cfg_pad, m.unk_id})
      if (id >= 0) m.special_ids.insert(id);
    // transformers' split_special_tokens: special added tokens written in the text are not
    // matched (the text is tokenized as it is); non-special added tokens still are.
    if (bool_member(cfg_obj, "split_special_tokens", false)) {
      const auto special = [](const Impl::Added& a) { return a.special; };
      std::erase_if(m.added_raw, special);
      std::erase_if(m.added_norm, special);
    }
    if (cfg_obj.contains("chat_template")) {
      const json& ct = cfg_obj.at("chat_template");
      if (ct.is_string()) {
        chat_template_ = ct.get<std::string>();
      } else if (ct.is_array()) {
        for (const json& x : ct)
          if (x.is_object() && x.contains("template") && x.at("template").is_string() &&
              (chat_template_.empty() || str_member(x, "name", src) == "default"))
            chat_template_ = x.at("template").get<std::string>();
      }
    }
  } catch (const json::exception& e) {
    RLHF_FAIL("{}: corrupt tokenizer: {}", src, e.what());
  }
  const std::string base = std::filesystem::path(src).filename().string();
  label_ = fmt::format("{} BPE {} (vocab {})", byte_level_ ? "byte-level" : "SentencePiece-style",
                       base, tokens_.size());
}

// --- encode / decode -----------------------------------------------------------------------------

std::vector<int32_t> HfTokenizer::encode(std::string_view text, bool add_bos, bool add_eos) const {
  const Impl& m = *impl_;
  std::vector<int32_t> out;
  if (add_bos) out.insert(out.end(), m.prefix.begin(), m.prefix.end());
  for (const Impl::Seg& s1 : m.split_added(text, m.added_raw)) {
    if (s1.id >= 0) {
      out.push_back(s1.id);
      continue;
    }
    const std::string norm = m.normalize(s1.text);
    for (const Impl::Seg& s2 : m.split_added(norm, m.added_norm)) {
      if (s2.id >= 0) {
        out.push_back(s2.id);
        continue;
      }
      const bool at_start = s1.offset == 0 && s2.offset == 0;
      for (const Piece& p : m.pretokenize(std::string(s2.text), at_start)) m.bpe(p.text, out);
    }
  }
  if (add_eos) {
    if (!m.suffix.empty())
      out.insert(out.end(), m.suffix.begin(), m.suffix.end());
    else if (eos_id_ >= 0)
      out.push_back(eos_id_);
  }
  return out;
}

std::string HfTokenizer::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  const Impl& m = *impl_;
  std::vector<std::string> toks;
  toks.reserve(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    const int32_t id = ids[i];
    RLHF_CHECK(id >= 0 && id < static_cast<int32_t>(tokens_.size()),
               "token id {} at position {} is outside the vocabulary [0, {})", id, i,
               tokens_.size());
    if (skip_special_tokens && is_special(id)) continue;
    toks.push_back(tokens_[size_t(id)]);
  }
  if (!m.has_decoder) return fmt::format("{}", fmt::join(toks, " "));
  for (const Impl::DecStep& st : m.dec) {
    switch (st.kind) {
      case Impl::DecStep::kByteLevel: {
        std::string all;
        for (const std::string& t : toks) {
          std::string bytes;
          bool ok = true;
          for (size_t i = 0; i < t.size() && ok;) {
            const size_t len = utf8_char_len(t, i);
            auto it = byte_map().to_byte.find(code_point(t, i, len));
            if (it == byte_map().to_byte.end())
              ok = false;
            else
              bytes.push_back(static_cast<char>(it->second));
            i += len;
          }
          all += ok ? bytes : t;
        }
        toks = {all};
        break;
      }
      case Impl::DecStep::kReplace:
        for (std::string& t : toks) t = replace_all(t, st.a, st.b);
        break;
      case Impl::DecStep::kByteFallback: {
        std::vector<std::string> next;
        std::string bytes;
        bool in_bytes = false;
        for (const std::string& t : toks) {
          int b = -1;
          if (parse_byte_piece(t, &b)) {
            bytes.push_back(static_cast<char>(b));
            in_bytes = true;
            continue;
          }
          if (in_bytes) next.push_back(std::move(bytes)), bytes.clear(), in_bytes = false;
          next.push_back(t);
        }
        if (in_bytes) next.push_back(std::move(bytes));
        toks = std::move(next);
        break;
      }
      case Impl::DecStep::kFuse: {
        std::string all;
        for (const std::string& t : toks) all += t;
        toks = {all};
        break;
      }
      case Impl::DecStep::kStrip:
        for (std::string& t : toks) {
          size_t b = 0, e = t.size();
          for (int64_t k = 0; k < st.start && b < e && t.compare(b, st.a.size(), st.a) == 0; ++k)
            b += st.a.size();
          for (int64_t k = 0; k < st.stop && e >= b + st.a.size() &&
                              t.compare(e - st.a.size(), st.a.size(), st.a) == 0;
               ++k)
            e -= st.a.size();
          t = t.substr(b, e - b);
        }
        break;
      case Impl::DecStep::kMetaspace:
        for (size_t i = 0; i < toks.size(); ++i)
          toks[i] = replace_all(toks[i], st.a, i == 0 && st.prepend ? "" : " ");
        break;
    }
  }
  std::string out;
  for (const std::string& t : toks) out += t;
  return out;
}

bool HfTokenizer::is_special(int32_t id) const {
  return impl_->special_ids.count(id) > 0;
}

int32_t HfTokenizer::token_to_id(std::string_view token) const {
  const std::string t(token);
  auto it = impl_->added_index.find(t);
  if (it != impl_->added_index.end()) return it->second;
  auto jt = impl_->vocab.find(t);
  return jt != impl_->vocab.end() ? jt->second : -1;
}

std::string HfTokenizer::id_to_token(int32_t id) const {
  RLHF_CHECK(id >= 0 && id < static_cast<int32_t>(tokens_.size()),
             "token id {} is outside the vocabulary [0, {})", id, tokens_.size());
  return tokens_[size_t(id)];
}

// --- loading -----------------------------------------------------------------------------------

namespace {

json parse_json_text(const std::string& text, const std::string& source) {
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    RLHF_FAIL("{}: malformed JSON: {}", source, e.what());
  }
}

// tokenizer_config.json with special_tokens_map.json's entries filled in where it lacks them.
json merged_config(const std::string& config_text, const std::string& map_text,
                   const std::string& where) {
  json cfg = config_text.empty() ? json::object()
                                 : parse_json_text(config_text, where + "/tokenizer_config.json");
  if (!cfg.is_object()) cfg = json::object();
  if (!map_text.empty()) {
    const json m = parse_json_text(map_text, where + "/special_tokens_map.json");
    if (m.is_object())
      for (auto it = m.begin(); it != m.end(); ++it)
        if (!cfg.contains(it.key()) || cfg.at(it.key()).is_null()) cfg[it.key()] = it.value();
  }
  return cfg;
}

}  // namespace

std::unique_ptr<HfTokenizer> hf_tokenizer_from_files(const std::vector<TokenizerFile>& files,
                                                     const std::string& source) {
  const TokenizerFile* tok = nullptr;
  std::string config, map;
  for (const TokenizerFile& f : files) {
    if (f.name == "tokenizer_config.json")
      config = f.bytes;
    else if (f.name == "special_tokens_map.json")
      map = f.bytes;
    else if (f.name.size() >= 5 && f.name.compare(f.name.size() - 5, 5, ".json") == 0)
      tok = &f;
  }
  RLHF_CHECK(tok != nullptr, "{}: no tokenizer.json among the tokenizer files", source);
  const json tj = parse_json_text(tok->bytes, source + "/" + tok->name);
  return std::make_unique<HfTokenizer>(tj, merged_config(config, map, source), files,
                                       source + "/" + tok->name);
}

std::unique_ptr<HfTokenizer> load_hf_tokenizer(const std::string& path) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::path(path).parent_path();
  std::vector<TokenizerFile> files = {{fs::path(path).filename().string(), read_binary_file(path)}};
  for (const char* extra : {"tokenizer_config.json", "special_tokens_map.json"}) {
    const fs::path p = dir / extra;
    if (fs::is_regular_file(p)) files.push_back({extra, read_binary_file(p.string())});
  }
  std::string config, map;
  for (const auto& f : files) {
    if (f.name == "tokenizer_config.json") config = f.bytes;
    if (f.name == "special_tokens_map.json") map = f.bytes;
  }
  const json tj = parse_json_text(files[0].bytes, path);
  return std::make_unique<HfTokenizer>(tj, merged_config(config, map, dir.string()),
                                       std::move(files), path);
}

void gguf_bpe_tokenizer_json(const GgufFile& f, const std::vector<TokenType>& types,
                             nlohmann::json* tokenizer_json, nlohmann::json* config_json) {
  const std::string& src = f.blob.source;
  const json& tokens = f.metadata.at("tokenizer.ggml.tokens");
  json tj = json::object();
  json vocab = json::object();
  json added = json::array();
  for (size_t i = 0; i < tokens.size(); ++i) {
    const std::string& t = tokens[i].get_ref<const std::string&>();
    if (types[i] == TokenType::kControl || types[i] == TokenType::kUserDefined) {
      added.push_back({{"id", i},
                       {"content", t},
                       {"special", types[i] == TokenType::kControl},
                       {"normalized", false},
                       {"lstrip", false},
                       {"rstrip", false},
                       {"single_word", false}});
    }
    if (!vocab.contains(t)) vocab[t] = i;
  }
  json merges = json::array();
  if (f.metadata.contains("tokenizer.ggml.merges")) {
    const json& mg = f.metadata.at("tokenizer.ggml.merges");
    RLHF_CHECK(mg.is_array(), "{}: tokenizer.ggml.merges must be an array", src);
    merges = mg;
  }
  const std::string pre = f.metadata.value("tokenizer.ggml.pre", std::string("default"));
  json pretok = json::array();
  std::string pattern = kGpt2SplitPattern;
  bool ignore_merges = false;
  if (pre == "llama-bpe" || pre == "llama3" || pre == "llama-v3") {
    pattern = kLlama3SplitPattern;
    ignore_merges = true;
  } else if (pre == "qwen2") {
    pattern = kQwen2SplitPattern;
  } else if (pre == "smollm") {
    pretok.push_back({{"type", "Digits"}, {"individual_digits", true}});
  }
  pretok.push_back({{"type", "Split"},
                    {"pattern", {{"Regex", pattern}}},
                    {"behavior", "Isolated"},
                    {"invert", false}});
  pretok.push_back({{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}});
  tj["model"] = {{"type", "BPE"},
                 {"vocab", vocab},
                 {"merges", merges},
                 {"byte_fallback", false},
                 {"ignore_merges", ignore_merges}};
  tj["added_tokens"] = added;
  tj["pre_tokenizer"] = {{"type", "Sequence"}, {"pretokenizers", pretok}};
  tj["decoder"] = {{"type", "ByteLevel"}};
  json cfg = json::object();
  auto id_key = [&](const char* key, const char* name) {
    if (!f.metadata.contains(key) || !f.metadata.at(key).is_number_integer()) return;
    const int64_t id = f.metadata.at(key).get<int64_t>();
    RLHF_CHECK(id >= 0 && id < static_cast<int64_t>(tokens.size()),
               "{}: {} = {} is outside the vocabulary", src, key, id);
    cfg[name] = tokens[size_t(id)];
  };
  id_key("tokenizer.ggml.bos_token_id", "bos_token");
  id_key("tokenizer.ggml.eos_token_id", "eos_token");
  id_key("tokenizer.ggml.padding_token_id", "pad_token");
  if (f.metadata.value("tokenizer.ggml.add_bos_token", false)) cfg["add_bos_token"] = true;
  if (f.metadata.contains("tokenizer.chat_template") &&
      f.metadata.at("tokenizer.chat_template").is_string())
    cfg["chat_template"] = f.metadata.at("tokenizer.chat_template");
  *tokenizer_json = std::move(tj);
  *config_json = std::move(cfg);
}

std::unique_ptr<Tokenizer> load_gguf_bpe_tokenizer(const GgufFile& f,
                                                   const std::vector<TokenType>& types,
                                                   std::vector<TokenizerFile> files) {
  json tj, cfg;
  gguf_bpe_tokenizer_json(f, types, &tj, &cfg);
  return std::make_unique<HfTokenizer>(tj, cfg, std::move(files), f.blob.source, "gguf");
}

}  // namespace rlhf::io
