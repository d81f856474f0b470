// Shared by the libFuzzer harnesses (built by scripts/fuzz.sh, not by the default build): run a
// parser on the fuzzer's bytes; rlhf::Error is the expected way to reject input, anything else
// (another exception type, a sanitizer report, an allocation beyond -malloc_limit_mb) is a bug.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

#include "core/error.h"

namespace rlhf::fuzz {

template <typename F>
void expect_only_rlhf_errors(F&& f) {
  try {
    f();
  } catch (const rlhf::Error&) {
    // a clear rejection: fine
  } catch (const std::exception& e) {
    std::fprintf(stderr, "unexpected exception (not rlhf::Error): %s\n", e.what());
    std::abort();
  }
}

inline std::string bytes(const uint8_t* data, size_t size) {
  return std::string(reinterpret_cast<const char*>(data), size);
}

}  // namespace rlhf::fuzz
