#!/usr/bin/env bash
# rlhf rm end to end: on separable synthetic preferences the Bradley–Terry loss falls and the
# accuracy reaches 1; 2 ranks follow the 1-rank loss curve; the checkpoint has a reward head;
# bad inputs are clear errors.
# Usage: rm.sh <rlhf binary> <source dir>
set -u
RLHF=$1
SRC=$2
# shellcheck source=lib/common.sh
. "$SRC/tests/e2e/lib/common.sh"

awk 'BEGIN { srand(3); split("kind nice helpful good", g, " "); split("rude mean bad awful", b, " ");
  for (i = 0; i < 256; i++) { c = ""; r = "";
    for (j = 0; j < 5; j++) { c = c " " g[int(rand() * 4) + 1]; r = r " " b[int(rand() * 4) + 1] }
    printf "{\"prompt\": \"Q: say something. A:\", \"chosen\": \"%s\", \"rejected\": \"%s\"}\n", c, r } }' > "$W/pairs.jsonl"
ARGS=(rm --model_config "$SRC/examples/models/tiny.toml" --dataset "$W/pairs.jsonl" --prompt_key prompt
      --max_len 64 --train_batch_size 16 --micro_train_batch_size 4 --learning_rate 1e-3
      --max_steps 12 --seed 1 --log_level warn)
field() { grep -o "\"$2\":[-0-9.e+]*" "$1/metrics.jsonl" | cut -d: -f2; }

"$MPIEXEC" --oversubscribe -np 1 "$RLHF" "${ARGS[@]}" --save_path "$W/a" || fail "rm exited $?"
first=$(field "$W/a" loss | head -1); last=$(field "$W/a" loss | tail -1); acc=$(field "$W/a" acc | tail -1)
echo "loss $first -> $last, final accuracy $acc"
awk -v f="$first" -v l="$last" -v a="$acc" 'BEGIN { exit !(l < 0.2 * f && a == 1) }' || fail "did not learn"
"$MPIEXEC" --oversubscribe -np 2 "$RLHF" "${ARGS[@]}" --save_path "$W/b" || fail "2 ranks exited $?"
paste <(field "$W/a" loss) <(field "$W/b" loss) | awk '{ d = $1 - $2; if (d < 0) d = -d;
  if (d > 1e-3 * ($1 + 1e-3)) { print "step " NR ": " $1 " vs " $2; bad = 1 } } END { exit bad }' \
  || fail "2 ranks diverged from 1 rank"
[ -f "$W/a/model.h5" ] || fail "no checkpoint"
printf '{"prompt": "q", "chosen": "a"}\n' > "$W/bad.jsonl"
out=$("$RLHF" "${ARGS[@]}" --dataset "$W/bad.jsonl" --save_path "$W/c" 2>&1)
[ $? -ne 0 ] && echo "$out" | grep -q "bad.jsonl:1: missing key 'rejected'" || { echo "$out" | tail -2; fail "missing key"; }
echo PASS
