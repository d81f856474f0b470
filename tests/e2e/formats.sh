#!/usr/bin/env bash
# Real model formats end to end with the binary (../shared/data; skipped with a message when it is
# absent): `rlhf import` of a Hugging Face folder, a llama2.c file and a GGUF file; `rlhf export`
# to safetensors, HDF5 and GGUF and back (the files re-import, and HF → HDF5 → HF reproduces the
# same safetensors bytes); `rlhf sft --pretrain` on a Hugging Face folder keeps the model's
# tokenizer in its checkpoint; bad inputs are one-line errors with a non-zero exit.
# Usage: formats.sh <rlhf binary> <source dir>     (env RLHF_SHARED_DATA overrides ../shared/data)
set -u
RLHF=$1
SRC=$2
DATA=${RLHF_SHARED_DATA:-$SRC/../shared/data}
if [ ! -d "$DATA/tinystories-656k" ]; then
  echo "skipped: ../shared/data not found (set RLHF_SHARED_DATA)"
  exit 77
fi
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
export OMP_NUM_THREADS=1
Q=(--log_level warn)

TS=$DATA/tinystories-656k/bf16_upstream
"$RLHF" import "${Q[@]}" --pretrain "$TS" --output_path "$W/ts.h5" || fail "import HF exited $?"
"$RLHF" import "${Q[@]}" --pretrain "$DATA/stories260K/stories260K.v1.bin" --output_path "$W/s.h5" \
  || fail "import llama2.c exited $?"
"$RLHF" import "${Q[@]}" --pretrain "$DATA/llama-2-tiny-random-gguf/llama-2-tiny-random.gguf" \
  --output_path "$W/g.h5" || fail "import GGUF exited $?"
for m in ts s g; do
  "$RLHF" export "${Q[@]}" --pretrain "$W/$m.h5" --output_path "$W/${m}_hf" || fail "export $m exited $?"
  [ -f "$W/${m}_hf/config.json" ] && [ -f "$W/${m}_hf/model.safetensors" ] || fail "export $m: files missing"
  "$RLHF" import "${Q[@]}" --pretrain "$W/${m}_hf" --output_path "$W/${m}2.h5" || fail "re-import $m exited $?"
  # HF → HDF5 → HF: the same safetensors bytes (the import/export round trip is bitwise).
  "$RLHF" export "${Q[@]}" --pretrain "$W/${m}2.h5" --output_path "$W/${m}_hf2" || fail "export ${m}2 exited $?"
  cmp -s "$W/${m}_hf/model.safetensors" "$W/${m}_hf2/model.safetensors" || fail "$m: safetensors differ after a round trip"
  cmp -s "$W/${m}_hf/config.json" "$W/${m}_hf2/config.json" || fail "$m: config.json differs after a round trip"
done
ls "$W/ts_hf" | grep -q tokenizer.json || fail "the HF export lacks tokenizer.json"
# The llama2.c tokenizer (tok512.bin) travels as a tokenizer.json that transformers can load, and
# the re-imported model tokenizes with it.
for f in tokenizer.json tokenizer_config.json; do
  [ -f "$W/s_hf/$f" ] || fail "the llama2.c export lacks $f"
done
"$RLHF" import --pretrain "$W/s_hf" --output_path "$W/s3.h5" 2>&1 | grep -q "tokenizer SentencePiece-style BPE tokenizer.json (vocab 512)" \
  || fail "the llama2.c export's tokenizer.json was not used on import"
"$RLHF" export "${Q[@]}" --pretrain "$TS" --format gguf --dtype float16 --output_path "$W/ts.gguf" \
  || fail "export GGUF exited $?"
"$RLHF" import "${Q[@]}" --pretrain "$W/ts.gguf" --output_path "$W/ts3.h5" || fail "import our GGUF exited $?"
"$RLHF" export "${Q[@]}" --pretrain "$TS" --format hdf5 --output_path "$W/dir/" || fail "export hdf5 exited $?"
[ -f "$W/dir/model.h5" ] || fail "export --format hdf5 to a folder did not write model.h5"
echo "ok: import/export round trips"

# sft from a Hugging Face folder: the checkpoint keeps the tokenizer; training from it again uses it.
python3 - "$W/d.jsonl" <<'PY' 2>/dev/null || awk 'BEGIN{for(i=0;i<32;i++) print "{\"input\": \"Once upon a time, there was a\", \"output\": \" little girl named Lily.\"}"}' > "$W/d.jsonl"
import json, sys
with open(sys.argv[1], "w") as f:
    for i in range(32):
        f.write(json.dumps({"input": "Once upon a time, there was a", "output": " little girl named Lily."}) + "\n")
PY
SFT=(--dataset "$W/d.jsonl" --max_len 64 --train_batch_size 8 --micro_train_batch_size 8 --max_steps 2)
out=$("$RLHF" sft --pretrain "$TS" "${SFT[@]}" --save_path "$W/sft" 2>&1) || { echo "$out" | tail -3; fail "sft from HF exited"; }
echo "$out" | grep -q "tokenizer: SentencePiece-style BPE tokenizer.json (vocab 2048)" || fail "sft did not use the model's tokenizer"
out=$("$RLHF" sft --pretrain "$W/sft/model.h5" "${SFT[@]}" --save_path "$W/sft2" 2>&1) || fail "sft from its checkpoint exited"
echo "$out" | grep -q "tokenizer: SentencePiece-style BPE tokenizer.json (vocab 2048)" || fail "the checkpoint lost the tokenizer"
out=$("$RLHF" sft --pretrain "$DATA/stories260K/stories260K.bin" --tokenizer "$DATA/stories260K/tok512.bin" \
  "${SFT[@]}" --save_path "$W/sft3" 2>&1) || fail "sft from llama2.c with --tokenizer exited"
echo "$out" | grep -q "tokenizer: llama2.c tok512.bin (vocab 512)" || fail "--tokenizer was not used"
echo "ok: sft keeps the model's tokenizer"

# Bad inputs: exit code and message.
expect_error() {  # expect_error <what> <message fragment> <args...>
  local what=$1 msg=$2
  shift 2
  out=$("$RLHF" "$@" 2>&1)
  code=$?
  [ $code -ne 0 ] || fail "$what: exit 0"
  echo "$out" | grep -qF -- "$msg" || { echo "$out" | tail -3; fail "$what: message lacks '$msg'"; }
  echo "ok: $what -> exit $code"
}
head -c 1000 "$TS/model.safetensors" > "$W/cut.safetensors"
mkdir -p "$W/cut" && cp "$TS/config.json" "$W/cut/" && cp "$W/cut.safetensors" "$W/cut/model.safetensors"
expect_error "truncated safetensors" "truncated or corrupt" import --pretrain "$W/cut" --output_path "$W/x.h5"
head -c 5000 "$DATA/stories260K/stories260K.bin" > "$W/cut.bin"
expect_error "truncated llama2.c" "implies 1056540 bytes, the file has 5000" import --pretrain "$W/cut.bin" --output_path "$W/x.h5"
expect_error "missing model" "no such file" export --pretrain "$W/nope" --output_path "$W/o"
expect_error "hdf5 with bf16" "--dtype bfloat16 with --format hdf5" export --pretrain "$TS" --format hdf5 --dtype bfloat16 --output_path "$W/o.h5"
expect_error "bad format" "--format" export --pretrain "$TS" --format onnx --output_path "$W/o"
expect_error "missing output" "--output_path is required" import --pretrain "$TS"
expect_error "wrong tokenizer" "has 32000 tokens, the model's vocab_size is 512" sft --pretrain "$DATA/stories260K/stories260K.bin" \
  --tokenizer "$DATA/llama2-tokenizer/tokenizer.bin" "${SFT[@]}" --save_path "$W/bad"
echo "PASS"
