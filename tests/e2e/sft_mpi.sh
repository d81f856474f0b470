#!/usr/bin/env bash
# rlhf sft on several ranks: 4 ranks as 2 simulated nodes print the placement table and the memory
# per rank, and follow the 1-rank loss curve; a rank that throws ends the job on every rank within
# seconds; an impossible placement is refused.
# Usage: sft_mpi.sh <rlhf binary> <source dir>     (env MPIEXEC: mpiexec's path)
set -u
RLHF=$1
SRC=$2
MPIEXEC=${MPIEXEC:-mpiexec}
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
MPI=("$MPIEXEC" --oversubscribe --bind-to none)

awk 'BEGIN { srand(11); split("the cat dog sat on a mat and ran to big small red blue house tree", w, " ");
  for (i = 0; i < 200; i++) { s = ""; for (j = 0; j < 10; j++) s = s w[int(rand() * 16) + 1] " "; print s "."; print "" } }' > "$W/text.txt"
ARGS=(sft --model_config "$SRC/examples/models/tiny.toml" --dataset "$W/text.txt" --max_len 48
      --train_batch_size 16 --micro_train_batch_size 2 --learning_rate 3e-3 --max_steps 8 --seed 5)
losses() { grep -o '"loss":[-0-9.e+]*' "$1/metrics.jsonl" | cut -d: -f2; }

"${MPI[@]}" -np 1 "$RLHF" "${ARGS[@]}" --save_path "$W/np1" --log_level warn || fail "np 1 exited $?"
"${MPI[@]}" -np 4 "$RLHF" "${ARGS[@]}" --save_path "$W/np4" --ranks_per_node 2 > "$W/np4.log" 2>&1 \
  || { tail "$W/np4.log"; fail "np 4 exited"; }
grep -q "placement (4 ranks, 2 nodes)" "$W/np4.log" || fail "no placement table"
[ "$(grep -cE '\]\s+[0-3]  .*  both ' "$W/np4.log")" -eq 4 ] || { grep -A6 placement "$W/np4.log"; fail "placement rows"; }
grep -q "memory per rank" "$W/np4.log" || fail "no memory report"
paste <(losses "$W/np1") <(losses "$W/np4") | awk '{ d = $1 - $2; if (d < 0) d = -d;
  if (d > 1e-4 * $1) { print "step " NR ": " $1 " vs " $2; bad = 1 } } END { exit bad }' \
  || fail "4 ranks diverged from 1 rank"
echo "ok: 4 ranks (2 simulated nodes) follow the 1-rank loss curve: $(losses "$W/np4" | tail -1)"

# ZeRO-0 baseline and Adam offload: same curve.
"${MPI[@]}" -np 2 "$RLHF" "${ARGS[@]}" --save_path "$W/z0" --zero_stage 0 --log_level warn || fail "zero 0"
"${MPI[@]}" -np 2 "$RLHF" "${ARGS[@]}" --save_path "$W/off" --adam_offload --log_level warn || fail "offload"
for d in z0 off; do
  paste <(losses "$W/np1") <(losses "$W/$d") | awk '{ d = $1 - $2; if (d < 0) d = -d; if (d > 1e-4 * $1) bad = 1 } END { exit bad }' \
    || fail "$d diverged from 1 rank"
done
echo "ok: --zero_stage 0 and --adam_offload follow the same curve"

# A rank that throws mid-run: every rank exits non-zero, quickly.
start=$(date +%s)
RLHF_INJECT_FAILURE=sft_step:1 timeout 60 "${MPI[@]}" -np 2 "$RLHF" "${ARGS[@]}" --save_path "$W/inj" \
  --max_steps 1000 --max_epochs 100 > "$W/inj.log" 2>&1
code=$?
took=$(( $(date +%s) - start ))
[ $code -ne 0 ] || fail "injected failure: exit 0"
[ $code -ne 124 ] || fail "injected failure: the job hung (killed by timeout)"
grep -q "injected failure at sft_step on rank 1" "$W/inj.log" || { tail -5 "$W/inj.log"; fail "no injected-failure message"; }
echo "ok: injected failure on rank 1 ended the job with exit $code in ${took}s"

# Placement refusals are clear errors on every rank.
out=$("${MPI[@]}" -np 2 "$RLHF" "${ARGS[@]}" --save_path "$W/bad" --gen_ranks_per_node 1 2>&1)
[ $? -ne 0 ] && echo "$out" | grep -q "gen_ranks_per_node" || fail "generation ranks in sft not refused"
echo "ok: --gen_ranks_per_node in sft refused"
echo PASS
