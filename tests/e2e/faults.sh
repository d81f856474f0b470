#!/usr/bin/env bash
# Faults that must end a job cleanly, on 2 ranks:
#  (a) a stopped rank (SIGSTOP: a hung node that keeps its sockets open) in sft, grpo and generate:
#      the --comm_timeout watchdog names the collective, communicator, step and phase (or the
#      silent engine) and ends the job on every rank in < 2x the timeout;
#  (b) SIGUSR1 to mpirun (what `sbatch --signal=USR1@120` sends; mpirun forwards it): grpo finishes
#      its step, writes a checkpoint, exits 3, and --load_checkpoint continues exactly as a run
#      that was never stopped (same metrics, same final weights);
#  (c) SIGTERM to the ranks (what srun and Slurm send at the time limit): the same for sft;
#  (d) SIGTERM to `rlhf bench rl` in its GRPO loop: the bench ends after that step (exit 1, naming
#      the signal) instead of going on with its other runs, and removes its folder.
# Usage: faults.sh <rlhf binary> <source dir>     (env MPIEXEC: mpiexec's path)
set -u
RLHF=$1
SRC=$2
# shellcheck source=lib/common.sh
. "$SRC/tests/e2e/lib/common.sh"
# shellcheck source=lib/resume.sh
. "$SRC/tests/e2e/lib/resume.sh"
TASK="builtin:addition?n=2000&digits=1&seed=1"
now() { date +%s.%N; }

SFT=(sft --model_config "$SRC/examples/models/tiny.toml" --dataset "$TASK" --max_len 16
     --train_batch_size 32 --micro_train_batch_size 8 --learning_rate 3e-3 --max_epochs 100
     --seed 1 --threads 1)
"$RLHF" "${SFT[@]}" --max_steps 20 --save_path "$W/sft" --log_level warn || fail "sft warm start exited $?"
GRPO=(grpo --pretrain "$W/sft/model.h5" --prompt_data "$TASK" --input_key input --label_key label
      --reward math --n_samples_per_prompt 4 --rollout_batch_size 8 --train_batch_size 32
      --micro_train_batch_size 8 --generate_max_len 8 --seed 1 --actor_learning_rate 3e-4)

# (a) stopped_rank <name> <point> <expected message regex> <command...>: rank 1 stops itself at
# <point>; the job must end (non-zero) within 2 x T of the stop, with the message.
T=5
stopped_rank() {
  local name=$1 point=$2 want=$3
  shift 3
  RLHF_INJECT_STOP="$point:1" timeout 120 "${MPI[@]}" -np 2 "$RLHF" "$@" --comm_timeout $T \
    > "$W/$name.log" 2>&1 &
  local pid=$! t_stop=""
  for _ in $(seq 600); do
    grep -q "injected stop" "$W/$name.log" && { t_stop=$(now); break; }
    kill -0 $pid 2> /dev/null || break
    sleep 0.1
  done
  wait $pid
  local code=$? t_end
  t_end=$(now)
  [ -n "$t_stop" ] || { tail "$W/$name.log"; fail "$name: rank 1 never stopped"; }
  [ $code -ne 0 ] || fail "$name: exit 0"
  [ $code -ne 124 ] || fail "$name: the job hung (killed by timeout 120)"
  grep -qE -- "$want" "$W/$name.log" || { tail "$W/$name.log"; fail "$name: no message /$want/"; }
  local took
  took=$(python3 -c "print(f'{$t_end - $t_stop:.1f}')")
  python3 -c "import sys; sys.exit(0 if $took < 2 * $T else 1)" \
    || fail "$name: the job took ${took}s after the stop (limit $((2 * T))s)"
  echo "ok: $name: stopped rank 1 -> exit $code ${took}s after the stop (--comm_timeout $T): $(grep -m1 -oE -- "$want" "$W/$name.log")"
}
stopped_rank sft_stopped sft_step \
  "rank 0: all_reduce on train_comm has not completed after [0-9]+ s \(sft step 1/4" \
  "${SFT[@]}" --max_steps 4 --save_path "$W/sft_stop"
stopped_rank grpo_stopped rl_step \
  "rank 0: [a-z_]+ on [a-z_]+ has not completed after [0-9]+ s \(RL step 1, rollout" \
  "${GRPO[@]}" --max_steps 3 --save_path "$W/grpo_stop" --ckpt_path "$W/grpo_stop/ckpt"
printf '{"input": "1+1="}\n%.0s' $(seq 8) > "$W/prompts.jsonl"
stopped_rank generate_stopped generate "engine 1 has sent no progress for [0-9]+ s" \
  generate --pretrain "$W/sft/model.h5" --dataset "$W/prompts.jsonl" --input_key input \
  --generate_max_len 8 --output_path "$W/gen.jsonl"


# preempt <name> <how: usr1-mpirun | term-ranks> <command...>: signals the job once its first
# step is in metrics.jsonl; the job must exit 3 after writing a checkpoint.
preempt() {
  local name=$1 how=$2
  shift 2
  timeout 300 "${MPI[@]}" -np 2 "$RLHF" "$@" > "$W/$name.log" 2>&1 &
  local pid=$!
  for _ in $(seq 3000); do
    [ -s "$W/$name/metrics.jsonl" ] && break
    kill -0 $pid 2> /dev/null || break
    sleep 0.1
  done
  if [ "$how" = usr1-mpirun ]; then
    # timeout's child is mpirun.
    kill -USR1 "$(pgrep -P $pid)"
  else
    # As srun does: every rank (mpirun's children) gets SIGTERM itself.
    for p in $(pgrep -P "$(pgrep -P $pid)"); do kill -TERM "$p"; done
  fi
  wait $pid
  local code=$?
  [ $code -eq 3 ] || { tail "$W/$name.log"; fail "$name: exit $code after the signal, expected 3"; }
  grep -qE "SIG(USR1|TERM) received: stopped after step [0-9]+/" "$W/$name.log" \
    || fail "$name: no stop message"
  ls "$W/$name/ckpt"/step_*.h5 > /dev/null 2>&1 || fail "$name: no checkpoint written"
  echo "ok: $name: $how -> exit 3: $(grep -m1 -oE "SIG(USR1|TERM) received: stopped after step [0-9/]+" "$W/$name.log")"
}

# (b) grpo: SIGUSR1 to mpirun, then resume == straight.
N=8
G=("${GRPO[@]}" --max_steps $N)
"${MPI[@]}" -np 2 "$RLHF" "${G[@]}" --save_path "$W/g_straight" --ckpt_path "$W/g_straight/ckpt" \
  > "$W/g_straight.log" 2>&1 || { tail "$W/g_straight.log"; fail "grpo straight run exited"; }
preempt g_pre usr1-mpirun "${G[@]}" --save_path "$W/g_pre" --ckpt_path "$W/g_pre/ckpt"
"${MPI[@]}" -np 2 "$RLHF" "${G[@]}" --save_path "$W/g_pre" --ckpt_path "$W/g_pre/ckpt" \
  --load_checkpoint > "$W/g_resume.log" 2>&1 || { tail "$W/g_resume.log"; fail "grpo resume exited"; }
grep -q "settings that differ" "$W/g_resume.log" && fail "grpo: same settings reported as changed"
same_metrics "$W/g_straight/metrics.jsonl" "$W/g_pre/metrics.jsonl" \
  || fail "grpo: preempted + resumed differs from straight"
[ -n "$(fp "$W/g_straight.log")" ] && [ "$(fp "$W/g_straight.log")" = "$(fp "$W/g_resume.log")" ] \
  || fail "grpo: final weights differ after preemption"
echo "ok: grpo preempted by SIGUSR1 and resumed == $N steps straight (weights $(fp "$W/g_resume.log"))"

# (c) sft: SIGTERM to the ranks, then resume == straight.
S=("${SFT[@]}" --max_steps 24)
"${MPI[@]}" -np 2 "$RLHF" "${S[@]}" --save_path "$W/s_straight" --ckpt_path "$W/s_straight/ckpt" \
  > "$W/s_straight.log" 2>&1 || { tail "$W/s_straight.log"; fail "sft straight run exited"; }
preempt s_pre term-ranks "${S[@]}" --save_path "$W/s_pre" --ckpt_path "$W/s_pre/ckpt"
"${MPI[@]}" -np 2 "$RLHF" "${S[@]}" --save_path "$W/s_pre" --ckpt_path "$W/s_pre/ckpt" \
  --load_checkpoint > "$W/s_resume.log" 2>&1 || { tail "$W/s_resume.log"; fail "sft resume exited"; }
grep -q "resumed from .*step_[0-9]*.h5 at step" "$W/s_resume.log" || fail "sft did not resume"
same_metrics "$W/s_straight/metrics.jsonl" "$W/s_pre/metrics.jsonl" \
  || fail "sft: preempted + resumed differs from straight"
echo "ok: sft preempted by SIGTERM and resumed == 24 steps straight (every loss and grad norm equal)"

# (d) bench rl: SIGTERM once its loop has started (the loop writes its prompts after installing
# its handlers).
B="$W/bench_term.log"
(cd "$W" && exec timeout 120 "$RLHF" bench rl --max_steps 100 --generate_max_len 8 \
  --rollout_batch_size 2 --n_samples_per_prompt 2 --threads 1) > "$B" 2>&1 &
pid=$!
for _ in $(seq 1200); do
  grep -q "written to" "$B" && break
  kill -0 $pid 2> /dev/null || break
  sleep 0.1
done
dir=$(grep -m1 -oE "/tmp/rlhf_bench_rl_[A-Za-z0-9]+" "$B")
[ -n "$dir" ] || { tail "$B"; fail "bench rl: its loop never started"; }
kill -TERM "$(pgrep -P $pid)"
wait $pid
code=$?
[ $code -eq 1 ] || { tail "$B"; fail "bench rl: exit $code after SIGTERM, expected 1"; }
grep -q "bench rl: stopped by SIGTERM; the benchmark's remaining runs are skipped" "$B" \
  || { tail "$B"; fail "bench rl: no stop message"; }
grep -q "sft" "$B" && fail "bench rl: went on to its SFT warm start after the signal"
[ -e "$dir" ] && fail "bench rl: left $dir behind"
[ -e "$W/ckpt" ] && fail "bench rl: wrote ./ckpt"
echo "ok: bench rl: SIGTERM in its loop -> exit 1 after the step, folder removed"
echo PASS
