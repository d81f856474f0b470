#!/usr/bin/env bash
# Hugging Face round trip through transformers itself, for the Llama, Qwen2 (tied, q/k/v biases),
# Qwen3 (q_norm/k_norm, explicit head_dim) and llama3-RoPE fixtures: transformers writes a folder
# from the fixture's weights (save_pretrained) → `rlhf import` → `rlhf export` (safetensors, and
# GGUF → import → export where llama.cpp has the architecture) → transformers loads our export and
# its logits equal the fixture's float64 logits (scripts/check_hf_export.py, 1e-4 of max |logit|);
# a bf16 export cut into 20 KB shards has the index and shards transformers' own save_pretrained
# writes (scripts/check_hf_shards.py).
# Then the tokenizer of a real model (stories260K, from ../shared/data when present): AutoTokenizer
# on our export tokenizes and decodes as rlhf does, and transformers' log-probs of rlhf's greedy
# completions equal rlhf's.
# Needs a Python with torch, transformers and h5py (env RLHF_PYTHON, default python3); skipped
# (exit 77) without one: CI does not install torch.
# Usage: hf_export_transformers.sh <rlhf binary> <source dir>
set -u
RLHF=$1
SRC=$2
PY=${RLHF_PYTHON:-python3}
if ! "$PY" -c "import torch, transformers, h5py" >/dev/null 2>&1; then
  echo "skipped: $PY has no torch/transformers/h5py (set RLHF_PYTHON to a Python that has them)"
  exit 77
fi
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
export OMP_NUM_THREADS=1
Q=(--log_level warn)
for f in llama_rotate_half_untied qwen2_tied qwen3_qk_norm llama3_rope; do
  FX=$SRC/tests/fixtures/$f.h5
  "$PY" "$SRC/scripts/check_hf_export.py" --model "$W/$f.ref" --fixture "$FX" --write-reference \
    >/dev/null || fail "$f: writing the transformers reference folder"
  "$RLHF" import "${Q[@]}" --pretrain "$W/$f.ref" --output_path "$W/$f.h5" || fail "$f: import exited $?"
  "$RLHF" export "${Q[@]}" --pretrain "$W/$f.h5" --output_path "$W/$f.hf" || fail "$f: export exited $?"
  "$PY" "$SRC/scripts/check_hf_export.py" --model "$W/$f.hf" --fixture "$FX" --tol 1e-5 \
    || fail "$f: transformers' logits on our export differ from the fixture"
  # bf16 in 20 KB shards: the index and the shards transformers' save_pretrained writes.
  "$RLHF" export "${Q[@]}" --pretrain "$W/$f.h5" --output_path "$W/$f.bf16" --dtype bfloat16 \
    --max_shard_size 20KB || fail "$f: sharded bf16 export exited $?"
  "$PY" "$SRC/scripts/check_hf_shards.py" --model "$W/$f.bf16" --max-shard-size 20KB \
    --out "$W/$f.bf16.tf" || fail "$f: our shards differ from transformers'"
  if [ "$f" != llama3_rope ]; then  # GGUF cannot carry llama3 scaling: export refuses it
    "$RLHF" export "${Q[@]}" --pretrain "$W/$f.h5" --format gguf --output_path "$W/$f.gguf" \
      || fail "$f: GGUF export exited $?"
    "$RLHF" export "${Q[@]}" --pretrain "$W/$f.gguf" --output_path "$W/$f.gguf.hf" \
      || fail "$f: export of the GGUF exited $?"
    "$PY" "$SRC/scripts/check_hf_export.py" --model "$W/$f.gguf.hf" --fixture "$FX" --tol 1e-5 \
      || fail "$f: logits after the GGUF round trip differ"
  else
    out=$("$RLHF" export "${Q[@]}" --pretrain "$W/$f.h5" --format gguf --output_path "$W/$f.gguf" 2>&1) \
      && fail "$f: GGUF export of llama3 RoPE scaling was accepted"
    echo "$out" | grep -q "llama3 RoPE scaling is not supported" || fail "$f: unclear refusal: $out"
  fi
done
# Tokenizers: a real model with a llama2.c tokenizer (stories260K + tok512.bin) exported as a
# Hugging Face folder: AutoTokenizer's token counts and decode, and transformers' log-probs of
# rlhf's greedy completions, equal rlhf's (scripts/check_hf_export.py --rlhf); the same after a
# GGUF round trip (the vocabulary travels as tokenizer.ggml.*). SmolLM2 (GGUF byte-level BPE with
# a chat template) too when RLHF_E2E_SMOLLM=1 (a 540 MB export).
DATA=${RLHF_SHARED_DATA:-$SRC/../shared/data}
if [ -f "$DATA/stories260K/stories260K.bin" ]; then
  "$RLHF" import "${Q[@]}" --pretrain "$DATA/stories260K/stories260K.bin" \
    --tokenizer "$DATA/stories260K/tok512.bin" --output_path "$W/s.h5" || fail "stories260K: import"
  "$RLHF" export "${Q[@]}" --pretrain "$W/s.h5" --output_path "$W/s.hf" || fail "stories260K: export"
  for f in tokenizer.json tokenizer_config.json generation_config.json; do
    [ -f "$W/s.hf/$f" ] || fail "stories260K: the export has no $f"
  done
  "$PY" "$SRC/scripts/check_hf_export.py" --model "$W/s.hf" --rlhf "$RLHF" --source "$W/s.h5" \
    || fail "stories260K: transformers' tokenizer or log-probs differ from rlhf's"
  "$RLHF" export "${Q[@]}" --pretrain "$W/s.h5" --format gguf --output_path "$W/s.gguf" \
    || fail "stories260K: GGUF export"
  "$RLHF" export "${Q[@]}" --pretrain "$W/s.gguf" --output_path "$W/s.gguf.hf" \
    || fail "stories260K: export of the GGUF"
  "$PY" "$SRC/scripts/check_hf_export.py" --model "$W/s.gguf.hf" --rlhf "$RLHF" --source "$W/s.h5" \
    || fail "stories260K: tokenizer or log-probs differ after the GGUF round trip"
else
  echo "skipped the tokenizer checks: no $DATA/stories260K (set RLHF_SHARED_DATA)"
fi
SMOL=$DATA/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf
if [ "${RLHF_E2E_SMOLLM:-0}" = 1 ] && [ -f "$SMOL" ]; then
  "$RLHF" export "${Q[@]}" --pretrain "$SMOL" --output_path "$W/smol.hf" || fail "SmolLM2: export"
  "$PY" "$SRC/scripts/check_hf_export.py" --model "$W/smol.hf" --rlhf "$RLHF" --source "$SMOL" \
    || fail "SmolLM2: transformers' tokenizer or log-probs differ from rlhf's"
fi
echo "ok: transformers loads our exports of llama, qwen2, qwen3 and llama3-scaled llama with the fixture logits, and our tokenizers"
