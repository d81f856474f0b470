// metrics.jsonl: one JSON object per line, appended and flushed line by line (docs/design.md, "One
// RL step").
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>

namespace rlhf::io {

/// Appends records to `<dir>/metrics.jsonl`. The caller decides who writes (rank 0 only).
/// Each write() is one line, flushed at once, so a crashed run keeps every finished step.
class MetricsWriter {
 public:
  /// Creates `dir` (and parents) if needed and opens `<dir>/<file>` for appending (a resumed run
  /// continues the file) or, with `truncate`, empty (a fresh run).
  /// Throws rlhf::Error "cannot create directory <dir>: ..." / "cannot open <file>: <strerror>".
  explicit MetricsWriter(const std::string& dir, bool truncate = false,
                         const std::string& file = "metrics.jsonl");
  ~MetricsWriter();
  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;

  /// Appends `record` (a JSON object; NaN/Inf become null) as one line and flushes.
  /// Throws rlhf::Error if `record` is not an object or the write fails.
  void write(const nlohmann::json& record);
  /// `<dir>/<file>`.
  const std::string& path() const { return path_; }
  /// Every record written from now on is also passed to `fn` (experiment trackers,
  /// rl/tracking.h), after it is on disk.
  void set_mirror(std::function<void(const nlohmann::json&)> fn) { mirror_ = std::move(fn); }

 private:
  std::function<void(const nlohmann::json&)> mirror_;
  std::string path_;
  std::FILE* file_ = nullptr;
};

/// A resumed run continues `<dir>/<file>` (metrics.jsonl, samples.jsonl) from its checkpoint's
/// step: records with "step" > last_step (steps the interrupted run did after its last
/// checkpoint) and unparsable lines (a half-written last line) are dropped, so the file holds
/// each step once. Rewritten through `<file>.tmp` and a rename; a missing file is left alone.
/// Throws rlhf::Error when the temporary file cannot be written.
void trim_records(const std::string& dir, const char* file, int64_t last_step);

}  // namespace rlhf::io
