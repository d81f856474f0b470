#include "core/log.h"

#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/sinks/stdout_sinks.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <system_error>

#include "core/error.h"

namespace rlhf {

namespace {
std::atomic<int> g_rank{0};
constexpr const char* kPattern = "[%H:%M:%S.%e] [%n] [%^%l%$] %v";
}  // namespace

spdlog::level::level_enum parse_log_level(const std::string& level) {
  static const std::pair<const char*, spdlog::level::level_enum> kLevels[] = {
      {"trace", spdlog::level::trace}, {"debug", spdlog::level::debug},
      {"info", spdlog::level::info},   {"warn", spdlog::level::warn},
      {"error", spdlog::level::err},   {"critical", spdlog::level::critical},
      {"off", spdlog::level::off}};
  for (const auto& [name, lvl] : kLevels)
    if (level == name) return lvl;
  RLHF_FAIL(
      "unknown log level '{}'\nhint: use one of trace, debug, info, warn, error, critical, off",
      level);
}

void init_logging(const LogOptions& opts) {
  const spdlog::level::level_enum console_level =
      opts.rank == 0 ? parse_log_level(opts.level) : spdlog::level::warn;
  std::vector<spdlog::sink_ptr> sinks;
  if (opts.rank == 0) {
    sinks.push_back(std::make_shared<spdlog::sinks::stderr_color_sink_mt>());
  } else {
    sinks.push_back(std::make_shared<spdlog::sinks::stderr_sink_mt>());
  }
  sinks.back()->set_level(console_level);
  spdlog::level::level_enum logger_level = console_level;

  if (!opts.dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(opts.dir, ec);
    // Several ranks may race to create it: only fail if it is not a directory afterwards.
    RLHF_CHECK(std::filesystem::is_directory(opts.dir),
               "cannot create log directory '{}' (--log_dir): {}", opts.dir, ec.message());
    const std::string path =
        (std::filesystem::path(opts.dir) / fmt::format("rank_{:05d}.log", opts.rank)).string();
    try {
      sinks.push_back(
          std::make_shared<spdlog::sinks::basic_file_sink_mt>(path, /*truncate=*/false));
    } catch (const spdlog::spdlog_ex& e) {
      RLHF_FAIL("cannot open log file '{}': {}", path, e.what());
    }
    sinks.back()->set_level(spdlog::level::debug);
    logger_level = std::min(logger_level, spdlog::level::debug);
  }

  const std::string name = fmt::format("r{:03d}", opts.rank);
  auto logger = std::make_shared<spdlog::logger>(name, sinks.begin(), sinks.end());
  logger->set_pattern(kPattern);
  logger->set_level(logger_level);
  logger->flush_on(spdlog::level::trace);  // every line: a killed rank loses none
  spdlog::drop(name);  // re-initialisation replaces the previous logger of the same name
  spdlog::set_default_logger(logger);
  spdlog::flush_on(spdlog::level::trace);
  g_rank = opts.rank;
}

int log_rank() {
  return g_rank;
}

void flush_logs() {
  if (auto logger = spdlog::default_logger()) logger->flush();
}

std::vector<std::string> format_table(const std::vector<std::pair<std::string, std::string>>& rows,
                                      const std::string& left_header,
                                      const std::string& right_header) {
  size_t w1 = left_header.size(), w2 = right_header.size();
  for (const auto& [k, v] : rows) {
    w1 = std::max(w1, k.size());
    w2 = std::max(w2, v.size());
  }
  const std::string rule =
      fmt::format("+{}+{}+", std::string(w1 + 2, '-'), std::string(w2 + 2, '-'));
  auto line = [&](const std::string& a, const std::string& b) {
    return fmt::format("| {:<{}} | {:<{}} |", a, w1, b, w2);
  };
  std::vector<std::string> out;
  out.reserve(rows.size() + 4);
  out.push_back(rule);
  out.push_back(line(left_header, right_header));
  out.push_back(rule);
  for (const auto& [k, v] : rows) out.push_back(line(k, v));
  out.push_back(rule);
  return out;
}

void log0_table(const std::vector<std::pair<std::string, std::string>>& rows,
                const std::string& left_header, const std::string& right_header) {
  if (log_rank() != 0) return;
  for (const std::string& l : format_table(rows, left_header, right_header)) spdlog::info("{}", l);
}

std::string format_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int i = 0;
  while (bytes >= 1024.0 && i < 4) {
    bytes /= 1024.0;
    ++i;
  }
  return fmt::format("{:.1f} {}", bytes, units[i]);
}

}  // namespace rlhf
