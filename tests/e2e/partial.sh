#!/usr/bin/env bash
# rlhf grpo --partial_rollout end to end on the built-in 1-digit addition task, 1 training rank and
# 1 generation rank (--gen_ranks_per_node 1):
#  (a) every step records the partial-rollout metrics; samples are carried between steps, and
#      trained samples mix tokens of older weight versions (age >= 1 somewhere);
#  (b) resuming at step 4 from an 8-step run's checkpoint, with samples in flight, gives that
#      run's steps 5-8 and weights bit for bit — synchronous and with --async_train; a run without
#      --partial_rollout refuses that checkpoint;
#  (c) --max_staleness 0: carried samples are dropped and regenerated (counted), and no trained
#      sample has a token from an older version;
#  (d) 2 training ranks = 1 training rank (same engine): the same samples at step 1, losses equal
#      up to reduction order;
#  (e) rlhf ppo (GAE, critic) runs with --partial_rollout;
#  (g) carried tokens keep their engine log-probs from the older weights: the engine/trainer
#      mismatch is ~0 on steps without older tokens (fp32 KV cache) and positive on steps with
#      them, where --use_decoupled_loss weights them;
#  (h) colocated engines that sleep between steps (--vllm_enable_sleep) free their kept KV and
#      give the steps of --partial_rollout_kv recompute;
#  (i) --partial_rollout_kv keep continues carried samples on the engine's kept KV blocks (not in
#      the step after a checkpoint), recompute prefills them again;
#  (j) with two engines each group stays on its engine (kept KV found), and a resumed run equals
#      the straight one;
#  (k) a tensor-parallel engine (TP 2) keeps and resumes in lock step;
#  (l) an evaluation between steps leaves the kept KV: the steps and weights of the run without it;
#  (f) nonsense combinations are usage errors (exit 2) with one clear message.
# Usage: partial.sh <rlhf binary> <source dir>     (env MPIEXEC: mpiexec's path)
set -u
RLHF=$1
SRC=$2
# shellcheck source=lib/common.sh
. "$SRC/tests/e2e/lib/common.sh"
# shellcheck source=lib/resume.sh
. "$SRC/tests/e2e/lib/resume.sh"
TASK="builtin:addition?n=2000&digits=1&seed=1"

warm_start_sft 150

GRPO=(grpo --pretrain "$W/sft/model.h5" --prompt_data "$TASK" --input_key input --label_key label
      --reward math --n_samples_per_prompt 8 --rollout_batch_size 8 --train_batch_size 64
      --micro_train_batch_size 16 --generate_max_len 8 --seed 1 --gen_ranks_per_node 1
      --actor_learning_rate 3e-4 --lr_scheduler constant --threads 1 --partial_rollout)
run() {  # run <name> <np> <args...>
  local name=$1 np=$2
  shift 2
  timeout 300 "${MPI[@]}" -np "$np" "$RLHF" "${GRPO[@]}" --save_path "$W/$name" \
    --ckpt_path "$W/$name/ckpt" "$@" > "$W/$name.log" 2>&1 \
    || { tail "$W/$name.log"; fail "$name exited"; }
}

# (a) + (b) straight 8 steps with a checkpoint at step 4; then resumed from it.
for mode in sync async; do
  extra=()
  [ $mode = async ] && extra=(--async_train)
  run "straight_$mode" 2 --max_steps 8 --save_steps 4 "${extra[@]}"
  copy_ckpt "$W/straight_$mode/ckpt" 4 "$W/resumed_$mode/ckpt" || fail "copying step 4"
  head -4 "$W/straight_$mode/metrics.jsonl" > "$W/resumed_$mode/metrics.jsonl"
  run "resumed_$mode" 2 --max_steps 8 --save_steps 4 --load_checkpoint "${extra[@]}"
  grep -q "resumed from .*step_4.h5 at step 4" "$W/resumed_$mode.log" || fail "$mode: did not resume"
  same_metrics "$W/straight_$mode/metrics.jsonl" "$W/resumed_$mode/metrics.jsonl" \
    || fail "$mode: 4 + resume + 4 steps differ from 8 steps straight"
  fa=$(fp "$W/straight_$mode.log")
  fb=$(fp "$W/resumed_$mode.log")
  [ -n "$fa" ] && [ "$fa" = "$fb" ] || fail "$mode resume: final weights differ: $fa vs $fb"
  echo "ok: --partial_rollout ($mode) 4 steps + resume + 4 steps == 8 steps straight (weights $fa)"
done
python3 - "$W/straight_sync/metrics.jsonl" <<'PYEOF' || fail "partial-rollout metrics"
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
keys = ["partial_carried_samples", "partial_interrupted_samples", "partial_dropped_samples",
        "partial_trained_carried_samples", "partial_age_mean", "partial_age_max",
        "partial_old_token_fraction", "partial_rounds"]
for r in recs:
    for k in keys:
        assert k in r, (r["step"], k)
    assert r["partial_age_max"] <= 8, r  # --max_staleness 8 (default)
    assert 0 <= r["partial_old_token_fraction"] <= 1, r
assert any(r["partial_carried_samples"] > 0 for r in recs), "nothing carried"
assert any(r["partial_age_max"] >= 1 for r in recs), "no trained sample from older weights"
print("carried per step:", [r["partial_carried_samples"] for r in recs],
      "age max:", [r["partial_age_max"] for r in recs])
PYEOF
copy_ckpt "$W/straight_sync/ckpt" 4 "$W/plain/ckpt" || fail "copying step 4"
plain=("${GRPO[@]}")
unset 'plain[${#plain[@]}-1]'  # without --partial_rollout
if timeout 120 "${MPI[@]}" -np 2 "$RLHF" "${plain[@]}" --max_steps 8 --save_path "$W/plain" \
  --ckpt_path "$W/plain/ckpt" --load_checkpoint > "$W/plain.log" 2>&1; then
  fail "a run without --partial_rollout took over a checkpoint with samples in flight"
fi
grep -q "holds partial rollouts in flight" "$W/plain.log" || { tail "$W/plain.log"; fail "no reason given"; }
echo "ok: a run without --partial_rollout refuses a checkpoint with samples in flight"

# (c) --max_staleness 0: every carried sample with a token is dropped before the next round.
run stale0 2 --max_steps 6 --max_staleness 0
python3 - "$W/stale0/metrics.jsonl" <<'PYEOF' || fail "--max_staleness 0"
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
assert sum(r["partial_dropped_samples"] for r in recs) > 0, "nothing dropped"
for r in recs:
    assert r["partial_age_max"] == 0 and r["partial_old_token_fraction"] == 0, r
print("dropped per step:", [r["partial_dropped_samples"] for r in recs])
PYEOF
echo "ok: --max_staleness 0 drops and regenerates every carried sample"

# (d) 2 training ranks + 1 generation rank = 1 + 1.
run one 2 --max_steps 3
run two 3 --max_steps 3
python3 - "$W/one/metrics.jsonl" "$W/two/metrics.jsonl" <<'PYEOF' || fail "2 trainers != 1 trainer"
import json, sys
a = [json.loads(l) for l in open(sys.argv[1])]
b = [json.loads(l) for l in open(sys.argv[2])]
for k in ["reward_mean", "response_length_mean", "partial_carried_samples",
          "partial_interrupted_samples", "gen_tokens"]:
    assert a[0][k] == b[0][k], (k, a[0][k], b[0][k])
for x, y in zip(a, b):
    for k in ["policy_loss", "entropy"]:
        assert abs(x[k] - y[k]) <= 1e-4 * max(1.0, abs(x[k])), (x["step"], k, x[k], y[k])
PYEOF
echo "ok: --partial_rollout on 2 training ranks equals 1 training rank"

# (e) PPO with a critic.
timeout 300 "${MPI[@]}" -np 2 "$RLHF" ppo --pretrain "$W/sft/model.h5" --prompt_data "$TASK" \
  --input_key input --label_key label --reward math --rollout_batch_size 16 --train_batch_size 16 \
  --micro_train_batch_size 8 --generate_max_len 8 --seed 1 --gen_ranks_per_node 1 --threads 1 \
  --partial_rollout --max_steps 3 --save_path "$W/ppo" > "$W/ppo.log" 2>&1 \
  || { tail "$W/ppo.log"; fail "ppo --partial_rollout exited"; }
[ "$(wc -l < "$W/ppo/metrics.jsonl")" -eq 3 ] || fail "ppo --partial_rollout: not 3 steps"
grep -q '"partial_carried_samples"' "$W/ppo/metrics.jsonl" || fail "ppo: no partial metrics"
echo "ok: rlhf ppo --partial_rollout"

# (g) The engine log-probs of carried tokens are the older weights' (kept per token): with an fp32
# KV cache the engine and the trainer agree to float rounding on tokens of the current version,
# so the mismatch is ~0 where no trained token is older and clearly positive where some are;
# decoupled PPO then weights those tokens.
run decoupled 2 --max_steps 6 --kv_cache_dtype fp32 --use_decoupled_loss
python3 - "$W/decoupled/metrics.jsonl" <<'PYEOF' || fail "per-token behaviour log-probs"
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
fresh = [r for r in recs if r["partial_old_token_fraction"] == 0]
mixed = [r for r in recs if r["partial_old_token_fraction"] > 0]
assert fresh and mixed, [r["partial_old_token_fraction"] for r in recs]
for r in fresh:
    assert r["mismatch_abs_logp_max"] <= 1e-5, r
for r in mixed:
    assert r["mismatch_abs_logp_max"] > 1e-4, r
    assert r["is_weight_min"] != 1 or r["is_weight_max"] != 1, r
print("mismatch max, fresh steps:", [r["mismatch_abs_logp_max"] for r in fresh],
      "mixed:", [r["mismatch_abs_logp_max"] for r in mixed])
PYEOF
echo "ok: carried tokens keep their older engine log-probs (decoupled PPO weights them)"

# (h) Colocated engines that sleep while the trainer trains (--vllm_enable_sleep) free the KV they
# kept, so they continue the carried samples as engines that recompute them: 3 steps with sleep
# and without it under --partial_rollout_kv recompute, one rank doing both.
run colo 1 --gen_ranks_per_node 0 --max_steps 3 --partial_rollout_kv recompute
run colo_sleep 1 --gen_ranks_per_node 0 --max_steps 3 --vllm_enable_sleep
grep -q '"sleep_freed_bytes"' "$W/colo_sleep/metrics.jsonl" || fail "the colocated engine did not sleep"
same_metrics "$W/colo/metrics.jsonl" "$W/colo_sleep/metrics.jsonl" \
  || fail "--partial_rollout with --vllm_enable_sleep differs from recompute without sleep"
[ "$(fp "$W/colo.log")" = "$(fp "$W/colo_sleep.log")" ] || fail "sleep changed the weights"
echo "ok: --partial_rollout with sleeping colocated engines == recompute without sleep"

# (i) --partial_rollout_kv: keep (the default, the 8-step run above) continues carried samples on
# the KV blocks the engine kept, except in the step after a checkpoint (step 5: the checkpoint of
# step 4 released them, as the resumed run has none); recompute prefills every one again.
run recompute 2 --max_steps 8 --partial_rollout_kv recompute
python3 - "$W/straight_sync/metrics.jsonl" "$W/recompute/metrics.jsonl" <<'PYEOF' || fail "--partial_rollout_kv"
import json, sys
keep = [json.loads(l) for l in open(sys.argv[1])]
rec = [json.loads(l) for l in open(sys.argv[2])]
assert sum(r["partial_kv_resumed_samples"] for r in keep) > 0, "keep: nothing resumed"
assert keep[4]["partial_kv_resumed_samples"] == 0, "resumed on KV released at the checkpoint"
assert any(r["partial_kv_resumed_tokens"] > 0 for r in keep)
assert all(r["partial_kv_resumed_samples"] == 0 for r in rec), "recompute resumed on kept KV"
assert sum(r["partial_reprefilled_samples"] for r in rec) > 0, "recompute: nothing prefilled again"
# Rounds inside a step share the weights, so keep and recompute agree until the first step
# that continues a sample on KV from older weights: step 1 is the same.
assert keep[0]["reward_mean"] == rec[0]["reward_mean"], (keep[0], rec[0])
print("resumed on kept KV per step:", [r["partial_kv_resumed_samples"] for r in keep],
      "prefilled again (recompute):", [r["partial_reprefilled_samples"] for r in rec])
PYEOF
# A checkpoint every step releases the kept KV every step: every continuation is prefilled
# again, and the steps are those of recompute.
run save1 2 --max_steps 8 --save_steps 1
python3 - "$W/save1/metrics.jsonl" "$W/recompute/metrics.jsonl" <<'PYEOF' || fail "kept KV at checkpoints"
import json, sys
s1 = [json.loads(l) for l in open(sys.argv[1])]
rec = [json.loads(l) for l in open(sys.argv[2])]
assert all(r["partial_kv_resumed_samples"] == 0 for r in s1), "resumed on KV a checkpoint released"
assert [r["partial_reprefilled_samples"] for r in s1] == [r["partial_reprefilled_samples"] for r in rec]
assert [r["reward_mean"] for r in s1] == [r["reward_mean"] for r in rec]
PYEOF
echo "ok: --partial_rollout_kv keep continues on kept KV (not after a checkpoint), recompute prefills"

# (j) Two engines: each group stays on the engine it was dealt to, so carried samples continue on
# the KV blocks that engine kept; the checkpoint keeps each group's engine, so 4 + resume + 4
# steps equal 8 straight.
run two_eng 3 --max_steps 8 --save_steps 4 --gen_ranks_per_node 2
copy_ckpt "$W/two_eng/ckpt" 4 "$W/two_eng_resumed/ckpt" || fail "copying step 4"
head -4 "$W/two_eng/metrics.jsonl" > "$W/two_eng_resumed/metrics.jsonl"
run two_eng_resumed 3 --max_steps 8 --save_steps 4 --gen_ranks_per_node 2 --load_checkpoint
same_metrics "$W/two_eng/metrics.jsonl" "$W/two_eng_resumed/metrics.jsonl" \
  || fail "two engines: 4 + resume + 4 steps differ from 8 steps straight"
[ "$(fp "$W/two_eng.log")" = "$(fp "$W/two_eng_resumed.log")" ] || fail "two engines: resumed weights differ"
python3 - "$W/two_eng/metrics.jsonl" <<'PYEOF' || fail "two engines: nothing continued on kept KV"
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
assert sum(r["partial_kv_resumed_samples"] for r in recs) > 0, [r["partial_reprefilled_samples"] for r in recs]
PYEOF
echo "ok: two engines keep their groups: continued on kept KV, resumed run == straight run"

# (k) A tensor-parallel engine (TP 2 over 2 generation ranks): both ranks keep and resume the same
# samples in lock step (a rank that prefilled where the other resumed would diverge or hang).
run tp2 3 --max_steps 8 --gen_ranks_per_node 2 --vllm_tensor_parallel_size 2
python3 - "$W/tp2/metrics.jsonl" <<'PYEOF' || fail "TP 2 engine: nothing continued on kept KV"
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
assert len(recs) == 8
assert sum(r["partial_kv_resumed_samples"] for r in recs) > 0, [r["partial_reprefilled_samples"] for r in recs]
PYEOF
echo "ok: a TP 2 engine continues carried samples on kept KV"

# (l) An evaluation between steps (--eval_steps 1) generates other prompts on the same engine:
# with room in the cache the kept samples stay, so the steps (carried samples continued on kept
# KV included) and the weights are those of the run without it.
run evalkv 2 --max_steps 8 --save_steps 4 --eval_dataset "builtin:addition?n=16&digits=1&seed=9" \
  --eval_steps 1
python3 - "$W/straight_sync/metrics.jsonl" "$W/evalkv/metrics.jsonl" <<'PYEOF' || fail "evaluation freed kept KV"
import json, sys
plain = [json.loads(l) for l in open(sys.argv[1])]
ev = [json.loads(l) for l in open(sys.argv[2])]
assert any("eval_reward_mean" in r for r in ev), "no evaluation ran"
keys = ["reward_mean", "partial_kv_resumed_samples", "partial_reprefilled_samples"]
assert [[r[k] for k in keys] for r in ev] == [[r[k] for k in keys] for r in plain], \
    ([[r[k] for k in keys] for r in ev], [[r[k] for k in keys] for r in plain])
PYEOF
[ "$(fp "$W/straight_sync.log")" = "$(fp "$W/evalkv.log")" ] || fail "an evaluation changed the weights"
echo "ok: an evaluation between steps leaves the kept KV (same steps and weights)"

# (f) Usage errors.
usage() {  # usage <expected message> <args...>
  local want=$1
  shift
  "$RLHF" "${GRPO[@]}" --gen_ranks_per_node 0 --max_steps 1 --save_path "$W/bad" "$@" \
    > "$W/bad.log" 2>&1
  local rc=$?
  [ $rc -eq 2 ] || { cat "$W/bad.log"; fail "$* exited $rc, not 2"; }
  grep -q -- "$want" "$W/bad.log" || { cat "$W/bad.log"; fail "$*: no '$want'"; }
}
usage "both decide when a step has its groups" --dynamic_filtering
usage "multi-turn episodes are not interrupted" --env_command builtin:toy
usage "must be one of" --partial_rollout_kv reuse
plain1=("${plain[@]}")
"$RLHF" "${plain1[@]}" --gen_ranks_per_node 0 --max_steps 1 --save_path "$W/bad" --max_staleness 2 \
  > "$W/bad.log" 2>&1
[ $? -eq 2 ] && grep -q "needs --partial_rollout" "$W/bad.log" || { cat "$W/bad.log"; fail "--max_staleness alone accepted"; }
"$RLHF" "${plain1[@]}" --gen_ranks_per_node 0 --max_steps 1 --save_path "$W/bad" \
  --partial_rollout_kv recompute > "$W/bad.log" 2>&1
[ $? -eq 2 ] && grep -q "needs --partial_rollout" "$W/bad.log" || { cat "$W/bad.log"; fail "--partial_rollout_kv alone accepted"; }
echo "ok: nonsense combinations are usage errors"
