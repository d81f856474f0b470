#!/usr/bin/env bash
# The libFuzzer harnesses of tests/fuzz/ (model files, tokenizers, model configs, HDF5 checkpoints,
# chat templates) for a few seconds each through scripts/fuzz.sh, so that CI runs them: a crash,
# a sanitizer report, a leak, an allocation past the limit or an exception other than rlhf::Error
# fails the test (the input is kept under <build>/fuzz/crashes/<harness>/). Skipped (exit 77)
# where clang++ with the libFuzzer runtime (Debian: clang-14, libclang-rt-14-dev) or a header the
# harnesses need is missing; scripts/install-deps.sh installs them.
#
# usage: fuzz_smoke.sh <path to rlhf> <source dir>
#   env FUZZ_SMOKE_SECONDS (per harness, default 5), RLHF_SHARED_DATA (seed files, optional)
set -u
RLHF=${1:?usage: fuzz_smoke.sh <rlhf binary> <source dir>}
SRC=${2:?usage: fuzz_smoke.sh <rlhf binary> <source dir>}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

CXX=${CXX_FUZZ:-}
if [[ -z $CXX ]]; then
  for c in clang++ clang++-14; do
    if command -v "$c" >/dev/null; then
      CXX=$c
      break
    fi
  done
fi
if [[ -z $CXX ]]; then
  echo "fuzz_smoke: SKIPPED: no clang++ (Debian: apt-get install clang-14 libclang-rt-14-dev)"
  exit 77
fi
printf '%s\n' '#include <cstddef>' '#include <cstdint>' '#include <fmt/format.h>' \
  '#include <hdf5.h>' '#include <nlohmann/json.hpp>' '#include <pcre2.h>' \
  'extern "C" int LLVMFuzzerTestOneInput(const uint8_t*, size_t) { return 0; }' >"$TMP/probe.cc"
# shellcheck disable=SC2046
if ! "$CXX" -std=c++20 -DPCRE2_CODE_UNIT_WIDTH=8 -fsanitize=fuzzer,address,undefined \
  $(pkg-config --cflags hdf5 2>/dev/null || echo -I/usr/include/hdf5/serial) "$TMP/probe.cc" \
  -o "$TMP/probe" >"$TMP/probe.log" 2>&1; then
  echo "fuzz_smoke: SKIPPED: $CXX cannot build a libFuzzer harness here (libclang-rt-14-dev or a" \
    "-dev package missing?):"
  head -5 "$TMP/probe.log"
  exit 77
fi

OUT=$(cd "$(dirname "$RLHF")" && pwd)/fuzz
echo "fuzz_smoke: $CXX, ${FUZZ_SMOKE_SECONDS:-5} s per harness, output in $OUT"
CXX=$CXX FUZZ_OUT=$OUT RLHF_BINARY=$RLHF bash "$SRC/scripts/fuzz.sh" "${FUZZ_SMOKE_SECONDS:-5}"
rc=$?
if [[ $rc -ne 0 ]]; then
  echo "fuzz_smoke: FAILED (scripts/fuzz.sh exit status $rc): see the logs in $OUT"
  exit 1
fi
echo "fuzz_smoke: every harness ran without a finding"
