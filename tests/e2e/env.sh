#!/usr/bin/env bash
# Multi-turn rollouts with an environment (--env_command, --env_max_turns, --stop_strings):
#  (a) GRPO with the built-in toy environment on 2 ranks from a random tiny model: the reward
#      rises (the model learns to end turns), and an lr ~ 0 control does not; the metrics carry
#      turns, observation tokens and the environment's time;
#  (b) rlhf generate with the environment on 2 ranks writes the same file as on 1 rank, with
#      action masks whose zeros are the observations;
#  (c) k steps + checkpoint + resume + k steps == 2k steps straight, with the environment;
#  (d) examples/env/calculator.py (a real program, python3) in GRPO and rlhf eval end to end;
#  (e) faults on 2 ranks — the program crashing, hanging, printing garbage, flooding — are one
#      clear error naming --env_command, a non-zero exit, and no hang.
# Usage: env.sh <rlhf binary> <source dir>     (env MPIEXEC: mpiexec's path)
set -u
RLHF=$1
SRC=$2
# shellcheck source=lib/common.sh
. "$SRC/tests/e2e/lib/common.sh"
# shellcheck source=lib/resume.sh
. "$SRC/tests/e2e/lib/resume.sh"
TASK="builtin:addition?n=200&digits=1&seed=1"
# The toy: a turn ends at any digit; each turn end earns (turn + 1) / 4, up to 4 turns.
TOY=(grpo --model_config "$SRC/examples/models/tiny.toml" --prompt_data "$TASK" --input_key input
     --env_command builtin:toy --stop_strings "0,1,2,3,4,5,6,7,8,9" --env_max_turns 4
     --n_samples_per_prompt 8 --rollout_batch_size 8 --train_batch_size 64
     --micro_train_batch_size 16 --generate_max_len 20 --seed 3 --lr_scheduler constant)
mean_of() {  # <metrics.jsonl> <key> <lo> <hi>: mean of records [lo, hi)
  python3 - "$1" "$2" "$3" "$4" <<'EOF'
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
v = [r[sys.argv[2]] for r in recs[int(sys.argv[3]):int(sys.argv[4])]]
print(f"{sum(v) / len(v):.4f}")
EOF
}

# (a) Learning, and the lr ~ 0 control.
for run in learn:3e-3 frozen:1e-12; do
  name=${run%%:*}
  timeout 300 "${MPI[@]}" -np 2 "$RLHF" "${TOY[@]}" --actor_learning_rate "${run#*:}" \
    --max_steps 30 --save_path "$W/$name" --ckpt_path "$W/$name/ckpt" > "$W/$name.log" 2>&1 \
    || { tail "$W/$name.log"; fail "toy GRPO ($name) exited"; }
done
first=$(mean_of "$W/learn/metrics.jsonl" reward_mean 0 5)
last=$(mean_of "$W/learn/metrics.jsonl" reward_mean 25 30)
c_first=$(mean_of "$W/frozen/metrics.jsonl" reward_mean 0 5)
c_last=$(mean_of "$W/frozen/metrics.jsonl" reward_mean 25 30)
python3 -c "import sys; sys.exit(0 if $last > $first + 0.2 else 1)" \
  || fail "toy reward did not rise: first 5 steps $first, last 5 steps $last"
python3 -c "import sys; sys.exit(0 if abs($c_last - $c_first) < 0.1 else 1)" \
  || fail "the lr ~ 0 control moved: first 5 steps $c_first, last 5 steps $c_last"
echo "ok: toy environment GRPO: reward $first -> $last (lr ~ 0 control: $c_first -> $c_last)"
python3 - "$W/learn/metrics.jsonl" <<'EOF' || fail "metrics.jsonl misses the environment's metrics"
import json, sys
for l in open(sys.argv[1]):
    r = json.loads(l)
    for k in ["env_s", "env_turns_mean", "env_observation_tokens", "env_reward_fraction"]:
        assert k in r, k
    assert 1 <= r["env_turns_mean"] <= 4, r["env_turns_mean"]
last = json.loads(l)
assert last["env_observation_tokens"] > 0 and last["env_turns_mean"] > 1.5, last
EOF
grep -qE "env [0-9.]+s, [0-9.]+ turns, [0-9]+ obs tokens" "$W/learn.log" || fail "no env phase in the step line"
echo "ok: metrics and the step line carry env time, turns and observation tokens"

# (b) rlhf generate with the environment: 2 ranks == 1 rank, byte for byte.
printf '{"input": "%s"}\n' 1+2= 3+4= 5+6= 7+8= 9+1= > "$W/prompts.jsonl"
GEN=(generate --pretrain "$W/learn/model.h5" --dataset "$W/prompts.jsonl" --n_samples_per_prompt 3
     --generate_max_len 20 --env_command builtin:toy --stop_strings "0,1,2,3,4,5,6,7,8,9"
     --seed 5)
timeout 120 "${MPI[@]}" -np 2 "$RLHF" "${GEN[@]}" --output_path "$W/gen2.jsonl" > "$W/gen2.log" 2>&1 \
  || { tail "$W/gen2.log"; fail "generate on 2 ranks exited"; }
timeout 120 "${MPI[@]}" -np 1 "$RLHF" "${GEN[@]}" --threads 1 --output_path "$W/gen1.jsonl" > "$W/gen1.log" 2>&1 \
  || { tail "$W/gen1.log"; fail "generate on 1 rank exited"; }
cmp -s "$W/gen1.jsonl" "$W/gen2.jsonl" || fail "generate with the environment: 2 ranks differ from 1 rank"
python3 - "$W/gen1.jsonl" <<'EOF' || fail "generate's multi-turn records are wrong"
import json, re, sys
multi = 0
for l in open(sys.argv[1]):
    r = json.loads(l)
    ids, mask = r["completion_token_ids"], r["action_mask"]
    assert len(mask) == len(ids)
    # The zeros are the toy's observations "<d>", each right after a digit the model wrote.
    obs = bytes(t for t, m in zip(ids, mask) if m == 0).decode()
    assert re.fullmatch(r"(<\d>)*", obs[:3 * (len(obs) // 3)]), obs
    assert len(obs) // 3 <= r["turns"], r
    multi += r["turns"] > 1
    assert r["finish_reason"] in ("stop", "length", "env_done", "max_turns"), r["finish_reason"]
assert multi >= 5, multi
EOF
echo "ok: rlhf generate with the environment: 1 rank == 2 ranks, masks mark the observations"

# (c) Resume with the environment: 2 + 2 steps == 4 steps straight.
K=2
RES=("${TOY[@]}" --actor_learning_rate 3e-3)
timeout 120 "${MPI[@]}" -np 2 "$RLHF" "${RES[@]}" --max_steps $((2 * K)) --save_path "$W/straight" \
  --ckpt_path "$W/straight/ckpt" --save_steps $K > "$W/straight.log" 2>&1 \
  || { tail "$W/straight.log"; fail "straight run exited"; }
timeout 120 "${MPI[@]}" -np 2 "$RLHF" "${RES[@]}" --max_steps $K --save_path "$W/resumed" \
  --ckpt_path "$W/resumed/ckpt" --save_steps $K > "$W/first.log" 2>&1 \
  || { tail "$W/first.log"; fail "first half exited"; }
timeout 120 "${MPI[@]}" -np 2 "$RLHF" "${RES[@]}" --max_steps $((2 * K)) --save_path "$W/resumed" \
  --ckpt_path "$W/resumed/ckpt" --save_steps $K --load_checkpoint > "$W/second.log" 2>&1 \
  || { tail "$W/second.log"; fail "resumed run exited"; }
grep -q "resumed from .*step_$K.h5 at step $K" "$W/second.log" || fail "the run did not resume"
same_metrics "$W/straight/metrics.jsonl" "$W/resumed/metrics.jsonl" \
  || fail "k + k steps after resume differ from 2k steps straight"
fa=$(fp "$W/straight.log")
fb=$(fp "$W/second.log")
[ -n "$fa" ] && [ "$fa" = "$fb" ] || fail "final weights differ: $fa (straight) vs $fb (resumed)"
echo "ok: with the environment, $K steps + resume + $K steps == $((2 * K)) steps straight ($fa)"

# (d) The calculator example in GRPO and in rlhf eval (a real program, started on each rank).
CALC="python3 $SRC/examples/env/calculator.py"
timeout 120 "${MPI[@]}" -np 2 "$RLHF" grpo --pretrain "$W/learn/model.h5" --prompt_data "$TASK" \
  --input_key input --label_key label --reward math --env_command "$CALC" --stop_strings "</calc>" \
  --env_max_turns 3 --n_samples_per_prompt 4 --rollout_batch_size 4 --train_batch_size 16 \
  --micro_train_batch_size 8 --generate_max_len 24 --max_steps 2 --seed 1 \
  --save_path "$W/calc" > "$W/calc.log" 2>&1 || { tail "$W/calc.log"; fail "GRPO with calculator.py exited"; }
[ "$(grep -c '"env_turns_mean"' "$W/calc/metrics.jsonl")" -eq 2 ] || fail "calculator GRPO: metrics"
timeout 120 "${MPI[@]}" -np 2 "$RLHF" eval --pretrain "$W/learn/model.h5" --dataset "$TASK" \
  --max_samples 8 --input_key input --label_key label --reward math --env_command "$CALC" \
  --stop_strings "</calc>" --generate_max_len 16 --output_path "$W/eval.jsonl" > "$W/eval.log" 2>&1 \
  || { tail "$W/eval.log"; fail "eval with calculator.py exited"; }
grep -q '"accuracy"' "$W/eval.jsonl" || fail "eval with calculator.py: no summary"
echo "ok: examples/env/calculator.py runs in GRPO (2 steps) and rlhf eval on 2 ranks"

# (e) Faults on 2 ranks: one clear error naming the program, non-zero exit, no hang.
cat > "$W/flood.py" <<'EOF'
import sys
for line in sys.stdin:
    print('{"observation": "x"}\n{"observation": "y"}', flush=True)
EOF
expect_env_error() {  # <name> <needle> <env command>
  local t0=$SECONDS
  out=$(timeout 60 "${MPI[@]}" -np 2 "$RLHF" "${TOY[@]}" --actor_learning_rate 1e-3 --max_steps 2 \
    --env_command "$3" --env_timeout 3 --save_path "$W/bad_$1" 2>&1)
  rc=$?
  [ $rc -ne 0 ] && [ $rc -ne 124 ] || fail "$1: rc $rc (124 = the job hung)"
  echo "$out" | grep -q -- "--env_command '$3'" || { echo "$out" | tail -5; fail "$1: the error does not name the program"; }
  echo "$out" | grep -q -- "$2" || { echo "$out" | tail -5; fail "$1: no '$2'"; }
  echo "ok: $1: exit $rc after $((SECONDS - t0))s: $(echo "$out" | grep -m1 -o -- "--env_command '$3'.*" | cut -c1-150)"
}
expect_env_error crash "exited (exit status 3)" "read -r l; echo env crashed >&2; exit 3"
expect_env_error hang "timed out after 3s (--env_timeout)" "sleep 100"
expect_env_error garbage "is not JSON" "while read -r l; do echo hello; done"
expect_env_error flood "asked" "python3 $W/flood.py"
