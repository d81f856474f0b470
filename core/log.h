// Per-rank logging (docs/design.md, "Conventions: logging") on spdlog: one logger per process named
// `r{rank:03d}`.
//
// Sinks: rank 0 — colour console (stderr) at --log_level; other ranks — stderr at warn; every
// rank — `<log_dir>/rank_{rank:05d}.log` at debug when a log directory is known. Warnings and
// above flush at once. Console output goes to stderr so that stdout stays free for data
// (`rlhf bench` JSON lines, `rlhf generate` samples).
//
// Use the macros: LOG0_INFO(...) logs on rank 0 only (llm.c's printf0); LOG_INFO(...) and friends
// log on every rank. Format strings are fmt's: LOG0_INFO("step {}/{}", step, total).
#pragma once

#include <spdlog/spdlog.h>

#include <string>
#include <utility>
#include <vector>

namespace rlhf {

/// What init_logging needs to know about this process.
struct LogOptions {
  int rank = 0;
  int world_size = 1;
  std::string level = "info";  ///< trace|debug|info|warn|error|critical|off (rank 0 console)
  std::string dir;             ///< "" = no log files
};

/// (Re)creates this process's logger and makes it spdlog's default. May be called again (main
/// calls it once before parsing the command line and once after). Creates `dir` if needed.
/// Throws rlhf::Error if the level is unknown or the directory or file cannot be created.
void init_logging(const LogOptions& opts);

/// "info" -> spdlog::level::info, ...; throws rlhf::Error naming the value otherwise.
spdlog::level::level_enum parse_log_level(const std::string& level);

/// The rank passed to the last init_logging (0 before it).
int log_rank();

/// Flushes every sink of the logger (call before MPI_Abort).
void flush_logs();

/// A two-column box table (llm.c style), one string per line, e.g.
///   +---------------+---------+
///   | Parameter     | Value   |
///   +---------------+---------+
///   | learning_rate | 5e-06   |
///   +---------------+---------+
std::vector<std::string> format_table(const std::vector<std::pair<std::string, std::string>>& rows,
                                      const std::string& left_header = "Parameter",
                                      const std::string& right_header = "Value");

/// "12.3 MiB"-style byte count (binary units, one decimal).
std::string format_bytes(double bytes);

/// Logs format_table(rows, ...) at info, line by line, on rank 0 only.
void log0_table(const std::vector<std::pair<std::string, std::string>>& rows,
                const std::string& left_header = "Parameter",
                const std::string& right_header = "Value");

}  // namespace rlhf

// Every rank.
#define LOG_TRACE(...) ::spdlog::trace(__VA_ARGS__)
#define LOG_DEBUG(...) ::spdlog::debug(__VA_ARGS__)
#define LOG_INFO(...) ::spdlog::info(__VA_ARGS__)
#define LOG_WARN(...) ::spdlog::warn(__VA_ARGS__)
#define LOG_ERROR(...) ::spdlog::error(__VA_ARGS__)
#define LOG_CRITICAL(...) ::spdlog::critical(__VA_ARGS__)

// Rank 0 only.
#define LOG0_DEBUG(...)                                        \
  do {                                                         \
    if (::rlhf::log_rank() == 0) ::spdlog::debug(__VA_ARGS__); \
  } while (0)
#define LOG0_INFO(...)                                        \
  do {                                                        \
    if (::rlhf::log_rank() == 0) ::spdlog::info(__VA_ARGS__); \
  } while (0)
#define LOG0_WARN(...)                                        \
  do {                                                        \
    if (::rlhf::log_rank() == 0) ::spdlog::warn(__VA_ARGS__); \
  } while (0)
