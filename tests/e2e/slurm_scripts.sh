#!/usr/bin/env bash
# The sbatch examples in scripts/slurm stay runnable: the rlhf command of each parses (no usage
# error, exit 2) — it then fails only on the missing data or GPU of this machine — and each
# requeues on exit status 3 (a run stopped by SIGUSR1/SIGTERM after writing its checkpoint).
# Usage: slurm_scripts.sh <rlhf binary> <source dir>
set -u
RLHF=$(realpath "$1")
SRC=$2
W=$(mktemp -d)
mkdir -p "$W/run"
trap 'rm -rf "$W"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
n=0
for f in "$SRC"/scripts/slurm/*.sbatch; do
  bash -n "$f" || fail "$f: syntax"
  # The rlhf command: from the line holding "$RLHF" to the end of its continuation lines.
  cmd=$(awk '/"\$RLHF" /{p=1} p{print} p&&!/\\$/{exit}' "$f" | tr -d '\\\n' | sed 's/.*"\$RLHF"//; s/ &$//')
  [ -n "$cmd" ] || fail "$f: no rlhf command found"
  (cd "$W/run" && OUT="$W/run/out" MODEL=/nonexistent/model POLICY=/nonexistent/p.h5 REWARD=/nonexistent/r.h5 \
    HOME=/nonexistent SLURM_SUBMIT_DIR="$W/run" SLURM_JOB_ID=1 SLURM_CPUS_PER_TASK=1 \
    eval "timeout 60 \"$RLHF\" $cmd --device cpu" > "$W/log" 2>&1)
  code=$?
  [ $code -ne 2 ] || { tail -3 "$W/log"; fail "$f: usage error"; }
  [ $code -ne 0 ] || fail "$f: ran without its data?"
  # Parsed: rlhf printed its resolved configuration, then failed on the data.
  grep -q "resolved configuration" "$W/log" || { tail -3 "$W/log"; fail "$f: rlhf did not start"; }
  grep -qE "error: --(pretrain|model_config) /nonexistent" "$W/log" \
    || { tail -3 "$W/log"; fail "$f: not the expected missing-file error"; }
  grep -q -- "--load_checkpoint" <<< "$cmd" || fail "$f: does not resume (--load_checkpoint)"
  grep -q "SBATCH --requeue" "$f" || fail "$f: not requeueable"
  grep -q 'rc -eq 3 ].*scontrol requeue' "$f" || fail "$f: does not requeue on exit status 3"
  echo "ok: $(basename "$f"): flags parse (exit $code: $(grep -m1 -o 'error: .*' "$W/log" | cut -c1-80))"
  n=$((n + 1))
done
[ $n -ge 4 ] || fail "only $n sbatch scripts"
echo PASS
