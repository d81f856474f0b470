#!/usr/bin/env bash
# DAPO-style GRPO end to end on the built-in 1-digit addition task (no download):
#  (a) --dynamic_filtering on 2 ranks: every trained group (samples.jsonl, --log_completions 1) has
#      a mean score strictly inside (0, 1) — no step trains on a group whose samples all scored the
#      same; steps refill with extra generation rounds; the reward still rises; evaluation on a
#      held-out set (--eval_dataset, --eval_before_training, --eval_steps) is in metrics.jsonl with
#      pass@k, and its accuracy rises;
#  (b) GSPO with seq-mean-token-mean aggregation and the overlong penalty runs and records;
#  (c) bad configurations exit non-zero on every rank with a message naming the flag.
# Usage: dapo.sh <rlhf binary> <source dir>     (env MPIEXEC: mpiexec's path)
set -u
RLHF=$1
SRC=$2
# shellcheck source=lib/common.sh
. "$SRC/tests/e2e/lib/common.sh"
TASK="builtin:addition?n=2000&digits=1&seed=1"
HELD_OUT="builtin:addition?n=32&digits=1&seed=77"

warm_start_sft 150

GRPO=(grpo --pretrain "$W/sft/model.h5" --prompt_data "$TASK" --input_key input --label_key label
      --reward math --n_samples_per_prompt 8 --rollout_batch_size 8 --train_batch_size 32
      --micro_train_batch_size 8 --generate_max_len 8 --seed 1 --actor_learning_rate 3e-4)

# (a) Dynamic filtering, sample logs, evaluation.
timeout 400 "${MPI[@]}" -np 2 "$RLHF" "${GRPO[@]}" --max_steps 100 --rollout_batch_size 16 --dynamic_filtering \
  --dynamic_filtering_reward_range 0 1 --max_num_gen_batches 4 --log_completions 1 \
  --eval_dataset "$HELD_OUT" --eval_steps 50 --eval_before_training --eval_n_samples_per_prompt 4 \
  --save_path "$W/dapo" --ckpt_path "$W/dapo/ckpt" > "$W/dapo.log" 2>&1 \
  || { tail "$W/dapo.log"; fail "grpo --dynamic_filtering exited"; }
python3 - "$W/dapo/metrics.jsonl" "$W/dapo/samples.jsonl" <<'PY' || fail "dynamic filtering checks"
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
steps = [r for r in recs if r["step"] >= 1]
assert len(steps) == 100, f"{len(steps)} step records"
# Every trained group: 8 consecutive samples of one step, mean score strictly inside (0, 1).
samples = [json.loads(l) for l in open(sys.argv[2]) if l.strip()]
by_step = {}
for s in samples:
    by_step.setdefault(s["step"], []).append(s["score"])
bad = 0
for step, sc in by_step.items():
    assert len(sc) % 8 == 0, f"step {step}: {len(sc)} trained samples"
    for g in range(0, len(sc), 8):
        m = sum(sc[g:g + 8]) / 8
        bad += not (0 < m < 1)
assert bad == 0, f"{bad} trained groups with an all-equal score"
assert len(by_step) >= 95, f"only {len(by_step)} steps trained"
rounds = max(r["filter_rounds"] for r in steps)
dropped = sum(r["filter_groups_generated"] - r["filter_groups_kept"] for r in steps)
assert rounds >= 2 and dropped > 0, f"no refill seen (rounds {rounds}, dropped {dropped})"
# Seen: ~0.31 -> ~0.66 (without filtering the same run goes ~0.29 -> ~0.66).
first = sum(r["reward_mean"] for r in steps[:20]) / 20
last = sum(r["reward_mean"] for r in steps[-20:]) / 20
assert last > first + 0.15, f"reward did not rise: {first:.3f} -> {last:.3f}"
ev = {r["step"]: r for r in recs if "eval_accuracy" in r}
assert sorted(ev) == [0, 50, 100], f"eval at steps {sorted(ev)}"
for r in ev.values():
    assert r["eval_prompts"] == 32 and r["eval_samples"] == 128, r
    assert abs(r["eval_pass@1"] - r["eval_accuracy"]) < 1e-12 and r["eval_pass@4"] >= r["eval_accuracy"]
assert ev[100]["eval_accuracy"] > ev[0]["eval_accuracy"], (ev[0]["eval_accuracy"], ev[100]["eval_accuracy"])
print(f"ok: dynamic filtering trained only mixed groups ({dropped} groups dropped, up to {rounds} "
      f"rounds a step); reward {first:.3f} -> {last:.3f}; held-out accuracy "
      f"{ev[0]['eval_accuracy']:.3f} -> {ev[100]['eval_accuracy']:.3f}")
PY
[ $? -eq 0 ] || exit 1
grep -q "eval after step 50" "$W/dapo.log" || fail "no eval line in the log"

# (b) GSPO, sequence-mean aggregation, overlong shaping.
timeout 200 "${MPI[@]}" -np 2 "$RLHF" "${GRPO[@]}" --max_steps 6 --policy_loss_type gspo \
  --eps_clip_low_high 0.0003 0.0004 --loss_agg_mode seq-mean-token-mean --overlong_buffer_len 4 \
  --overlong_penalty_factor 0.5 --save_path "$W/gspo" --ckpt_path "$W/gspo/ckpt" > "$W/gspo.log" 2>&1 \
  || { tail "$W/gspo.log"; fail "grpo --policy_loss_type gspo exited"; }
[ "$(grep -c '"step"' "$W/gspo/metrics.jsonl")" -eq 6 ] || fail "gspo: metrics.jsonl"
echo "ok: GSPO + seq-mean-token-mean + overlong shaping run"

# (c) Bad configurations: one message naming the flag, a non-zero exit on every rank.
expect_error() {  # <needle> <args...>
  local needle=$1; shift
  out=$(timeout 60 "${MPI[@]}" -np 2 "$RLHF" "${GRPO[@]}" --max_steps 1 --save_path "$W/bad" "$@" 2>&1)
  rc=$?
  [ $rc -ne 0 ] && [ $rc -ne 124 ] || fail "expected a failure for $* (rc $rc)"
  echo "$out" | grep -q -- "$needle" || { echo "$out" | tail -5; fail "no '$needle' for $*"; }
}
expect_error "--dynamic_filtering_reward_range" --dynamic_filtering --dynamic_filtering_reward_range 1 0
expect_error "--overlong_buffer_len" --overlong_buffer_len 8
expect_error "--policy_loss_type gspo" --policy_loss_type gspo --advantage_estimator gae
expect_error "--loss_agg_mode" --loss_agg_mode mean
echo "ok: bad DAPO configurations are clear errors"
