#!/usr/bin/env bash
# rlhf sft end to end: the loss falls, the same seed gives bitwise the same loss curve, the saved
# checkpoint loads back, and every bad input is a one-line error with a non-zero exit.
# Usage: sft.sh <rlhf binary> <source dir>
set -u
RLHF=$1
SRC=$2
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
export OMP_NUM_THREADS=2

# A small, learnable text: 300 sentences over a 16-word vocabulary, with blank lines between.
awk 'BEGIN { srand(7); split("the cat dog sat on a mat and ran to big small red blue house tree", w, " ");
  for (i = 0; i < 300; i++) { s = ""; for (j = 0; j < 10; j++) s = s w[int(rand() * 16) + 1] " "; print s "."; print "" } }' > "$W/text.txt"
COMMON=(--model_config "$SRC/examples/models/tiny.toml" --dataset "$W/text.txt" --max_len 64
        --train_batch_size 16 --micro_train_batch_size 8 --learning_rate 3e-3 --max_steps 50 --max_epochs 10
        --seed 3 --log_level warn)

losses() { grep -o '"loss":[-0-9.e+]*' "$1/metrics.jsonl" | cut -d: -f2; }

"$RLHF" sft "${COMMON[@]}" --save_path "$W/a" || fail "sft run a exited $?"
"$RLHF" sft "${COMMON[@]}" --save_path "$W/b" || fail "sft run b exited $?"
[ "$(losses "$W/a" | wc -l)" -eq 50 ] || fail "expected 50 metric lines"
first=$(losses "$W/a" | head -1)
last=$(losses "$W/a" | tail -1)
echo "loss: step 1 $first, step 50 $last"
awk -v f="$first" -v l="$last" 'BEGIN { exit !(l < 0.6 * f) }' || fail "loss did not fall enough: $first -> $last"
cmp <(losses "$W/a") <(losses "$W/b") || fail "same seed gave different loss curves"

# The checkpoint loads back: continuing from it starts near where run a ended, far below step 1.
[ -f "$W/a/model.h5" ] || fail "no model.h5"
ls "$W/a" | grep -q '\.tmp' && fail "a .tmp file was left behind"
"$RLHF" sft --pretrain "$W/a/model.h5" --dataset "$W/text.txt" --max_len 64 --train_batch_size 16 \
  --micro_train_batch_size 8 --learning_rate 1e-4 --max_steps 2 --seed 3 --log_level warn \
  --save_path "$W/c" || fail "sft from the checkpoint exited $?"
resumed=$(losses "$W/c" | head -1)
echo "loss from checkpoint: $resumed"
awk -v f="$first" -v r="$resumed" -v l="$last" 'BEGIN { exit !(r < 0.75 * f && r < 1.5 * l) }' \
  || fail "checkpoint did not load back: $resumed vs $first / $last"

# Bad inputs: exit code and message.
expect_error() {  # expect_error <what> <message fragment> <args...>
  local what=$1 msg=$2
  shift 2
  out=$("$RLHF" sft "$@" 2>&1)
  code=$?
  [ $code -ne 0 ] || fail "$what: exit 0"
  echo "$out" | grep -qF -- "$msg" || { echo "$out" | tail -3; fail "$what: message lacks '$msg'"; }
  echo "ok: $what -> exit $code"
}
BASE=(--model_config "$SRC/examples/models/tiny.toml" --max_len 64 --train_batch_size 4
      --micro_train_batch_size 2 --max_steps 2 --save_path "$W/bad" --log_level warn)
printf '{"input": "a", "output": "b"}\n{"input": "c", "output": \n' > "$W/malformed.jsonl"
printf '{"input": "a", "output": "b"}\n{"input": "c"}\n' > "$W/nokey.jsonl"
: > "$W/empty.jsonl"
printf '{"input": "a", "output": "%0200d"}\n' 1 2 3 4 5 > "$W/long.jsonl"
expect_error "missing file" "no-such.jsonl" "${BASE[@]}" --dataset "$W/no-such.jsonl"
expect_error "malformed line" "malformed.jsonl:2" "${BASE[@]}" --dataset "$W/malformed.jsonl"
expect_error "missing key" "output" "${BASE[@]}" --dataset "$W/nokey.jsonl"
expect_error "empty dataset" "empty.jsonl" "${BASE[@]}" --dataset "$W/empty.jsonl"
expect_error "overlong, skip" "skipped" "${BASE[@]}" --dataset "$W/long.jsonl" --truncation skip
expect_error "bad truncation" "--truncation" "${BASE[@]}" --dataset "$W/long.jsonl" --truncation cut
expect_error "NaN loss" "not finite" "${COMMON[@]}" --save_path "$W/nan" --learning_rate 1e30
expect_error "batch does not divide" "--train_batch_size" "${BASE[@]}" --dataset "$W/text.txt" \
  --train_batch_size 6 --micro_train_batch_size 4
head -c 3000 "$W/a/model.h5" > "$W/truncated.h5"
expect_error "truncated checkpoint" "truncated.h5" --pretrain "$W/truncated.h5" --dataset "$W/text.txt" \
  --max_len 64 --train_batch_size 4 --micro_train_batch_size 2 --save_path "$W/bad" --log_level warn
expect_error "missing checkpoint" "--pretrain" --pretrain "$W/none.h5" --dataset "$W/text.txt" \
  --save_path "$W/bad" --log_level warn
# overlong with truncate works and reports the count
"$RLHF" sft "${BASE[@]}" --dataset "$W/long.jsonl" --max_len 32 --train_batch_size 4 --log_level info \
  2>&1 | grep -q "truncated" || fail "overlong truncate: no count reported"
echo "ok: overlong truncate reports the count"
echo PASS
