#!/usr/bin/env bash
# Hugging Face round trip through transformers itself, for the Llama, Qwen2 (tied, q/k/v biases),
# Qwen3 (q_norm/k_norm, explicit head_dim) and llama3-RoPE fixtures: transformers writes a folder
# from the fixture's weights (save_pretrained) → `rlhf import` → `rlhf export` (safetensors, and
# GGUF → import → export where llama.cpp has the architecture) → transformers loads our export and
# its logits equal the fixture's float64 logits (scripts/check_hf_export.py, 1e-4 of max |logit|).
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
echo "ok: transformers loads our exports of llama, qwen2, qwen3 and llama3-scaled llama with the fixture logits"
