// Deterministic mutation checks for the file parsers: truncated and bit-flipped copies of a real
// file must give an rlhf::Error (or, for a flip that leaves a well-formed file, load normally) —
// never a crash, another exception type, or a huge allocation. The libFuzzer harnesses in
// tests/fuzz/ explore the same parsers at random under AddressSanitizer (scripts/fuzz.sh).
#pragma once

#include <doctest/doctest.h>

#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"

namespace rlhf::test {

/// Outcome counts of a mutation run.
struct MutationCounts {
  int errors = 0;  ///< rlhf::Error thrown
  int loaded = 0;  ///< parsed without error
  int other = 0;   ///< any other exception (a bug)
};

/// Runs `parse` on `bytes`; counts the outcome, and records the message of another exception type.
inline void run_mutation(const std::function<void(const std::string&)>& parse,
                         const std::string& bytes, MutationCounts& c, const std::string& what) {
  try {
    parse(bytes);
    ++c.loaded;
  } catch (const rlhf::Error&) {
    ++c.errors;
  } catch (const std::exception& e) {
    ++c.other;
    FAIL_CHECK(what << ": " << e.what());
  }
}

/// Truncations of `bytes` at `n` lengths spread over [0, size) (always including 0, 1, size - 1
/// and `extra_cuts`): every one must throw rlhf::Error.
inline void check_truncations(const std::function<void(const std::string&)>& parse,
                              const std::string& bytes, int n,
                              const std::vector<size_t>& extra_cuts = {}) {
  std::vector<size_t> cuts = {0, 1, bytes.size() - 1};
  for (int i = 1; i <= n; ++i) cuts.push_back(bytes.size() * size_t(i) / size_t(n + 1));
  cuts.insert(cuts.end(), extra_cuts.begin(), extra_cuts.end());
  MutationCounts c;
  for (size_t cut : cuts) {
    if (cut >= bytes.size()) continue;
    run_mutation(parse, bytes.substr(0, cut), c, "truncated to " + std::to_string(cut));
  }
  INFO("truncations: " << c.errors << " errors, " << c.loaded << " loaded, " << c.other
                       << " other");
  CHECK(c.loaded == 0);
  CHECK(c.other == 0);
  CHECK(c.errors > 0);
}

/// `n` single-bit flips at seeded random positions in [0, prefix) (the structural part of the
/// file: header, metadata), plus `must_fail` positions whose flip must be an error. Returns the
/// counts (flips that leave a well-formed file load; that is allowed).
inline MutationCounts check_bit_flips(const std::function<void(const std::string&)>& parse,
                                      const std::string& bytes, size_t prefix, int n, uint64_t seed,
                                      const std::vector<size_t>& must_fail = {}) {
  std::mt19937_64 rng(seed);
  MutationCounts c;
  prefix = std::min(prefix, bytes.size());
  for (int i = 0; i < n; ++i) {
    std::string m = bytes;
    const size_t at = rng() % prefix;
    m[at] = static_cast<char>(m[at] ^ (1 << (rng() % 8)));
    run_mutation(parse, m, c, "bit flip at byte " + std::to_string(at));
  }
  for (size_t at : must_fail) {
    for (int bit = 0; bit < 8; ++bit) {
      std::string m = bytes;
      m[at] = static_cast<char>(m[at] ^ (1 << bit));
      MutationCounts one;
      run_mutation(parse, m, one, "bit flip at byte " + std::to_string(at));
      INFO("flip of bit " << bit << " at byte " << at << " must be an error");
      CHECK(one.errors == 1);
      c.errors += one.errors;
      c.other += one.other;
    }
  }
  MESSAGE("bit flips: " << c.errors << " errors, " << c.loaded << " still well-formed, " << c.other
                        << " other");
  CHECK(c.other == 0);
  return c;
}

}  // namespace rlhf::test
