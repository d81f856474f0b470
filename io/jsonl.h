// JSON Lines input (one JSON object per line) and whole-file JSON, with errors that name the file
// and line: "<file>:<line>: malformed JSON: <parser message>".
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace rlhf::io {

/// Streaming (pull) reader of a JSONL file. Blank (whitespace-only) lines are skipped; a UTF-8 BOM
/// and "\r\n" line ends are accepted. Errors (rlhf::Error, one line each):
///   "cannot open <file>: <strerror>", "cannot read <file>: <strerror>",
///   "<file>:<line>: malformed JSON: <parser message>",
///   "<file>:<line>: expected a JSON object, got <type>".
class JsonlReader {
 public:
  explicit JsonlReader(std::string path);
  ~JsonlReader();
  JsonlReader(const JsonlReader&) = delete;
  JsonlReader& operator=(const JsonlReader&) = delete;

  /// Parses the next non-blank line into `out`; false at the end of the file.
  bool next(nlohmann::json& out);
  /// 1-based line number of the object last returned by next() (0 before the first).
  int64_t line() const { return object_line_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::FILE* file_ = nullptr;
  char* buf_ = nullptr;
  size_t cap_ = 0;
  int64_t line_ = 0, object_line_ = 0;
};

/// Calls fn(object, line) for every object of the JSONL file `path`, in order; stops early when
/// fn returns false. Errors as JsonlReader.
void for_each_jsonl(const std::string& path,
                    const std::function<bool(const nlohmann::json& object, int64_t line)>& fn);

/// Every object of the JSONL file `path`, in order. Errors as JsonlReader.
std::vector<nlohmann::json> read_jsonl(const std::string& path);

/// Parses a whole JSON file. Errors: "cannot open <file>: <strerror>",
/// "<file>:<line>:<column>: malformed JSON: <parser message>" (position of the parser's error).
nlohmann::json parse_json_file(const std::string& path);

/// Reads a whole file into a string; "cannot open <file>: <strerror>" on failure.
std::string read_text_file(const std::string& path);

/// 1-based (line, column) of byte `offset` in `text` (column counts bytes).
std::pair<int64_t, int64_t> line_column_of(std::string_view text, size_t offset);

/// nlohmann's exception text without its "[json.exception.parse_error.101] parse error at line 1,
/// column 5: " prefix (we report positions ourselves).
std::string json_error_text(const nlohmann::json::exception& e);

}  // namespace rlhf::io
