#!/usr/bin/env bash
# Tensor-parallel GPU engines end to end on the CUDA emulator (rlhf_emu): `rlhf grpo --device cuda
# --vllm_tensor_parallel_size 2` against the same run with TP 1, on 2 simulated nodes:
#  (a) 8 ranks, --ranks_per_node 4 --gen_ranks_per_node 2: one TP 2 engine per node (no engine
#      crosses a node), weights synced device to device (the training ranks' NCCL gather, then a
#      node-local NCCL broadcast into the engines' full units, sliced on the device); and the same
#      TP 1 run with the host path (env RLHF_WEIGHT_SYNC=host: fp32 over MPI into the engines'
#      host buffers, then an upload) is identical to the device path's: the same completions,
#      rewards and weights fingerprint, bit for bit, with half the bytes moved on the device;
#  (b) 4 ranks colocated, --ranks_per_node 2: one TP 2 engine per node, weights synced device to
#      device into the full units and sliced on the device;
# each generates the TP 1 run's completions (all but sampling near-ties), its rewards within
# 0.02, and its engine log-probs agree with the trainer's forward (mismatch KL < 1e-4);
#  (c) a TP size that cannot split the model (4 over 2 KV heads) is refused while parsing flags
#      (exit 2) with the sizes that would work;
#  (d) a TP peer stopped before the rollout ends the job through the watchdog (--comm_timeout),
#      which names the engine step's all-reduce and the stopped rank;
#  (e) `rlhf bench sync --device cuda` on 4 ranks covers the colocated and the disaggregated
#      placement, every engine element equal to the bf16 rounding of the weights;
#  (f) LoRA (--lora_rank 8) with colocated TP 2 engines (adapter-only host sync, each rank merging
#      on the full layer and uploading its slice) against TP 1, 3 steps: completions and rewards
#      as TP 1's within the bounds stated there, and by the last step the policy has moved from
#      the base while the TP 2 engine still agrees with the trainer;
#  (g) an environment program (builtin:toy, multi-turn: a turn ends at a digit, the environment
#      answers with an observation) with TP 2 GPU engines on the 2 simulated nodes, disaggregated
#      (8 ranks) and colocated (4 ranks): the engines' TP rank 0 runs the environment and
#      broadcasts its answers; each run against its TP 1 run as in (a)/(b), and the episodes are
#      multi-turn (observation tokens fed).
# Exit 77 (skipped) when rlhf_emu was not built.
# Usage: cuda_emu_tp.sh <rlhf binary> <source dir>
set -u
RLHF=$1
SRC=$2
EMU=$(dirname "$RLHF")/rlhf_emu
if [ ! -x "$EMU" ]; then
  echo "SKIP: $EMU not built (no CUDA toolkit, or -DRLHF_CUDA_EMU=OFF)"
  exit 77
fi
# shellcheck source=lib/common.sh
. "$SRC/tests/e2e/lib/common.sh"
export RLHF_CUDA_EMU_DEVICES=8
MPI=(timeout 600 "$MPIEXEC" --oversubscribe --allow-run-as-root --bind-to none)
# A random tiny model (4 heads, 2 KV heads) on the built-in addition task. The keyword reward (the
# share of 36 letters and digits a completion contains) varies between the random completions, so
# the advantages and the training steps are not zero; the completions are logged for comparison.
GRPO=(grpo --model_config "$SRC/examples/models/tiny.toml"
  --prompt_data "builtin:addition?n=64&digits=1&seed=1" --input_key input --label_key label
  --reward keyword --reward_keywords "a,b,c,d,e,f,g,h,i,j,k,l,m,n,o,p,q,r,s,t,u,v,w,x,y,z,0,1,2,3,4,5,6,7,8,9"
  --n_samples_per_prompt 2 --rollout_batch_size 4 --train_batch_size 8 --micro_train_batch_size 2
  --generate_max_len 5 --actor_learning_rate 1e-3 --max_steps 2 --seed 1 --threads 1
  --device cuda --log_completions)
run() {  # run <name> <np> <args...>
  local name=$1 np=$2
  shift 2
  "${MPI[@]}" -np "$np" "$EMU" "${GRPO[@]}" "$@" --save_path "$W/$name" > "$W/$name.log" 2>&1 ||
    fail "$name: $(tail -5 "$W/$name.log")"
  [ "$(wc -l < "$W/$name/metrics.jsonl")" -eq 2 ] || fail "$name: want 2 metrics records"
}
# same <tp1 run> <tp2 run>: the TP 2 run against the TP 1 run. bf16 partial sums rounded before
# the all-reduce move an engine log-prob by up to ~4e-3 (measured mismatch_abs_logp_max), which
# can flip a sampled token whose uniform draw falls at a CDF boundary: measured 0-2 of 16
# completions differ, rewards equal; bound: 3/4 of the completions equal, rewards within 0.02
# (a differing completion moves the mean by <= 2/36/8). mismatch_kl (engine vs trainer
# log-probs): TP 1 ~1e-8, TP 2 ~1.6e-6 measured, bound 1e-4 (a wrong slice or a missing all-reduce
# gives O(1)).
same() {
  python3 - "$W/$1" "$W/$2" <<'PY' || fail "$2 differs from $1"
import json, sys
def load(d, f):
    return [json.loads(l) for l in open(f"{d}/{f}")]
a, b = load(sys.argv[1], "samples.jsonl"), load(sys.argv[2], "samples.jsonl")
assert len(a) == len(b) > 0, (len(a), len(b))
key = lambda r: (r["step"], r["prompt"], r["completion"])
common = len(set(map(key, a)) & set(map(key, b)))
print(f"{common} of {len(a)} completions equal")
assert 4 * common >= 3 * len(a), "completions differ"
for x, y in zip(load(sys.argv[1], "metrics.jsonl"), load(sys.argv[2], "metrics.jsonl")):
    print(f"step {x['step']}: reward tp1 {x['reward_mean']:.4f} tp2 {y['reward_mean']:.4f}, "
          f"mismatch kl tp2 {y['mismatch_kl']:.2e}")
    assert abs(x["reward_mean"] - y["reward_mean"]) <= 0.02, "rewards differ"
    assert y["mismatch_kl"] < 1e-4, "the TP 2 engine's log-probs disagree with the trainer's"
PY
}
# Every engine's ranks on one node (the placement table: rank host node local_rank role engine tp).
node_local() {
  awk '/\[info\] +[0-9]+ +[^ ]+ +[0-9]+ +[0-9]+ +(gen|both) +[0-9]+/ {
         n = NF; e = $(n - 1); node = $(n - 4)
         if (e in seen && seen[e] != node) bad = 1
         seen[e] = node; engines[e] = 1 }
       END { c = 0; for (e in engines) c++; exit (bad || c != want) }' want="$2" "$W/$1.log" ||
    fail "$1: an engine crosses a node, or not $2 engines: $(grep -A9 'rank  host' "$W/$1.log")"
}

# (a) disaggregated, 8 ranks on 2 nodes of 4: 2 training and 2 generation ranks per node.
run dis_tp2 8 --ranks_per_node 4 --gen_ranks_per_node 2 --vllm_tensor_parallel_size 2
node_local dis_tp2 2
run dis_tp1 8 --ranks_per_node 4 --gen_ranks_per_node 2 --vllm_tensor_parallel_size 1
same dis_tp1 dis_tp2
echo "ok: disaggregated TP 2 GPU engines (device sync) == TP 1"
# The device sync writes the engines the bf16 rounding of the trainer's fp32 masters, as the host
# path's upload does (tests/mpi/test_weight_sync_device.cpp), so nothing may differ.
RLHF_WEIGHT_SYNC=host run dis_tp1_host 8 --ranks_per_node 4 --gen_ranks_per_node 2 \
  --vllm_tensor_parallel_size 1
python3 - "$W/dis_tp1_host" "$W/dis_tp1" <<'PY' || fail "the device sync run differs from the host sync run"
import json, sys
def load(d, f):
    return [json.loads(l) for l in open(f"{d}/{f}")]
host, dev = sys.argv[1], sys.argv[2]
assert load(host, "samples.jsonl") == load(dev, "samples.jsonl"), "completions or scores differ"
for h, d in zip(load(host, "metrics.jsonl"), load(dev, "metrics.jsonl")):
    print(f"step {h['step']}: reward host {h['reward_mean']} device {d['reward_mean']}; sync "
          f"host {h['sync_path']} {h['sync_bytes']} B, device {d['sync_path']} {d['sync_bytes']} B")
    assert (h["sync_path"], d["sync_path"]) == ("host", "device"), "not the expected sync paths"
    assert 2 * d["sync_bytes"] == h["sync_bytes"], "the device sync does not move bf16 bytes"
    assert h["reward_mean"] == d["reward_mean"] and h["policy_loss"] == d["policy_loss"]
PY
fpr() { grep -o "weights fingerprint [0-9a-f]*" "$1" | tail -1 | awk '{ print $3 }'; }
[ -n "$(fpr "$W/dis_tp1.log")" ] && [ "$(fpr "$W/dis_tp1.log")" = "$(fpr "$W/dis_tp1_host.log")" ] ||
  fail "weights fingerprints: device sync '$(fpr "$W/dis_tp1.log")', host '$(fpr "$W/dis_tp1_host.log")'"
grep -q "sync [0-9.]*s [0-9.]* [KMG]*i*B device" "$W/dis_tp1.log" ||
  fail "the step line does not report the device sync's bytes: $(grep -m1 'step 1/' "$W/dis_tp1.log")"
echo "ok: disaggregated device sync == host sync (completions, rewards, weights fingerprint)"

# (b) colocated, 4 ranks on 2 nodes of 2: every rank trains and generates.
run col_tp2 4 --ranks_per_node 2 --vllm_tensor_parallel_size 2
node_local col_tp2 2
run col_tp1 4 --ranks_per_node 2 --vllm_tensor_parallel_size 1
same col_tp1 col_tp2
echo "ok: colocated TP 2 GPU engines (device sync, sliced on the device) == TP 1"

# (c) TP 4 cannot split the model's 2 KV heads: refused while parsing flags, exit 2.
"${MPI[@]}" -np 4 "$EMU" "${GRPO[@]}" --vllm_tensor_parallel_size 4 --ranks_per_node 4 \
  --save_path "$W/bad" > "$W/bad.log" 2>&1
rc=$?
[ $rc -eq 2 ] || fail "TP 4 over 2 KV heads: exit status $rc, want 2: $(tail -3 "$W/bad.log")"
grep -q "divides all three: 1, 2" "$W/bad.log" ||
  fail "TP 4: no hint naming the sizes that work: $(tail -3 "$W/bad.log")"
echo "ok: --vllm_tensor_parallel_size 4 --device cuda over 2 KV heads is refused (exit 2)"

# (d) A TP peer stopped (SIGSTOP) before the rollout: its partner waits in the engine step's
# all-reduce, which is watched (--comm_timeout 5): the job ends, naming that wait and the peer.
RLHF_INJECT_STOP=rl_step:1 "${MPI[@]}" -np 2 "$EMU" "${GRPO[@]}" --vllm_tensor_parallel_size 2 \
  --comm_timeout 5 --save_path "$W/stop" > "$W/stop.log" 2>&1 && fail "the stopped TP peer went unnoticed"
grep -q "a tensor-parallel engine step (NCCL all-reduce) .* has not completed after 5 s" \
  "$W/stop.log" || fail "no watchdog message for the engine step: $(tail -3 "$W/stop.log")"
grep -q "rank 1 (pid [0-9]*) is stopped" "$W/stop.log" || fail "the stopped peer is not named"
echo "ok: a stopped TP peer ends the job through the watchdog (engine step named)"

# (e) the GPU sync benchmark, both placements (4 colocated ranks; 2 train + 2 engine ranks).
"${MPI[@]}" -np 4 "$EMU" bench sync --device cuda --model_config "$SRC/examples/models/tiny.toml" \
  --output "$W/bench.jsonl" > "$W/bench.log" 2>&1 || fail "bench sync: $(tail -3 "$W/bench.log")"
python3 - "$W/bench.jsonl" <<'PY' || fail "bench sync --device cuda: $(cat "$W/bench.jsonl")"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"sync"' in l]
assert [r["mode"] for r in rows] == ["colocated", "disaggregated"], rows
for r in rows:
    print(f"bench sync {r['mode']}: {r['train_ranks']} train, {r['engine_ranks']} engine ranks, "
          f"{r['bytes']} B in {r['sync_s']:.4f}s, wrong {r['wrong']}")
    assert r["wrong"] == 0 and r["bytes"] > 0 and r["sync_s"] > 0
assert (rows[1]["train_ranks"], rows[1]["engine_ranks"]) == (2, 2)
PY
echo "ok: bench sync --device cuda covers colocated and disaggregated placements"

# (f) LoRA with colocated TP 2 GPU engines against TP 1. The first update is at step 2 (the
# learning rate warms up from 0), so steps 1-2 generate from the base and step 3 from trained
# adapters — which differ a little between the runs once a near-tie flipped a completion before
# (different samples, different gradients). Measured (emulator): 2 of 16 completions differ at
# steps 1-2 and 3 of 8 at step 3, every flip one character at a near-tie; rewards equal; at
# step 3 the policy's kl from the base 0.012 and the TP 2 engine's mismatch kl 1.7e-6
# (an engine without its adapters would show about the former as its mismatch). Bounds: 3/4 of
# the base's completions equal (step 3's only reported: they follow the trajectories), rewards
# within 0.02, at step 3 kl > 1e-3 and mismatch kl < 1e-4.
for tp in 2 1; do
  "${MPI[@]}" -np 4 "$EMU" "${GRPO[@]}" --ranks_per_node 2 --vllm_tensor_parallel_size $tp \
    --lora_rank 8 --actor_learning_rate 5e-3 --max_steps 3 --save_path "$W/lora_tp$tp" \
    > "$W/lora_tp$tp.log" 2>&1 || fail "lora_tp$tp: $(tail -5 "$W/lora_tp$tp.log")"
done
python3 - "$W/lora_tp1" "$W/lora_tp2" <<'PY' || fail "LoRA: the TP 2 run differs from the TP 1 run"
import json, sys
def load(d, f):
    return [json.loads(l) for l in open(f"{d}/{f}")]
a, b = load(sys.argv[1], "samples.jsonl"), load(sys.argv[2], "samples.jsonl")
assert len(a) == len(b) > 0, (len(a), len(b))
for steps, share in (((1, 2), 0.75), ((3,), 0.0)):
    x = [r for r in a if r["step"] in steps]
    y = [r for r in b if r["step"] in steps]
    equal = sum(p["prompt"] == q["prompt"] and p["completion"] == q["completion"] for p, q in zip(x, y))
    print(f"steps {steps}: {equal} of {len(x)} completions equal")
    assert len(x) == len(y) > 0 and equal >= share * len(x), "completions differ"
m1, m2 = load(sys.argv[1], "metrics.jsonl"), load(sys.argv[2], "metrics.jsonl")
for x, y in zip(m1, m2):
    print(f"step {x['step']}: reward tp1 {x['reward_mean']:.4f} tp2 {y['reward_mean']:.4f}, "
          f"kl tp2 {y['kl_mean']:.2e}, mismatch kl tp2 {y['mismatch_kl']:.2e}")
    assert abs(x["reward_mean"] - y["reward_mean"]) <= 0.02, "rewards differ"
    assert y["mismatch_kl"] < 1e-4, "the TP 2 engine's log-probs disagree with the trainer's"
assert len(m2) == 3 and m2[-1]["kl_mean"] > 1e-3, "the adapters did not train"
PY
echo "ok: LoRA with colocated TP 2 GPU engines (merged, then sliced) == TP 1"

# (g) an environment program with TP 2 GPU engines, disaggregated and colocated.
ENV=(--env_command builtin:toy --stop_strings "0,1,2,3,4,5,6,7,8,9" --env_max_turns 3
  --generate_max_len 8)
run env_dis_tp2 8 --ranks_per_node 4 --gen_ranks_per_node 2 --vllm_tensor_parallel_size 2 "${ENV[@]}"
node_local env_dis_tp2 2
run env_dis_tp1 8 --ranks_per_node 4 --gen_ranks_per_node 2 --vllm_tensor_parallel_size 1 "${ENV[@]}"
same env_dis_tp1 env_dis_tp2
run env_col_tp2 4 --ranks_per_node 2 --vllm_tensor_parallel_size 2 "${ENV[@]}"
node_local env_col_tp2 2
run env_col_tp1 4 --ranks_per_node 2 --vllm_tensor_parallel_size 1 "${ENV[@]}"
same env_col_tp1 env_col_tp2
python3 - "$W"/env_*_tp2/metrics.jsonl <<'PY' || fail "(g): the episodes are not multi-turn"
import json, sys
for f in sys.argv[1:]:
    obs = sum(json.loads(l)["env_observation_tokens"] for l in open(f))
    print(f"{f.split('/')[-2]}: {obs} observation tokens over 2 steps")
    assert obs > 0
PY
echo "ok: an environment program with TP 2 GPU engines, disaggregated and colocated, == TP 1"
echo "PASS"
