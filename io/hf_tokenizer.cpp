#include "io/hf_tokenizer.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <queue>

#include "core/error.h"
#include "io/file_util.h"
#include "io/gguf.h"
#include "io/hf_tokenizer_impl.h"
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

using json = nlohmann::json;
using namespace hf;  // the pipeline's helpers (io/hf_tokenizer_impl.h)

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

// --- the pipeline --------------------------------------------------------------------------------

std::string HfTokenizer::Impl::normalize(std::string_view s) const {
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

std::vector<HfTokenizer::Impl::Seg> HfTokenizer::Impl::split_added(
    std::string_view text, const std::vector<Added>& list) const {
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

std::vector<Piece> HfTokenizer::Impl::pretokenize(std::string text, bool at_start) const {
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

void HfTokenizer::Impl::bpe(std::string_view word, std::vector<int32_t>& out) const {
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
    hf::parse_merges(m, model, src);
    // --- normalizer, pre-tokenizer, decoder
    if (tj.contains("normalizer")) hf::parse_normalizer(m, tj.at("normalizer"), src);
    if (tj.contains("pre_tokenizer"))
      byte_level_ = hf::parse_pre_tokenizer(m, tj.at("pre_tokenizer"), src);
    if (tj.contains("decoder")) hf::parse_decoder(m, tj.at("decoder"), src);
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
    if (tj.contains("post_processor"))
      hf::parse_post_processor(m, tj.at("post_processor"), src, int64_t(tokens_.size()));
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
