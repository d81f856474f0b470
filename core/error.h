// Error handling shared by every layer: one exception type, and the check macros that raise it.
//
// `core/` is the base layer: every directory may include it, and it includes nothing of ours.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace rlhf {

/// The one exception type of the project. `what()` is the user-facing message (one line, may carry
/// a "hint:" line); `where()` is the source location that raised it (for the debug log).
class Error : public std::runtime_error {
 public:
  Error(std::string message, std::string where)
      : std::runtime_error(std::move(message)), where_(std::move(where)) {}
  const std::string& where() const noexcept { return where_; }

 private:
  std::string where_;
};

/// Sets "rank R on host H", appended by the library-call check macros (CUDA_CHECK, MPI_CHECK, ...)
/// so that a failure names where it happened. Called once by app/main after MPI_Init.
void set_error_context(int rank, const std::string& host);

/// "rank R on host H", or "" before set_error_context.
const std::string& error_context();

/// Throws rlhf::Error(message, "file:line"). Used by the macros below.
[[noreturn]] void throw_error(const char* file, int line, std::string message);

/// Throws rlhf::Error for a failed library call: "<lib> error <err> in `<expr>` at file:line
/// (rank R on host H)".
[[noreturn]] void throw_call_error(const char* lib, const char* expr, const std::string& err,
                                   const char* file, int line);

}  // namespace rlhf

/// User-facing validation: `RLHF_CHECK(lr > 0, "--learning_rate must be > 0, got {}", lr)`.
/// The message names the file, line or flag at fault; add "\nhint: ..." when the fix is known.
#define RLHF_CHECK(cond, ...)                                               \
  do {                                                                      \
    if (!(cond)) ::rlhf::throw_error(__FILE__, __LINE__, fmt::format(__VA_ARGS__)); \
  } while (0)

/// Unconditional failure with a formatted message.
#define RLHF_FAIL(...) ::rlhf::throw_error(__FILE__, __LINE__, fmt::format(__VA_ARGS__))

/// Internal invariant, always on (never compiled out, unlike assert).
#define RLHF_ASSERT(cond)                                                              \
  do {                                                                                 \
    if (!(cond))                                                                       \
      ::rlhf::throw_error(__FILE__, __LINE__,                                          \
                          fmt::format("internal error: assertion `{}` failed at {}:{}", \
                                      #cond, __FILE__, __LINE__));                     \
  } while (0)

/// The generator for library-call checks (ggml's CUDA_CHECK_GEN): evaluates `expr` once; if
/// `is_ok(result)` is false, throws with `lib`, the stringified call, `to_string(result)`, the
/// source location, rank and host. MPI_CHECK, CUDA_CHECK, NCCL_CHECK, H5_CHECK are built on it.
#define RLHF_CHECK_GEN(lib, expr, is_ok, to_string)                                   \
  [&]() {                                                                             \
    auto rlhf_check_result_ = (expr);                                                 \
    if (!(is_ok(rlhf_check_result_)))                                                 \
      ::rlhf::throw_call_error(lib, #expr, to_string(rlhf_check_result_), __FILE__, __LINE__); \
    return rlhf_check_result_;                                                        \
  }()
