// Text helpers shared by the tokenizers and the rewards: whitespace trimming, UTF-8 character
// boundaries, <0xXX> byte pieces, and splitting text on special-token strings.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace rlhf::io {

/// `s` without leading and trailing ASCII whitespace (std::isspace in the C locale).
std::string_view trim_whitespace(std::string_view s);

/// Length in bytes of the UTF-8 character starting at s[i]: 1..4 for a well-formed sequence that
/// fits in s, else 1 (an invalid or truncated sequence is taken one byte at a time). i < s.size().
size_t utf8_char_len(std::string_view s, size_t i);

/// True if `piece` is exactly "<0xHH>" (two hex digits, either case); the byte goes to *byte.
bool parse_byte_piece(std::string_view piece, int* byte);

/// "<0xHH>" with upper-case hex digits.
std::string byte_piece(int byte);

/// A stretch of text, or a special token (id >= 0, text = its match in the input).
struct TextOrToken {
  std::string_view text;
  int32_t id = -1;
};

/// Splits `text` at the leftmost-longest occurrences of the special-token strings (`specials`:
/// text → id, sorted longest first; empty strings are ignored). Adjacent text is returned as one
/// stretch; empty stretches are omitted.
std::vector<TextOrToken> split_on_special_tokens(
    std::string_view text, const std::vector<std::pair<std::string, int32_t>>& specials);

}  // namespace rlhf::io
