#!/usr/bin/env bash
# Builds the libFuzzer harnesses in tests/fuzz/ (clang++ -fsanitize=fuzzer,address,undefined over
# the io/ parser sources; not part of the default CMake build) and runs each for a bounded time,
# seeded with the real files of ../shared/data and our own fixtures. Crashes are written to
# build-fuzz/crashes/<harness>/ (turn each into a regression test before fixing it).
#
# Usage: scripts/fuzz.sh [seconds per harness (default 60)] [harness ...]
#   env RLHF_SHARED_DATA (default ../shared/data), FUZZ_JOBS (parallel runs, default 1)
# Needs clang++ 14 with libclang-rt-14-dev (the libFuzzer runtime), libpcre2-dev, nlohmann-json3-dev,
# libfmt-dev (Debian).
set -euo pipefail
SRC=$(cd "$(dirname "$0")/.." && pwd)
SECONDS_EACH=${1:-60}
shift || true
HARNESSES=("$@")
[ ${#HARNESSES[@]} -gt 0 ] || HARNESSES=(safetensors llama2c gguf hf_tokenizer llama2c_tokenizer tokenize)
DATA=${RLHF_SHARED_DATA:-$SRC/../shared/data}
OUT=$SRC/build-fuzz
mkdir -p "$OUT/obj" "$OUT/corpus" "$OUT/crashes"
CXX=${CXX:-clang++}
FLAGS=(-std=c++20 -g -O1 -fno-omit-frame-pointer -fsanitize=fuzzer-no-link,address,undefined
       -fno-sanitize-recover=undefined -DRLHF_HAVE_PCRE2=1 "-DRLHF_SOURCE_DIR=\"$SRC\"" -I"$SRC")
# The parser sources (no HDF5, MPI, SentencePiece: the harnesses do not need them).
SOURCES=(core/error.cpp io/bytes.cpp io/dtype.cpp io/file_util.cpp io/safetensors.cpp
         io/llama2c.cpp io/gguf.cpp io/tensor_source.cpp io/text_util.cpp io/regex.cpp
         io/spm_tokenizer.cpp io/hf_tokenizer.cpp io/sp_tokenizer.cpp io/tokenizer.cpp
         model/config.cpp model/layout.cpp)
OBJS=()
for s in "${SOURCES[@]}"; do
  o=$OUT/obj/$(echo "$s" | tr / _).o
  if [ ! -f "$o" ] || [ "$SRC/$s" -nt "$o" ]; then
    "$CXX" "${FLAGS[@]}" -c "$SRC/$s" -o "$o"
  fi
  OBJS+=("$o")
done
LIBS=(-lpcre2-8 -lfmt)

seed() {  # seed <harness> <files...>: copies existing files into the harness's corpus
  local dir=$OUT/corpus/$1
  shift
  mkdir -p "$dir"
  for f in "$@"; do [ -f "$f" ] && cp -n "$f" "$dir/" || true; done
}
seed safetensors "$DATA/tinystories-656k/bf16_upstream/model.safetensors"
seed llama2c "$DATA/stories260K/stories260K.bin" "$DATA/stories260K/stories260K.v1.bin"
seed gguf "$DATA/llama-2-tiny-random-gguf/llama-2-tiny-random.gguf"
seed hf_tokenizer "$DATA/tinystories-656k/bf16_upstream/tokenizer.json" "$SRC"/tests/fixtures/tokenizers/*_*.json
seed llama2c_tokenizer "$DATA/stories260K/tok512.bin"
# Small GGUF seeds (512-token vocabulary: ~100x more runs per second than the 32,000-token file),
# written by our own exporter when the build has the binary.
if [ -x "$SRC/build/rlhf" ] && [ -f "$DATA/stories260K/stories260K.bin" ]; then
  for dt in float32 float16; do
    [ -f "$OUT/corpus/gguf/s260_$dt.gguf" ] || "$SRC/build/rlhf" export --log_level warn \
      --pretrain "$DATA/stories260K/stories260K.bin" --format gguf --dtype $dt \
      --output_path "$OUT/corpus/gguf/s260_$dt.gguf" >/dev/null 2>&1 || true
  done
fi
mkdir -p "$OUT/corpus/tokenize"
printf 'Once upon a time, there was a little girl named Lily.' > "$OUT/corpus/tokenize/lily.txt"

status=0
for h in "${HARNESSES[@]}"; do
  bin=$OUT/fuzz_$h
  "$CXX" "${FLAGS[@]}" -fsanitize=fuzzer "$SRC/tests/fuzz/fuzz_$h.cc" "${OBJS[@]}" "${LIBS[@]}" -o "$bin"
  mkdir -p "$OUT/crashes/$h"
  echo "== fuzz_$h: ${SECONDS_EACH}s"
  # Inputs are capped at 4 MiB (the real files are <= 2.6 MB); -malloc_limit_mb turns any huge
  # allocation (a size trusted from a corrupt header) into a reported crash.
  if ! RLHF_SHARED_DATA=$DATA "$bin" "$OUT/corpus/$h" -max_total_time="$SECONDS_EACH" \
      -max_len=4194304 -rss_limit_mb=4096 -malloc_limit_mb=1024 -timeout=20 \
      -artifact_prefix="$OUT/crashes/$h/" -print_final_stats=1 2>"$OUT/fuzz_$h.log"; then
    echo "   FOUND A PROBLEM: see $OUT/fuzz_$h.log and $OUT/crashes/$h/"
    status=1
  fi
  grep -E "stat::number_of_executed_runs|stat::peak_rss_mb|cov:" "$OUT/fuzz_$h.log" | tail -3 || true
done
exit $status
