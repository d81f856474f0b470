#include "io/text_util.h"

#include <fmt/format.h>

#include <cctype>

namespace rlhf::io {

std::string_view trim_whitespace(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

size_t utf8_char_len(std::string_view s, size_t i) {
  const unsigned char c = static_cast<unsigned char>(s[i]);
  size_t n = 1;
  if (c >= 0xC2 && c <= 0xDF)
    n = 2;
  else if (c >= 0xE0 && c <= 0xEF)
    n = 3;
  else if (c >= 0xF0 && c <= 0xF4)
    n = 4;
  else
    return 1;
  if (i + n > s.size()) return 1;
  for (size_t k = 1; k < n; ++k)
    if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return 1;
  // Overlong and surrogate forms of 3/4-byte sequences.
  const unsigned char c1 = static_cast<unsigned char>(s[i + 1]);
  if (c == 0xE0 && c1 < 0xA0) return 1;
  if (c == 0xED && c1 > 0x9F) return 1;
  if (c == 0xF0 && c1 < 0x90) return 1;
  if (c == 0xF4 && c1 > 0x8F) return 1;
  return n;
}

bool parse_byte_piece(std::string_view p, int* byte) {
  if (p.size() != 6 || p[0] != '<' || p[1] != '0' || p[2] != 'x' || p[5] != '>') return false;
  auto hex = [](char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  const int hi = hex(p[3]), lo = hex(p[4]);
  if (hi < 0 || lo < 0) return false;
  *byte = hi * 16 + lo;
  return true;
}

std::string byte_piece(int byte) {
  return fmt::format("<0x{:02X}>", byte & 0xff);
}

std::vector<TextOrToken> split_on_special_tokens(
    std::string_view text, const std::vector<std::pair<std::string, int32_t>>& specials) {
  std::vector<TextOrToken> out;
  size_t start = 0, i = 0;
  while (i < text.size()) {
    const std::pair<std::string, int32_t>* hit = nullptr;
    for (const auto& sp : specials) {
      if (!sp.first.empty() && text.compare(i, sp.first.size(), sp.first) == 0) {
        hit = &sp;
        break;  // longest first
      }
    }
    if (hit == nullptr) {
      ++i;
      continue;
    }
    if (i > start) out.push_back({text.substr(start, i - start), -1});
    out.push_back({text.substr(i, hit->first.size()), hit->second});
    i += hit->first.size();
    start = i;
  }
  if (start < text.size()) out.push_back({text.substr(start), -1});
  return out;
}

}  // namespace rlhf::io
