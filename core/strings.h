// Small string helpers shared across the tree.
#pragma once

#include <string>
#include <string_view>

namespace rlhf {

/// s with the ASCII letters A-Z lowered (other bytes, UTF-8 included, unchanged), for
/// case-insensitive names: file extensions, OpenBLAS core names, answers.
inline std::string to_lower_ascii(std::string_view s) {
  std::string t(s);
  for (char& c : t)
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  return t;
}

}  // namespace rlhf
