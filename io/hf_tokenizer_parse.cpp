#include <algorithm>
#include <cctype>
#include <functional>

#include "core/error.h"
#include "io/hf_tokenizer_impl.h"
#include "io/text_util.h"

namespace rlhf::io::hf {

ByteMap::ByteMap() {
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
                       const std::string& def) {
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

Behavior behavior_from(const std::string& s, const std::string& where) {
  if (s == "Isolated") return Behavior::kIsolated;
  if (s == "Removed") return Behavior::kRemoved;
  if (s == "MergedWithPrevious") return Behavior::kMergedWithPrevious;
  if (s == "MergedWithNext") return Behavior::kMergedWithNext;
  if (s == "Contiguous") return Behavior::kContiguous;
  RLHF_FAIL("{}: split behavior '{}' is not supported", where, s);
}

void parse_merges(HfTokenizer::Impl& m, const json& model, const std::string& src) {
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
      m.merges.emplace(HfTokenizer::Impl::key(ia->second, ib->second),
                       std::make_pair(rank, iab->second));
      ++rank;
    }
  }
}

void parse_normalizer(HfTokenizer::Impl& m, const json& n, const std::string& src) {
  if (n.is_null()) return;
  const std::string t = str_member(n, "type", src + ": normalizer");
  if (t == "Sequence") {
    const json& list = member(n, "normalizers", src + ": normalizer");
    RLHF_CHECK(list.is_array(), "{}: normalizers must be an array", src);
    for (const json& x : list) parse_normalizer(m, x, src);
  } else if (t == "Prepend") {
    m.norm.push_back({HfTokenizer::Impl::NormStep::kPrepend, str_member(n, "prepend", src), ""});
  } else if (t == "Replace") {
    const json& p = member(n, "pattern", src + ": Replace normalizer");
    RLHF_CHECK(p.is_object() && p.contains("String"),
               "{}: only string patterns are supported in Replace normalizers", src);
    m.norm.push_back({HfTokenizer::Impl::NormStep::kReplace, str_member(p, "String", src),
                      str_member(n, "content", src)});
  } else if (t == "NFC") {
    m.norm.push_back({HfTokenizer::Impl::NormStep::kIdentity, "", ""});
  } else if (t == "Strip") {
    HfTokenizer::Impl::NormStep s{HfTokenizer::Impl::NormStep::kStrip, "", ""};
    s.left = bool_member(n, "strip_left", true);
    s.right = bool_member(n, "strip_right", true);
    m.norm.push_back(s);
  } else {
    RLHF_FAIL("{}: normalizer '{}' is not supported", src, t);
  }
}

bool parse_pre_tokenizer(HfTokenizer::Impl& m, const json& p, const std::string& src) {
  if (p.is_null()) return false;
  const std::string t = str_member(p, "type", src + ": pre_tokenizer");
  HfTokenizer::Impl::PreStep st{};
  if (t == "Sequence") {
    const json& list = member(p, "pretokenizers", src + ": pre_tokenizer");
    RLHF_CHECK(list.is_array(), "{}: pretokenizers must be an array", src);
    bool byte_level = false;
    for (const json& x : list) byte_level = parse_pre_tokenizer(m, x, src) || byte_level;
    return byte_level;
  } else if (t == "ByteLevel") {
    st.kind = HfTokenizer::Impl::PreStep::kByteLevel;
    st.add_prefix_space = bool_member(p, "add_prefix_space", false);
    if (bool_member(p, "use_regex", true)) st.re = std::make_shared<Regex>(kGpt2SplitPattern, src);
  } else if (t == "Split") {
    st.kind = HfTokenizer::Impl::PreStep::kSplit;
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
    st.kind = HfTokenizer::Impl::PreStep::kMetaspace;
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
    st.kind = HfTokenizer::Impl::PreStep::kSplit;
    const bool individual = bool_member(p, "individual_digits", false);
    st.re = std::make_shared<Regex>(individual ? R"(\p{N})" : R"(\p{N}+)", src);
    st.behavior = Behavior::kIsolated;
  } else {
    RLHF_FAIL("{}: pre-tokenizer '{}' is not supported", src, t);
  }
  const bool byte_level = st.kind == HfTokenizer::Impl::PreStep::kByteLevel;
  m.pre.push_back(std::move(st));
  return byte_level;
}

void parse_decoder(HfTokenizer::Impl& m, const json& d, const std::string& src) {
  if (d.is_null()) return;
  m.has_decoder = true;
  const std::string t = str_member(d, "type", src + ": decoder");
  HfTokenizer::Impl::DecStep st{};
  if (t == "Sequence") {
    const json& list = member(d, "decoders", src + ": decoder");
    RLHF_CHECK(list.is_array(), "{}: decoders must be an array", src);
    for (const json& x : list) parse_decoder(m, x, src);
    return;
  } else if (t == "ByteLevel") {
    st.kind = HfTokenizer::Impl::DecStep::kByteLevel;
  } else if (t == "Replace") {
    const json& p = member(d, "pattern", src + ": Replace decoder");
    RLHF_CHECK(p.is_object() && p.contains("String"),
               "{}: only string patterns are supported in Replace decoders", src);
    st.kind = HfTokenizer::Impl::DecStep::kReplace;
    st.a = str_member(p, "String", src);
    st.b = str_member(d, "content", src);
  } else if (t == "ByteFallback") {
    st.kind = HfTokenizer::Impl::DecStep::kByteFallback;
  } else if (t == "Fuse") {
    st.kind = HfTokenizer::Impl::DecStep::kFuse;
  } else if (t == "Strip") {
    st.kind = HfTokenizer::Impl::DecStep::kStrip;
    st.a = str_member(d, "content", src, " ");
    const json& s = member(d, "start", src + ": Strip decoder");
    const json& e = member(d, "stop", src + ": Strip decoder");
    RLHF_CHECK(s.is_number_unsigned() && e.is_number_unsigned() && s.get<uint64_t>() < 1024 &&
                   e.get<uint64_t>() < 1024,
               "{}: Strip decoder start/stop must be small non-negative integers", src);
    st.start = s.get<int64_t>();
    st.stop = e.get<int64_t>();
  } else if (t == "Metaspace") {
    st.kind = HfTokenizer::Impl::DecStep::kMetaspace;
    st.a = str_member(d, "replacement", src, "\xE2\x96\x81");
    if (d.contains("prepend_scheme"))
      st.prepend = str_member(d, "prepend_scheme", src, "always") != "never";
    else
      st.prepend = bool_member(d, "add_prefix_space", true);
  } else {
    RLHF_FAIL("{}: decoder '{}' is not supported", src, t);
  }
  m.dec.push_back(std::move(st));
}

void parse_post_processor(HfTokenizer::Impl& m, const json& p, const std::string& src,
                          int64_t vocab_size) {
  if (p.is_null()) return;
  const std::string t = str_member(p, "type", src + ": post_processor");
  if (t == "Sequence") {
    const json& list = member(p, "processors", src + ": post_processor");
    RLHF_CHECK(list.is_array(), "{}: processors must be an array", src);
    for (const json& x : list) parse_post_processor(m, x, src, vocab_size);
  } else if (t == "ByteLevel") {
    // offsets only
  } else if (t == "TemplateProcessing") {
    const json& single = member(p, "single", src + ": TemplateProcessing");
    const json& specials = p.contains("special_tokens") ? p.at("special_tokens") : json::object();
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
                 "{}: TemplateProcessing uses '{}', which is not in its special_tokens", src, name);
      const json& ids = member(specials.at(name), "ids", src + ": special token " + name);
      RLHF_CHECK(ids.is_array(), "{}: special token '{}' ids must be an array", src, name);
      for (const json& id : ids) {
        RLHF_CHECK(
            id.is_number_integer() && id.get<int64_t>() >= 0 && id.get<int64_t>() < vocab_size,
            "{}: special token '{}' has an id outside the vocabulary", src, name);
        (seen_a ? m.suffix : m.prefix).push_back(id.get<int32_t>());
      }
    }
    m.have_template = true;
  } else {
    RLHF_FAIL("{}: post-processor '{}' is not supported", src, t);
  }
}

}  // namespace rlhf::io::hf
