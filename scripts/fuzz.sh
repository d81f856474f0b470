#!/usr/bin/env bash
# Builds the libFuzzer harnesses in tests/fuzz/ (clang++ -fsanitize=fuzzer,address,undefined over
# the io/ parser sources; not part of the default CMake build) and runs each for a bounded time,
# seeded with the real files of ../shared/data and our own fixtures. Crashes are written to
# build-fuzz/crashes/<harness>/ (turn each into a regression test before fixing it).
#
# Usage: scripts/fuzz.sh [seconds per harness (default 60)] [harness ...]
#   env RLHF_SHARED_DATA (default ../shared/data), RLHF_BINARY (default build/rlhf: writes the
#   small GGUF and HDF5 seeds when present), FUZZ_OUT (default build-fuzz), FUZZ_BUILD_JOBS
#   (parallel compiles, default nproc).
# Needs clang++ 14 with libclang-rt-14-dev (the libFuzzer runtime), libpcre2-dev, nlohmann-json3-dev,
# libfmt-dev, libspdlog-dev, libtomlplusplus-dev, libhdf5-dev (Debian; scripts/install-deps.sh).
# CI runs every harness for 5 s (tests/e2e/fuzz_smoke.sh).
set -euo pipefail
SRC=$(cd "$(dirname "$0")/.." && pwd)
SECONDS_EACH=${1:-60}
shift || true
HARNESSES=("$@")
[ ${#HARNESSES[@]} -gt 0 ] ||
  HARNESSES=(safetensors llama2c gguf hf_tokenizer llama2c_tokenizer tokenize model_config hdf5_ckpt
             chat_template)
DATA=${RLHF_SHARED_DATA:-$SRC/../shared/data}
RLHF=${RLHF_BINARY:-$SRC/build/rlhf}
OUT=${FUZZ_OUT:-$SRC/build-fuzz}
mkdir -p "$OUT/obj" "$OUT/corpus" "$OUT/crashes"
if [ -z "${CXX:-}" ]; then
  CXX=clang++
  command -v clang++ >/dev/null || CXX=clang++-14
fi
HDF5_CFLAGS=$(pkg-config --cflags hdf5 2>/dev/null || echo -I/usr/include/hdf5/serial)
HDF5_LIBS=$(pkg-config --libs hdf5 2>/dev/null || echo "-L/usr/lib/x86_64-linux-gnu/hdf5/serial -lhdf5")
# shellcheck disable=SC2206
FLAGS=(-std=c++20 -g -O1 -fno-omit-frame-pointer -fsanitize=fuzzer-no-link,address,undefined
       -fno-sanitize-recover=undefined -DRLHF_HAVE_PCRE2=1 "-DRLHF_SOURCE_DIR=\"$SRC\"" -I"$SRC"
       -DTOML_HEADER_ONLY=0 -DTOML_SHARED_LIB=1
       $HDF5_CFLAGS)
# toml++ is the system's shared library, as the rlhf binary links it: its header-only form asserts
# (abort) on '[' + newline in a table header (toml++ 3.3 parse_key), where the library build
# returns a parse error, which is what rlhf users get.
# The parser sources (no MPI, SentencePiece, BLAS: the harnesses do not need them; spdlog
# header-only, so that it is instrumented too).
SOURCES=(core/error.cpp io/bytes.cpp io/dtype.cpp io/file_util.cpp io/safetensors.cpp
         io/llama2c.cpp io/gguf.cpp io/tensor_source.cpp io/text_util.cpp io/regex.cpp
         io/spm_tokenizer.cpp io/hf_tokenizer.cpp io/hf_tokenizer_parse.cpp io/sp_tokenizer.cpp io/tokenizer.cpp
         io/jsonl.cpp io/model_config_file.cpp io/h5_check.cpp io/hdf5_ckpt.cpp io/hdf5_model.cpp
         io/tokenizer_hdf5.cpp model/config.cpp model/arch.cpp model/layout.cpp model/projections.cpp
         io/jinja/value.cpp io/jinja/lexer.cpp io/jinja/parser.cpp io/jinja/ops.cpp
         io/jinja/methods.cpp io/jinja/builtins.cpp io/jinja/jinja.cpp)
# Objects in parallel; each is rebuilt when its source or a header it includes (the -MMD list) is
# newer than it.
stale() {  # stale <object>: true when it or its dependency list is missing or out of date
  [ -f "$1" ] && [ -f "$1.d" ] || return 0
  local dep
  for dep in $(sed -e 's/^[^:]*://' -e 's/\\$//' "$1.d"); do
    [ -e "$dep" ] && [ ! "$dep" -nt "$1" ] || return 0
  done
  return 1
}
OBJS=()
pids=()
JOBS=${FUZZ_BUILD_JOBS:-$(nproc)}
for s in "${SOURCES[@]}"; do
  o=$OUT/obj/$(echo "$s" | tr / _).o
  OBJS+=("$o")
  if stale "$o"; then
    while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do sleep 0.2; done
    "$CXX" "${FLAGS[@]}" -MMD -MF "$o.d.tmp" -c "$SRC/$s" -o "$o.tmp" &&
      mv "$o.d.tmp" "$o.d" && mv "$o.tmp" "$o" &
    pids+=($!)
  fi
done
for p in "${pids[@]}"; do wait "$p" || { echo "fuzz.sh: compiling the sources failed" >&2; exit 2; }; done
# shellcheck disable=SC2206
LIBS=(-lpcre2-8 -lfmt -ltomlplusplus $HDF5_LIBS)

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
seed model_config "$SRC"/examples/models/*.toml "$SRC"/tests/fixtures/hf_configs/*.json
seed chat_template "$SRC"/tests/fixtures/chat_templates/templates/*.jinja
# Small GGUF and HDF5 seeds (512-token vocabulary: ~100x more runs per second than the 32,000-token
# file; a 4.5k-parameter model, with and without a tokenizer), written by our own binary when it is
# there.
if [ -x "$RLHF" ]; then
  mkdir -p "$OUT/corpus/gguf" "$OUT/corpus/hdf5_ckpt" "$OUT/seeds"
  if [ -f "$DATA/stories260K/stories260K.bin" ]; then
    for dt in float32 float16; do
      [ -f "$OUT/corpus/gguf/s260_$dt.gguf" ] || "$RLHF" export --log_level warn \
        --pretrain "$DATA/stories260K/stories260K.bin" --format gguf --dtype $dt \
        --output_path "$OUT/corpus/gguf/s260_$dt.gguf" >/dev/null 2>&1 || true
    done
  fi
  if [ ! -f "$OUT/corpus/hdf5_ckpt/micro.h5" ]; then
    cat >"$OUT/seeds/micro.toml" <<'TOML'
vocab_size = 512
hidden_size = 8
intermediate_size = 16
num_hidden_layers = 1
num_attention_heads = 2
num_key_value_heads = 1
max_position_embeddings = 16
bos_token_id = 256
eos_token_id = 257
pad_token_id = 258
TOML
    printf '{"input": "1+1=", "output": "2"}\n' >"$OUT/seeds/micro.jsonl"
    "$RLHF" sft --log_level warn --model_config "$OUT/seeds/micro.toml" \
      --dataset "$OUT/seeds/micro.jsonl" --train_batch_size 1 --micro_train_batch_size 1 \
      --max_len 16 --max_steps 1 --save_path "$OUT/seeds/micro" >/dev/null 2>&1 &&
      cp "$OUT/seeds/micro/model.h5" "$OUT/corpus/hdf5_ckpt/micro.h5" || true
  fi
  # The same with a stored tokenizer (llama2.c's 512-token tok512.bin).
  if [ ! -f "$OUT/corpus/hdf5_ckpt/micro_tok.h5" ] && [ -f "$OUT/corpus/hdf5_ckpt/micro.h5" ] &&
    [ -f "$DATA/stories260K/tok512.bin" ]; then
    "$RLHF" import --log_level warn --pretrain "$OUT/corpus/hdf5_ckpt/micro.h5" \
      --tokenizer "$DATA/stories260K/tok512.bin" \
      --output_path "$OUT/corpus/hdf5_ckpt/micro_tok.h5" >/dev/null 2>&1 || true
  fi
fi
mkdir -p "$OUT/corpus/tokenize"
printf 'Once upon a time, there was a little girl named Lily.' > "$OUT/corpus/tokenize/lily.txt"

status=0
for h in "${HARNESSES[@]}"; do
  bin=$OUT/fuzz_$h
  "$CXX" "${FLAGS[@]}" -fsanitize=fuzzer "$SRC/tests/fuzz/fuzz_$h.cc" "${OBJS[@]}" "${LIBS[@]}" -o "$bin"
  mkdir -p "$OUT/corpus/$h" "$OUT/crashes/$h"
  echo "== fuzz_$h: ${SECONDS_EACH}s"
  # Inputs are capped at 4 MiB (the real files are <= 2.6 MB); -malloc_limit_mb turns any huge
  # allocation (a size trusted from a corrupt header) into a reported crash.
  if ! RLHF_SHARED_DATA=$DATA LSAN_OPTIONS="suppressions=$SRC/tests/fuzz/lsan.supp:${LSAN_OPTIONS:-}" \
      "$bin" "$OUT/corpus/$h" -max_total_time="$SECONDS_EACH" \
      -max_len=4194304 -rss_limit_mb=4096 -malloc_limit_mb=1024 -timeout=20 \
      -artifact_prefix="$OUT/crashes/$h/" -print_final_stats=1 2>"$OUT/fuzz_$h.log"; then
    echo "   FOUND A PROBLEM: see $OUT/fuzz_$h.log and $OUT/crashes/$h/"
    tail -40 "$OUT/fuzz_$h.log" | sed 's/^/   | /'
    status=1
  fi
  grep -E "stat::number_of_executed_runs|stat::peak_rss_mb|cov:" "$OUT/fuzz_$h.log" | tail -3 || true
done
exit $status
