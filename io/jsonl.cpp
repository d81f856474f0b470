#include "io/jsonl.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "core/error.h"

namespace rlhf::io {

namespace {
bool is_blank(std::string_view s) {
  return s.find_first_not_of(" \t\r\n\f\v") == std::string_view::npos;
}
}  // namespace

std::string json_error_text(const nlohmann::json::exception& e) {
  std::string s = e.what();
  if (s.rfind("[json.exception.", 0) == 0) {
    const size_t close = s.find("] ");
    if (close != std::string::npos) s.erase(0, close + 2);
  }
  // "parse error at line 1, column 5: msg" / "parse error: msg" → "msg"
  if (s.rfind("parse error", 0) == 0) {
    const size_t colon = s.find(": ");
    if (colon != std::string::npos) s.erase(0, colon + 2);
  }
  return s;
}

std::pair<int64_t, int64_t> line_column_of(std::string_view text, size_t offset) {
  offset = std::min(offset, text.size());
  int64_t line = 1, col = 1;
  for (size_t i = 0; i < offset; ++i) {
    if (text[i] == '\n') {
      ++line;
      col = 1;
    } else {
      ++col;
    }
  }
  return {line, col};
}

JsonlReader::JsonlReader(std::string path) : path_(std::move(path)) {
  file_ = std::fopen(path_.c_str(), "rb");
  RLHF_CHECK(file_ != nullptr, "cannot open {}: {}", path_, std::strerror(errno));
}

JsonlReader::~JsonlReader() {
  if (file_) std::fclose(file_);
  std::free(buf_);
}

bool JsonlReader::next(nlohmann::json& out) {
  while (true) {
    errno = 0;
    const ssize_t n = ::getline(&buf_, &cap_, file_);
    if (n < 0) {
      RLHF_CHECK(!std::ferror(file_), "cannot read {}: {}", path_, std::strerror(errno));
      return false;
    }
    ++line_;
    std::string_view text(buf_, static_cast<size_t>(n));
    if (line_ == 1 && text.substr(0, 3) == "\xEF\xBB\xBF") text.remove_prefix(3);
    if (is_blank(text)) continue;
    try {
      out = nlohmann::json::parse(text.begin(), text.end());
    } catch (const nlohmann::json::parse_error& e) {
      RLHF_FAIL("{}:{}: malformed JSON: {} (column {})", path_, line_, json_error_text(e), e.byte);
    } catch (const nlohmann::json::exception& e) {  // e.g. a number beyond double: 1e8192
      RLHF_FAIL("{}:{}: malformed JSON: {}", path_, line_, json_error_text(e));
    }
    RLHF_CHECK(out.is_object(), "{}:{}: expected a JSON object, got {}", path_, line_,
               out.type_name());
    object_line_ = line_;
    return true;
  }
}

void for_each_jsonl(const std::string& path,
                    const std::function<bool(const nlohmann::json& object, int64_t line)>& fn) {
  JsonlReader reader(path);
  nlohmann::json obj;
  while (reader.next(obj))
    if (!fn(obj, reader.line())) break;
}

std::vector<nlohmann::json> read_jsonl(const std::string& path) {
  std::vector<nlohmann::json> out;
  JsonlReader reader(path);
  nlohmann::json obj;
  while (reader.next(obj)) out.push_back(std::move(obj));
  return out;
}

std::string read_text_file(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  RLHF_CHECK(f != nullptr, "cannot open {}: {}", path, std::strerror(errno));
  std::string text;
  char chunk[1 << 16];
  size_t n;
  while ((n = std::fread(chunk, 1, sizeof(chunk), f)) > 0) text.append(chunk, n);
  const bool failed = std::ferror(f);
  const int err = errno;
  std::fclose(f);
  RLHF_CHECK(!failed, "cannot read {}: {}", path, std::strerror(err));
  return text;
}

nlohmann::json parse_json_file(const std::string& path) {
  const std::string text = read_text_file(path);
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    // e.byte counts the characters read, the offending one included.
    const auto [line, col] = line_column_of(text, e.byte > 0 ? e.byte - 1 : 0);
    RLHF_FAIL("{}:{}:{}: malformed JSON: {}", path, line, col, json_error_text(e));
  } catch (const nlohmann::json::exception& e) {  // e.g. a number beyond double: 1e8192
    RLHF_FAIL("{}: malformed JSON: {}", path, json_error_text(e));
  }
}

}  // namespace rlhf::io
