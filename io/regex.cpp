#include "io/regex.h"

#include "core/error.h"

#ifdef RLHF_HAVE_PCRE2
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#endif

namespace rlhf::io {

bool regex_available() {
#ifdef RLHF_HAVE_PCRE2
  return true;
#else
  return false;
#endif
}

std::string regex_escape(std::string_view literal) {
  std::string out;
  for (char c : literal) {
    if (std::string_view("\\^$.|?*+()[]{}/-").find(c) != std::string_view::npos)
      out.push_back('\\');
    out.push_back(c);
  }
  return out;
}

#ifdef RLHF_HAVE_PCRE2

Regex::Regex(const std::string& pattern, const std::string& source)
    : pattern_(pattern), source_(source) {
  int err = 0;
  PCRE2_SIZE at = 0;
  pcre2_code* code =
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                    PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &err, &at, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof(msg));
    RLHF_FAIL("{}: invalid regular expression /{}/ at offset {}: {}", source, pattern, at,
              reinterpret_cast<const char*>(msg));
  }
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // optional speed-up; falls back to interpretation
  code_ =
      std::shared_ptr<void>(code, [](void* p) { pcre2_code_free(static_cast<pcre2_code*>(p)); });
}

void Regex::for_each_match(std::string_view s,
                           const std::function<void(size_t, size_t)>& fn) const {
  pcre2_code* code = static_cast<pcre2_code*>(code_.get());
  std::unique_ptr<pcre2_match_data, void (*)(pcre2_match_data*)> md(
      pcre2_match_data_create_from_pattern(code, nullptr), pcre2_match_data_free);
  RLHF_CHECK(md != nullptr, "out of memory for a regular expression match");
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(s.data());
  size_t pos = 0;
  while (pos <= s.size()) {
    const int rc = pcre2_match(code, subject, s.size(), pos, 0, md.get(), nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) return;
    RLHF_CHECK(rc >= 0, "{}: regular expression /{}/ failed to match (PCRE2 error {})", source_,
               pattern_, rc);
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md.get());
    const size_t b = ov[0], e = ov[1];
    if (e > b) {
      fn(b, e);
      pos = e;
    } else {
      // Empty match: step over one character (a UTF-8 sequence, or one invalid byte).
      if (b >= s.size()) return;
      size_t n = 1;
      while (b + n < s.size() && (static_cast<unsigned char>(s[b + n]) & 0xC0) == 0x80 && n < 4)
        ++n;
      pos = b + n;
    }
  }
}

#else

Regex::Regex(const std::string& pattern, const std::string& source)
    : pattern_(pattern), source_(source) {
  RLHF_FAIL(
      "{}: this tokenizer needs a regular expression (/{}/), and this build has no PCRE2\nhint: "
      "install libpcre2-dev (scripts/install-deps.sh) and rebuild",
      source, pattern);
}

void Regex::for_each_match(std::string_view, const std::function<void(size_t, size_t)>&) const {
  RLHF_FAIL("{}: no PCRE2 in this build", source_);
}

#endif

}  // namespace rlhf::io
