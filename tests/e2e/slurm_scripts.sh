#!/usr/bin/env bash
# The sbatch examples in scripts/slurm stay runnable: the rlhf command of each parses (no usage
# error, exit 2) — it then fails only on the missing data or GPU of this machine — and each
# requeues on exit status 3 (a run stopped by SIGUSR1/SIGTERM after writing its checkpoint).
# Then two of them run for real without Slurm (LAUNCH=mpirun, 4 ranks as 2 simulated nodes, the
# job's flags given after the script name): grpo_gpu.sbatch on the CUDA emulator (rlhf_emu, when
# built), and sft_srun.sbatch stopped by a SIGTERM to the batch shell — which must pass it on,
# exit 3 after a checkpoint and call `scontrol requeue` (a stand-in here) — then run again, resuming.
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
  cmd=$(awk '/"\$RLHF" /{p=1} p{print} p&&!/\\$/{exit}' "$f" | tr -d '\\\n' | sed 's/.*"\$RLHF"//; s/ &$//; s/ "\$@"$//')
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

# --- run them: 4 ranks on this host as 2 nodes of 2 (the flags after the script name override)
MPIEXEC=${MPIEXEC:-mpirun}
LAUNCH="$MPIEXEC -np 4 --oversubscribe --allow-run-as-root --bind-to none"
TASK="builtin:addition?n=256&digits=1&seed=1"
mkdir -p "$W/bin" "$W/job"
printf '#!/bin/sh\necho "$@" >> "%s/requeued"\n' "$W" > "$W/bin/scontrol"  # stand-in for Slurm's
chmod +x "$W/bin/scontrol"
export PATH="$W/bin:$PATH" SLURM_SUBMIT_DIR="$W/job" SLURM_JOB_ID=7 SLURM_CPUS_PER_TASK=1
"$RLHF" sft --model_config "$SRC/examples/models/tiny.toml" --dataset "$TASK" --max_len 16 \
  --train_batch_size 16 --micro_train_batch_size 8 --max_steps 2 --threads 1 \
  --save_path "$W/base" > "$W/base.log" 2>&1 || fail "base model: $(tail -2 "$W/base.log")"
EMU=$(dirname "$RLHF")/rlhf_emu
if [ -x "$EMU" ]; then
  LAUNCH="$LAUNCH" RLHF="$EMU" RLHF_CUDA_EMU_DEVICES=2 MODEL="$W/base/model.h5" \
    timeout 300 bash "$SRC/scripts/slurm/grpo_gpu.sbatch" --prompt_data "$TASK" --input_key input \
    --label_key label --apply_chat_template false --eval_dataset "$TASK" --eval_steps 100 \
    --n_samples_per_prompt 2 --rollout_batch_size 4 --train_batch_size 8 \
    --micro_train_batch_size 2 --generate_max_len 6 --max_steps 2 --ranks_per_node 2 \
    --threads 1 > "$W/grpo.log" 2>&1 || { tail -5 "$W/grpo.log"; fail "grpo_gpu.sbatch: exit $?"; }
  grep -q "device: cuda" "$W/grpo.log" || fail "grpo_gpu.sbatch did not run on (emulated) GPUs"
  [ "$(wc -l < "$W/job/grpo-7/metrics.jsonl")" -eq 2 ] || fail "grpo_gpu.sbatch: not 2 steps"
  echo "ok: grpo_gpu.sbatch ran 2 steps on 4 emulated GPUs, 2 simulated nodes"
else
  echo "skip: grpo_gpu.sbatch run ($EMU not built)"
fi

SFT_FLAGS=(--model_config "$SRC/examples/models/tiny.toml" --dataset "$TASK" --input_key input
  --output_key label --max_len 16 --train_batch_size 16 --micro_train_batch_size 4 --max_epochs 50
  --ranks_per_node 2 --threads 1 --zero_stage 3 --adam_offload false --gradient_checkpointing false)
LAUNCH="$LAUNCH" RLHF="$RLHF" bash "$SRC/scripts/slurm/sft_srun.sbatch" "${SFT_FLAGS[@]}" > "$W/sft1.log" 2>&1 &
job=$!
for _ in $(seq 120); do grep -q "step 5/" "$W/sft1.log" && break; sleep 0.5; done
grep -q "step 5/" "$W/sft1.log" || { kill -- -$job 2>/dev/null; tail -3 "$W/sft1.log"; fail "sft_srun.sbatch did not start"; }
kill -TERM $job  # what Slurm does to the batch shell on preemption
wait $job
code=$?
[ $code -eq 3 ] || { tail -5 "$W/sft1.log"; fail "sft_srun.sbatch after SIGTERM: exit $code, want 3"; }
grep -q "requeue 7" "$W/requeued" 2>/dev/null || fail "sft_srun.sbatch did not requeue the job"
ls "$W/job/ckpt-7/checkpoints/"step_*.h5 > /dev/null 2>&1 || fail "no checkpoint after SIGTERM"
LAUNCH="$LAUNCH" RLHF="$RLHF" timeout 300 bash "$SRC/scripts/slurm/sft_srun.sbatch" "${SFT_FLAGS[@]}" \
  --max_steps "$(($(ls "$W/job/ckpt-7/checkpoints" | sed -n 's/step_\([0-9]*\)\.h5/\1/p' | sort -n | tail -1) + 2))" \
  > "$W/sft2.log" 2>&1 || { tail -5 "$W/sft2.log"; fail "sft_srun.sbatch rerun: exit $?"; }
grep -q "resumed from" "$W/sft2.log" || fail "the requeued run did not resume"
echo "ok: sft_srun.sbatch: SIGTERM to the batch shell -> checkpoint, exit 3, requeue; the rerun resumed"
echo PASS
