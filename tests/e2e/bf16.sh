#!/usr/bin/env bash
# --param_dtype bf16 on the CPU, end to end (oneDNN bf16 GEMMs, fp32 master weights): sft learns in
# bf16 as in fp32 (the loss falls by the same margin; the curves differ, so bf16 really ran), the
# same seed gives bitwise the same bf16 curve, generate and score run from the bf16-trained
# checkpoint in bf16, 2 ranks (ZeRO-3) learn like 1, and a 2-rank GRPO step syncs half the bytes of
# fp32 into its bf16 engines. With --attn_implementation onednn (attention's products in bf16
# too), padded or packed, sft learns as well on a curve of its own; with fp32 compute that flag is
# a usage error. Without oneDNN in the build, bf16 is a usage
# error (exit 2) naming the flag, and the rest is skipped.
# Usage: bf16.sh <rlhf binary> <source dir>     (env MPIEXEC: mpiexec's path)
set -u
RLHF=$1
SRC=$2
# shellcheck source=lib/common.sh
. "$SRC/tests/e2e/lib/common.sh"
export OMP_NUM_THREADS=2

awk 'BEGIN { srand(7); split("the cat dog sat on a mat and ran to big small red blue house tree", w, " ");
  for (i = 0; i < 300; i++) { s = ""; for (j = 0; j < 10; j++) s = s w[int(rand() * 16) + 1] " "; print s "."; print "" } }' > "$W/text.txt"
SFT=(sft --model_config "$SRC/examples/models/tiny.toml" --dataset "$W/text.txt" --max_len 64
     --train_batch_size 16 --micro_train_batch_size 8 --learning_rate 3e-3 --max_steps 30
     --seed 3 --log_level warn)
losses() { grep -o '"loss":[-0-9.e+]*' "$1/metrics.jsonl" | cut -d: -f2; }

out=$("$RLHF" "${SFT[@]}" --param_dtype bf16 --save_path "$W/b1" 2>&1)
rc=$?
if [ $rc -eq 2 ] && grep -qF -- "--param_dtype bf16: bf16 compute on the CPU needs oneDNN" <<<"$out"; then
  echo "ok: a build without oneDNN refuses --param_dtype bf16 with exit 2"
  echo "skipped: the bf16 runs (no oneDNN in this build)"
  exit 77
fi
[ $rc -eq 0 ] || fail "bf16 sft exited $rc: $(tail -3 <<<"$out")"
"$RLHF" "${SFT[@]}" --bf16 --save_path "$W/b2" || fail "bf16 sft (--bf16) exited $?"
"$RLHF" "${SFT[@]}" --param_dtype fp32 --save_path "$W/f" || fail "fp32 sft exited $?"
cmp <(losses "$W/b1") <(losses "$W/b2") || fail "same seed gave different bf16 loss curves"
cmp -s <(losses "$W/b1") <(losses "$W/f") && fail "bf16 and fp32 gave the same curve: bf16 did not run"
bf=$(losses "$W/b1" | head -1) bl=$(losses "$W/b1" | tail -1)
ff=$(losses "$W/f" | head -1) fl=$(losses "$W/f" | tail -1)
echo "loss bf16: $bf -> $bl; fp32: $ff -> $fl"
awk -v f="$bf" -v l="$bl" 'BEGIN { exit !(l < 0.7 * f) }' || fail "bf16 loss did not fall: $bf -> $bl"
awk -v a="$bl" -v b="$fl" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d < 0.1 * b) }' \
  || fail "bf16 final loss $bl is not within 10% of fp32's $fl"

# Attention's products in bf16 too (--attn_implementation onednn), padded and packed: learns like
# the fp32-kernel attention, on another curve (so it ran), and says so at start-up.
for pack in false true; do
  "$RLHF" "${SFT[@]}" --param_dtype bf16 --attn_implementation onednn --packing_samples "$pack" \
    --log_level info --save_path "$W/a_$pack" > "$W/a_$pack.log" 2>&1 \
    || { tail -3 "$W/a_$pack.log"; fail "bf16 sft with onednn attention (packing $pack) exited"; }
  grep -qF "attention: bf16 products through oneDNN" "$W/a_$pack.log" \
    || fail "onednn attention (packing $pack): no start-up line"
  al=$(losses "$W/a_$pack" | tail -1)
  awk -v a="$al" -v b="$bl" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d < 0.1 * b) }' \
    || fail "onednn attention (packing $pack): final loss $al not within 10% of $bl"
  echo "ok: bf16 sft with onednn attention (packing $pack) ends at loss $al"
done
cmp -s <(losses "$W/a_false") <(losses "$W/b1") && fail "onednn attention gave the kernels' curve"
out=$("$RLHF" "${SFT[@]}" --param_dtype fp32 --attn_implementation onednn --save_path "$W/x" 2>&1)
rc=$?
[ $rc -eq 2 ] && grep -qF -- "--attn_implementation onednn computes attention's products in bf16" \
  <<<"$out" || fail "onednn attention with fp32 compute: exit $rc, want 2: $(tail -2 <<<"$out")"
echo "ok: --attn_implementation onednn with --param_dtype fp32 is a usage error"

# Generate and score from the bf16 checkpoint, in bf16.
printf '{"input": "the cat"}\n{"input": "a dog sat on"}\n' > "$W/prompts.jsonl"
"$RLHF" generate --pretrain "$W/b1" --dataset "$W/prompts.jsonl" --generate_max_len 16 --greedy \
  --param_dtype bf16 --log_level warn --output_path "$W/g.jsonl" || fail "bf16 generate exited $?"
[ "$(wc -l < "$W/g.jsonl")" -eq 2 ] || fail "bf16 generate: expected 2 lines"
printf '{"input": "the cat", "output": " sat on a mat"}\n' > "$W/records.jsonl"
"$RLHF" score --pretrain "$W/b1" --dataset "$W/records.jsonl" --param_dtype bf16 --log_level warn \
  --output_path "$W/s.jsonl" || fail "bf16 score exited $?"
grep -q '"nll"' "$W/s.jsonl" || fail "bf16 score wrote no scores"
echo "ok: generate and score in bf16"

# 2 ranks (ZeRO-3) in bf16: the loss falls like 1 rank's (not bitwise: another gradient order).
"$MPIEXEC" -np 2 --oversubscribe --bind-to none "$RLHF" "${SFT[@]}" --param_dtype bf16 --threads 1 \
  --save_path "$W/m" || fail "2-rank bf16 sft exited $?"
ml=$(losses "$W/m" | tail -1)
awk -v a="$ml" -v b="$bl" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d < 0.05 * b) }' \
  || fail "2-rank bf16 final loss $ml is not within 5% of 1 rank's $bl"
echo "ok: 2 ranks in bf16 end at loss $ml (1 rank: $bl)"

# GRPO on 2 ranks in bf16: the trainer's ZeRO-3 gathers and the weight sync into the bf16 engines
# move bf16 (sync_bytes exactly half of the fp32 run's).
GRPO=(grpo --model_config "$SRC/examples/models/tiny.toml" --input_key input --label_key label
      --prompt_data "builtin:addition?n=64&digits=1&seed=1" --reward math --n_samples_per_prompt 4
      --rollout_batch_size 4 --train_batch_size 16 --micro_train_batch_size 8 --generate_max_len 4
      --max_steps 1 --seed 1 --threads 1 --log_level warn)
for dt in bf16 fp32; do
  "$MPIEXEC" -np 2 --oversubscribe --bind-to none "$RLHF" "${GRPO[@]}" --param_dtype "$dt" \
    --save_path "$W/grpo_$dt" > "$W/grpo_$dt.log" 2>&1 \
    || { tail -3 "$W/grpo_$dt.log"; fail "2-rank $dt grpo exited"; }
done
sync_bytes() { grep -o '"sync_bytes":[0-9]*' "$1/metrics.jsonl" | head -1 | cut -d: -f2; }
b16=$(sync_bytes "$W/grpo_bf16") b32=$(sync_bytes "$W/grpo_fp32")
[ -n "$b16" ] && [ -n "$b32" ] && [ $((2 * b16)) -eq "$b32" ] \
  || fail "weight sync bytes: bf16 $b16, fp32 $b32 (want exactly half)"
echo "ok: GRPO weight sync in bf16 moves $b16 bytes (fp32: $b32)"
