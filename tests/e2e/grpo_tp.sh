#!/usr/bin/env bash
# rlhf grpo / ppo with tensor-parallel generation engines (--vllm_tensor_parallel_size 2), on the
# built-in 1-digit addition task from a random tiny model (no download):
#  (a) 4 ranks, colocated, two engines of 2 ranks: 2 GRPO steps run, write 2 metrics records, and
#      end with the same weights fingerprint as the same run with TP 1 engines;
#  (b) 4 ranks, disaggregated (one node of 4: 2 training ranks, one engine of 2): the same;
#  (c) greedy PPO on 2 ranks (one engine of 2 ranks) == the same with TP 1;
#  (e) LoRA (--lora_rank 8) with the disaggregated placement of (b): the adapters broadcast to
#      both ranks of the TP 2 engine, each applying its slice; the same fingerprint as TP 1;
#  (d) a TP size that cannot be placed (3 on nodes of 2) exits non-zero with a clear message on
#      every rank, without hanging.
# Usage: grpo_tp.sh <rlhf binary> <source dir>     (env MPIEXEC: mpiexec's path)
set -u
RLHF=$1
SRC=$2
# shellcheck source=lib/common.sh
. "$SRC/tests/e2e/lib/common.sh"
# shellcheck source=lib/resume.sh
. "$SRC/tests/e2e/lib/resume.sh"
MPI=(timeout 300 "$MPIEXEC" --oversubscribe --bind-to none)
# The keyword reward (the share of 36 letters and digits a completion contains) varies between a
# random model's completions, so the advantages are not zero and every run trains (the math reward
# is 0 on a random model: runs that do not train would all end at the initial weights).
RL=(--model_config "$SRC/examples/models/tiny.toml" --prompt_data "builtin:addition?n=64&digits=1&seed=1"
    --input_key input --label_key label --reward keyword
    --reward_keywords "a,b,c,d,e,f,g,h,i,j,k,l,m,n,o,p,q,r,s,t,u,v,w,x,y,z,0,1,2,3,4,5,6,7,8,9"
    --n_samples_per_prompt 4 --rollout_batch_size 8
    --train_batch_size 32 --micro_train_batch_size 4 --generate_max_len 6 --actor_learning_rate 1e-3
    --max_steps 2 --seed 1 --threads 1)
# run <name> <np> <command> <args...>: runs, checks the exit status, 2 metrics records, and that
# the policy trains: step 2 (the first with a learning rate above 0 after warm-up) has a policy
# gradient (measured: GRPO ~1.9, greedy PPO ~4.9; the math reward's zero advantages give 0), so
# the saved weights are not the initial ones.
run() {
  local name=$1 np=$2 cmd=$3
  shift 3
  "${MPI[@]}" -np "$np" "$RLHF" "$cmd" "${RL[@]}" "$@" --save_path "$W/$name" \
    --ckpt_path "$W/$name/ckpt" > "$W/$name.log" 2>&1 || { tail "$W/$name.log"; fail "$name exited"; }
  [ "$(wc -l < "$W/$name/metrics.jsonl")" -eq 2 ] || fail "$name: metrics.jsonl does not have 2 records"
  [ -n "$(fp "$W/$name.log")" ] || fail "$name: no weights fingerprint in the log"
  python3 - "$W/$name/metrics.jsonl" <<'PY' || fail "$name: the policy did not train"
import json, sys
last = [json.loads(l) for l in open(sys.argv[1])][-1]
assert last["actor_lr"] > 0 and last["actor_grad_norm"] > 1e-3, last
PY
}
same() {  # same <what> <run a> <run b>
  [ "$(fp "$W/$2.log")" = "$(fp "$W/$3.log")" ] \
    || fail "$1: fingerprints differ: $2 $(fp "$W/$2.log") vs $3 $(fp "$W/$3.log")"
  echo "ok: $1: $2 == $3 (weights fingerprint $(fp "$W/$2.log"))"
}

# (a) colocated, 4 ranks on 2 simulated nodes: 2 engines of 2 ranks vs 4 engines of 1.
run col_tp2 4 grpo --ranks_per_node 2 --vllm_tensor_parallel_size 2
grep -q "2 engines, 4 training ranks" "$W/col_tp2.log" || fail "col_tp2: expected 2 engines, 4 training ranks"
run col_tp1 4 grpo --ranks_per_node 2 --vllm_tensor_parallel_size 1
same "grpo colocated, 4 ranks" col_tp2 col_tp1

# (b) disaggregated: one node of 4, 2 generation ranks forming one TP 2 engine.
run dis_tp2 4 grpo --ranks_per_node 4 --gen_ranks_per_node 2 --vllm_tensor_parallel_size 2
grep -q "1 engines, 2 training ranks" "$W/dis_tp2.log" || fail "dis_tp2: expected 1 engine, 2 training ranks"
run dis_tp1 4 grpo --ranks_per_node 4 --gen_ranks_per_node 2 --vllm_tensor_parallel_size 1
same "grpo disaggregated, 4 ranks" dis_tp2 dis_tp1

# (c) greedy PPO (critic, GAE) on 2 ranks.
run ppo_tp2 2 ppo --greedy --vllm_tensor_parallel_size 2
run ppo_tp1 2 ppo --greedy --vllm_tensor_parallel_size 1
same "greedy ppo, 2 ranks" ppo_tp2 ppo_tp1

# (e) LoRA with a TP 2 engine (disaggregated: adapter-only sync over the intercommunicator). The
# math reward is 0 on a random model (nothing trains in the runs above but PPO's); the keyword
# reward (the share of 36 letters and digits in a completion) varies, so the adapters train: the
# saved model (base + adapters merged) must be TP 1's, and at step 3 the policy has moved from the
# base (kl > 1e-3) while the engines still agree with the trainer (mismatch kl < 1e-7, measured
# ~1e-10: an engine that dropped its adapters' slices would show the policy's kl from the base).
LORA=(--reward keyword --reward_keywords "a,b,c,d,e,f,g,h,i,j,k,l,m,n,o,p,q,r,s,t,u,v,w,x,y,z,0,1,2,3,4,5,6,7,8,9"
      --actor_learning_rate 1e-2 --max_steps 3 --lora_rank 8 --ranks_per_node 4 --gen_ranks_per_node 2)
for tp in 2 1; do
  "${MPI[@]}" -np 4 "$RLHF" grpo "${RL[@]}" "${LORA[@]}" --vllm_tensor_parallel_size $tp \
    --save_path "$W/lora_tp$tp" > "$W/lora_tp$tp.log" 2>&1 || { tail "$W/lora_tp$tp.log"; fail "lora_tp$tp exited"; }
done
grep -q "LoRA r=8" "$W/lora_tp2.log" || fail "lora_tp2: no LoRA recap"
same "grpo LoRA disaggregated, 4 ranks" lora_tp2 lora_tp1
python3 - "$W/lora_tp2/metrics.jsonl" <<'PY' || fail "lora_tp2: the engine does not follow the trained adapters"
import json, sys
last = [json.loads(l) for l in open(sys.argv[1])][-1]
print(f"lora_tp2 step {last['step']}: kl {last['kl_mean']:.2e} (policy vs base), mismatch kl {last['mismatch_kl']:.2e}")
assert last["step"] == 3 and last["kl_mean"] > 1e-3 and last["mismatch_kl"] < 1e-7
PY

# (d) TP 3 cannot be cut from nodes of 2 generation ranks: a clear refusal, every rank exits.
"${MPI[@]}" -np 4 "$RLHF" grpo "${RL[@]}" --ranks_per_node 2 --vllm_tensor_parallel_size 3 \
  --save_path "$W/bad" > "$W/bad.log" 2>&1
rc=$?
[ $rc -ne 0 ] && [ $rc -ne 124 ] || fail "TP 3 on nodes of 2: exit status $rc (0 = accepted, 124 = hang)"
grep -q "vllm_tensor_parallel_size\|tensor_parallel" "$W/bad.log" || { cat "$W/bad.log"; fail "TP 3: no message naming the flag"; }
echo "ok: --vllm_tensor_parallel_size 3 on nodes of 2 ranks is refused: $(grep -m1 -o 'error: .*' "$W/bad.log" | cut -c1-160)"
echo "PASS"
