#include "core/error.h"

namespace rlhf {

namespace {
std::string& context_storage() {
  static std::string context;
  return context;
}
}  // namespace

void set_error_context(int rank, const std::string& host) {
  context_storage() = fmt::format("rank {} on host {}", rank, host);
}

const std::string& error_context() { return context_storage(); }

void throw_error(const char* file, int line, std::string message) {
  throw Error(std::move(message), fmt::format("{}:{}", file, line));
}

void throw_call_error(const char* lib, const char* expr, const std::string& err, const char* file,
                      int line) {
  std::string where = fmt::format("{}:{}", file, line);
  std::string ctx = error_context().empty() ? "" : fmt::format(" ({})", error_context());
  throw Error(fmt::format("{} error: {} in `{}` at {}{}", lib, err, expr, where, ctx), where);
}

}  // namespace rlhf
