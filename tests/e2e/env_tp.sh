#!/usr/bin/env bash
# Multi-turn environments (--env_command) with tensor-parallel engines (--vllm_tensor_parallel_size
# 2), on 2 simulated nodes of 2 ranks (one TP 2 engine per node, colocated with training): only an
# engine's TP rank 0 runs the environment and broadcasts its answers to its peer.
#  (a) GRPO with the built-in toy environment from a random tiny model: 2 steps give the TP 1 run's
#      rewards, turns and observation tokens (equal up to 1e-6) and its final weights fingerprint;
#  (b) rlhf generate with an environment program: one program per engine (2 on 4 ranks, where TP 1
#      starts 4), and the TP 1 run's records (token ids, action masks, turns, rewards equal,
#      log-probs within 1e-4); stop strings alone (no environment) too;
#  (c) the program crashing on TP rank 0 ends the job with the error naming it, a non-zero exit,
#      within seconds (no rank waits on a broadcast that never comes);
#  (d) with rlhf_emu (GPU engines on the CUDA emulator): rlhf generate with the toy on TP 2 GPU
#      engines follows TP 1 (bf16 near-ties can flip a token: 3/4 of the completions equal, those
#      with equal turns, masks and rewards).
# Usage: env_tp.sh <rlhf binary> <source dir>     (env MPIEXEC: mpiexec's path)
set -u
RLHF=$1
SRC=$2
# shellcheck source=lib/common.sh
. "$SRC/tests/e2e/lib/common.sh"
# shellcheck source=lib/resume.sh
. "$SRC/tests/e2e/lib/resume.sh"
MPI4=(timeout 300 "$MPIEXEC" --oversubscribe --bind-to none -np 4)
DIGITS="0,1,2,3,4,5,6,7,8,9"
TOY=(grpo --model_config "$SRC/examples/models/tiny.toml"
     --prompt_data "builtin:addition?n=64&digits=1&seed=1" --input_key input
     --env_command builtin:toy --stop_strings "$DIGITS" --env_max_turns 4
     --n_samples_per_prompt 4 --rollout_batch_size 8 --train_batch_size 32
     --micro_train_batch_size 8 --generate_max_len 16 --actor_learning_rate 1e-3 --max_steps 2
     --seed 3 --threads 1 --ranks_per_node 2)
# same_keys <a.jsonl> <b.jsonl> <tol> <keys...>: 2 records each, every key within tol; prints a's values.
same_keys() {
  python3 - "$@" <<'EOF'
import json, sys
a, b, tol, keys = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4:]
ra = [json.loads(l) for l in open(a) if l.strip()]
rb = [json.loads(l) for l in open(b) if l.strip()]
assert len(ra) == len(rb) == 2, (len(ra), len(rb))
for x, y in zip(ra, rb):
    for k in keys:
        assert abs(x[k] - y[k]) <= tol, (k, x[k], y[k])
print(" ".join(f"{k} {[r[k] for r in ra]}" for k in keys))
EOF
}

# (a) GRPO with the toy: TP 2 engines == TP 1 engines.
for tp in 1 2; do
  "${MPI4[@]}" "$RLHF" "${TOY[@]}" --vllm_tensor_parallel_size $tp --save_path "$W/toy$tp" \
    > "$W/toy$tp.log" 2>&1 || { tail "$W/toy$tp.log"; fail "toy GRPO with TP $tp exited"; }
done
grep -q "2 engines, 4 training ranks" "$W/toy2.log" || fail "toy2: expected 2 engines of TP 2"
summary=$(same_keys "$W/toy1/metrics.jsonl" "$W/toy2/metrics.jsonl" 1e-6 reward_mean \
  env_turns_mean env_observation_tokens) || fail "toy GRPO: TP 2 metrics differ from TP 1's"
python3 -c "import json,sys; r=[json.loads(l) for l in open(sys.argv[1])]; sys.exit(0 if min(x['env_turns_mean'] for x in r) > 1.2 else 1)" \
  "$W/toy2/metrics.jsonl" || fail "toy GRPO: episodes of one turn (the test would not compare observations)"
[ -n "$(fp "$W/toy2.log")" ] && [ "$(fp "$W/toy1.log")" = "$(fp "$W/toy2.log")" ] \
  || fail "toy GRPO: weights fingerprints differ: TP 1 $(fp "$W/toy1.log"), TP 2 $(fp "$W/toy2.log")"
echo "ok: GRPO with builtin:toy on TP 2 engines == TP 1: $summary, fingerprint $(fp "$W/toy2.log")"

# (b) rlhf generate with a program (which counts its starts), and stop strings alone.
printf '{"input": "%s"}\n' 1+2= 3+4= 5+6= 7+8= 9+1= 2+2= 4+4= 8+1= > "$W/prompts.jsonl"
cat > "$W/env.sh" <<EOF
echo started >> "\$1"
while read -r l; do echo '{"observation": "<5>", "reward": 0.5}'; done
EOF
GEN=(generate --pretrain "$W/toy1/model.h5" --dataset "$W/prompts.jsonl" --n_samples_per_prompt 2
     --generate_max_len 16 --stop_strings "$DIGITS" --seed 5 --threads 1 --ranks_per_node 2)
for tp in 1 2; do
  "${MPI4[@]}" "$RLHF" "${GEN[@]}" --vllm_tensor_parallel_size $tp --env_max_turns 3 \
    --env_command "sh $W/env.sh $W/starts$tp" --output_path "$W/gen$tp.jsonl" > "$W/gen$tp.log" 2>&1 \
    || { tail "$W/gen$tp.log"; fail "generate with a program, TP $tp, exited"; }
  "${MPI4[@]}" "$RLHF" "${GEN[@]}" --vllm_tensor_parallel_size $tp --output_path "$W/stop$tp.jsonl" \
    > "$W/stop$tp.log" 2>&1 || { tail "$W/stop$tp.log"; fail "generate with stop strings, TP $tp, exited"; }
done
[ "$(wc -l < "$W/starts1")" -eq 4 ] && [ "$(wc -l < "$W/starts2")" -eq 2 ] \
  || fail "programs started: TP 1 $(wc -l < "$W/starts1") (want 4), TP 2 $(wc -l < "$W/starts2") (want 2)"
compare_records() {  # <a.jsonl> <b.jsonl> <min multi-turn records>
  python3 - "$@" <<'EOF'
import json, sys
ra = [json.loads(l) for l in open(sys.argv[1])]
rb = [json.loads(l) for l in open(sys.argv[2])]
assert len(ra) == len(rb) == 16, (len(ra), len(rb))
multi = 0
for x, y in zip(ra, rb):
    for k in ["completion_token_ids", "finish_reason", "action_mask", "turns", "env_reward"]:
        assert x.get(k) == y.get(k), (k, x.get(k), y.get(k))
    assert max([abs(p - q) for p, q in zip(x["logprobs"], y["logprobs"])], default=0) < 1e-4
    multi += x.get("turns", 1) > 1
assert multi >= int(sys.argv[3]), multi
print(multi)
EOF
}
multi=$(compare_records "$W/gen1.jsonl" "$W/gen2.jsonl" 4) || fail "generate with a program: TP 2 differs from TP 1"
compare_records "$W/stop1.jsonl" "$W/stop2.jsonl" 0 > /dev/null || fail "generate with stop strings: TP 2 differs from TP 1"
grep -q '"finish_reason": *"stop_string"' "$W/stop2.jsonl" || fail "generate with stop strings: no sample ended at one"
echo "ok: generate on TP 2 engines: one program per engine (2; TP 1: 4), TP 1's records ($multi of 16 multi-turn); stop strings alone too"

# (c) The program crashing on TP rank 0: one clear error, every rank exits, fast.
t0=$SECONDS
out=$("${MPI4[@]}" "$RLHF" "${TOY[@]}" --vllm_tensor_parallel_size 2 --env_timeout 20 \
  --env_command "read -r l; echo env crashed >&2; exit 3" --save_path "$W/crash" 2>&1)
rc=$?
[ $rc -ne 0 ] && [ $rc -ne 124 ] || fail "crash on TP rank 0: rc $rc (124 = the job hung)"
echo "$out" | grep -q -- "--env_command 'read -r l; echo env crashed >&2; exit 3'.*exited (exit status 3)" \
  || { echo "$out" | tail -5; fail "crash on TP rank 0: the error does not name the program and its exit"; }
[ $((SECONDS - t0)) -lt 30 ] || fail "crash on TP rank 0: the job took $((SECONDS - t0)) s to end"
echo "ok: a program crashing on TP rank 0 ends the TP 2 job: exit $rc after $((SECONDS - t0)) s"

# (d) GPU engines on the emulator: rlhf generate with the toy, TP 2 against TP 1.
EMU=$(dirname "$RLHF")/rlhf_emu
if [ ! -x "$EMU" ]; then
  echo "PASS (GPU part skipped: $EMU not built)"
  exit 0
fi
export RLHF_CUDA_EMU_DEVICES=8
for tp in 1 2; do
  "${MPI4[@]}" "$EMU" "${GEN[@]}" --device cuda --vllm_tensor_parallel_size $tp \
    --env_command builtin:toy --output_path "$W/emu$tp.jsonl" > "$W/emu$tp.log" 2>&1 \
    || { tail "$W/emu$tp.log"; fail "emulator generate with builtin:toy, TP $tp, exited"; }
done
# bf16 partial sums rounded before the all-reduce can flip a greedy near-tie (cuda_emu_tp.sh):
# at least 3/4 of the completions equal, and those with the same turns, masks and rewards.
summary=$(python3 - "$W/emu1.jsonl" "$W/emu2.jsonl" <<'EOF'
import json, sys
ra = [json.loads(l) for l in open(sys.argv[1])]
rb = [json.loads(l) for l in open(sys.argv[2])]
assert len(ra) == len(rb) == 16, (len(ra), len(rb))
same = [(x, y) for x, y in zip(ra, rb) if x["completion_token_ids"] == y["completion_token_ids"]]
assert 4 * len(same) >= 3 * len(ra), len(same)
for x, y in same:
    for k in ["action_mask", "turns", "env_reward", "finish_reason"]:
        assert x[k] == y[k], (k, x[k], y[k])
multi = sum(y["turns"] > 1 for y in rb)
assert multi >= 4, multi
print(f"{len(same)} of 16 completions equal, {multi} multi-turn")
EOF
) || fail "emulator generate with builtin:toy: TP 2 does not follow TP 1"
echo "ok: generate with builtin:toy on TP 2 GPU engines (emulator) follows TP 1: $summary"
echo "PASS"
