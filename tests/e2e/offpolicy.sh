#!/usr/bin/env bash
# Off-policy correction, the mismatch metrics, token-budget micro-batches and the metrics schema,
# end to end with rlhf grpo on the built-in 1-digit addition task (tiny model, no download):
#  (a) with an fp32 KV cache the CPU engine computes the trainer's logits exactly and its
#      log-probs to float rounding (its sampler sums the softmax in another order: |d| ≤ 1e-5,
#      mismatch_kl ≤ 1e-10); with an fp16 KV cache the mismatch is orders of magnitude larger;
#  (b) each --vllm_is_correction_type and --use_decoupled_loss runs and reports its weights
#      within the thresholds; with bounds of 1 ± 1e-5 (seq-mask-tis: 1e-6) the filters drop
#      tokens of an fp16 KV cache's rollout, and IcePop none of an fp32 one's;
#  (c) --use_dynamic_batch: more, smaller micro-batches, the same first step as sample counts;
#  (d) the metrics schema: a step that dynamic filtering left empty writes the same keys as a
#      trained step;
#  (e) bad settings are usage errors naming the flag; TRL's name gives a hint.
# Usage: offpolicy.sh <rlhf binary> <source dir>     (env MPIEXEC: mpiexec's path)
set -u
RLHF=$1
SRC=$2
# shellcheck source=lib/common.sh
. "$SRC/tests/e2e/lib/common.sh"
TASK="builtin:addition?n=200&digits=1&seed=1"
GRPO=(grpo --model_config "$SRC/examples/models/tiny.toml" --prompt_data "$TASK" --input_key input
      --label_key label --reward math --n_samples_per_prompt 4 --rollout_batch_size 4
      --train_batch_size 8 --micro_train_batch_size 2 --max_epochs 2 --generate_max_len 8
      --seed 1 --actor_learning_rate 1e-3 --max_steps 2)
grpo() {  # <name> <np> <args...>: a run into $W/<name>, its log in $W/<name>.log
  local name=$1 np=$2
  shift 2
  timeout 300 "${MPI[@]}" -np "$np" "$RLHF" "${GRPO[@]}" --save_path "$W/$name" \
    --ckpt_path "$W/$name/ckpt" "$@" > "$W/$name.log" 2>&1 \
    || { tail "$W/$name.log"; fail "grpo $name exited"; }
}
check() {  # <python body with recs = the records of each metrics.jsonl given>
  local body=$1
  shift
  python3 - "$@" <<PY || fail "checks failed"
import json, sys
runs = [[json.loads(l) for l in open(p) if l.strip()] for p in sys.argv[1:]]
recs = runs[0]
$body
PY
}

# (a) The engine's log-probs against the trainer's: fp32 and fp16 KV caches.
grpo fp32 1 --kv_cache_dtype fp32
grpo fp16 1 --kv_cache_dtype fp16
check '
fp32, fp16 = runs
for r in fp32:
    assert r["mismatch_abs_logp_max"] <= 1e-5 and 0 <= r["mismatch_kl"] <= 1e-10, r
    assert abs(r["vllm_kl"]) <= 1e-5 and r["is_masked_fraction"] == 0, r
    assert r["is_weight_mean"] == r["is_weight_min"] == r["is_weight_max"] == 1, r
for a, b in zip(fp32, fp16):
    assert b["mismatch_kl"] > 100 * a["mismatch_kl"], (a, b)
    assert b["mismatch_abs_logp_max"] > 10 * a["mismatch_abs_logp_max"], (a, b)
    assert b["mismatch_abs_logp_mean"] <= b["mismatch_abs_logp_max"], b
fmt = lambda run: ["%.1e" % r["mismatch_kl"] for r in run]
print("ok: mismatch_kl with an fp32 KV cache", fmt(fp32), "with fp16", fmt(fp16))
' "$W/fp32/metrics.jsonl" "$W/fp16/metrics.jsonl"
grep -q "mismatch kl [1-9]" "$W/fp16.log" || fail "no mismatch on the step line"

# (b) Each correction (TIS on 2 ranks); the filters with bounds 1 ± 1e-5.
B=(--vllm_is_truncated_threshold 0.99999 1.00001)
grpo tis 2 --kv_cache_dtype fp16 --enable_vllm_is_correction "${B[@]}"
grpo icepop 1 --kv_cache_dtype fp16 --enable_vllm_is_correction --vllm_is_correction_type icepop "${B[@]}"
grpo icepop32 1 --kv_cache_dtype fp32 --enable_vllm_is_correction --vllm_is_correction_type icepop "${B[@]}"
grpo seqmask 1 --kv_cache_dtype fp16 --enable_vllm_is_correction \
  --vllm_is_correction_type seq-mask-tis --vllm_is_truncated_threshold 0.999999 1.000001
grpo decoupled 1 --kv_cache_dtype fp16 --use_decoupled_loss --behav_imp_weight_cap 1.00001
check '
tis, ice, ice32, seq, dec = runs
for r in tis:
    assert 0.99999 - 1e-6 <= r["is_weight_min"] <= r["is_weight_max"] <= 1.00001 + 1e-6, r
    assert r["is_masked_fraction"] == 0, r
for r in ice:
    assert r["is_weight_min"] == 0 or r["is_weight_min"] >= 0.99999 - 1e-6, r
    assert r["is_weight_max"] <= 1.00001 + 1e-6, r
# seq-mask-tis keeps whole samples by their geometric mean: a kept token may lie outside.
for r in dec:
    assert r["is_weight_max"] <= 1.00001 + 1e-6, r
for run, name in ((ice, "icepop"), (dec, "decoupled")):
    assert all(r["is_masked_fraction"] > 0 for r in run), name
# The mean log-ratio of a sample averages its tokens: bounds 1 ± 1e-6; some step drops samples.
assert any(r["is_masked_fraction"] > 0 for r in seq), seq
assert all(r["is_masked_fraction"] == 0 for r in ice32), ice32
print("ok: tis, icepop, seq-mask-tis, decoupled: masked fractions",
      [round(max(r["is_masked_fraction"] for r in run), 3) for run in (ice, seq, dec)],
      "(icepop with an fp32 KV cache: 0)")
' "$W/tis/metrics.jsonl" "$W/icepop/metrics.jsonl" "$W/icepop32/metrics.jsonl" \
  "$W/seqmask/metrics.jsonl" "$W/decoupled/metrics.jsonl"

# (c) Token budgets: 2 ranks, at most 24 padded tokens per pass (1-digit prompts and 8 new tokens
# are ~10-16 tokens: one or two samples a micro-batch).
grpo count 2 --kv_cache_dtype fp32
grpo budget 2 --kv_cache_dtype fp32 --use_dynamic_batch --train_max_tokens_per_gpu 24 \
  --rollout_max_tokens_per_gpu 24
check '
count, budget = runs
assert budget[0]["train_micro_batches"] > count[0]["train_micro_batches"], \
    (budget[0]["train_micro_batches"], count[0]["train_micro_batches"])
for k in ("policy_loss", "actor_grad_norm", "reward_mean"):
    a, b = count[0][k], budget[0][k]
    assert abs(a - b) <= 1e-4 * max(1.0, abs(a)), (k, a, b)  # fp32 summation order
print("ok: token budgets:", budget[0]["train_micro_batches"], "micro-batches a rank vs",
      count[0]["train_micro_batches"], "; step 1 agrees within 1e-4")
' "$W/count/metrics.jsonl" "$W/budget/metrics.jsonl"

# (d) One schema: dynamic filtering that keeps every group, and one that keeps none (every step
# empty: no score mean lies in (5, 6)).
grpo keepall 1 --dynamic_filtering --dynamic_filtering_reward_range -1 2
grpo keepnone 1 --dynamic_filtering --dynamic_filtering_reward_range 5 6 --max_num_gen_batches 1
check '
full, empty = runs
assert all(r["trained_samples"] > 0 for r in full) and all(r["trained_samples"] == 0 for r in empty)
keys = {frozenset(r) for r in full + empty}
assert len(keys) == 1, [sorted(set(k) ^ set(next(iter(keys)))) for k in keys]
print(f"ok: trained and empty steps write the same {len(next(iter(keys)))} keys")
' "$W/keepall/metrics.jsonl" "$W/keepnone/metrics.jsonl"

# (e) Usage errors.
expect_usage() {  # <needle> <args...>
  local needle=$1
  shift
  out=$(timeout 60 "$RLHF" "${GRPO[@]}" --save_path "$W/bad" "$@" 2>&1)
  rc=$?
  [ $rc -eq 2 ] || { echo "$out" | tail -3; fail "expected exit 2 for $* (rc $rc)"; }
  echo "$out" | grep -q -- "$needle" || { echo "$out" | tail -5; fail "no '$needle' for $*"; }
}
expect_usage "--vllm_is_truncated_threshold" --vllm_is_truncated_threshold 2 1
expect_usage "--vllm_is_correction_type" --vllm_is_correction_type clip
expect_usage "--behav_imp_weight_cap" --behav_imp_weight_cap 3
expect_usage "choose one" --enable_vllm_is_correction --use_decoupled_loss
expect_usage "--enable_vllm_is_correction" --vllm_importance_sampling_correction
echo "ok: bad off-policy settings are usage errors"
