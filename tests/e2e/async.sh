#!/usr/bin/env bash
# rlhf grpo --async_train end to end on the built-in 1-digit addition task, 2 ranks placed as one
# training rank and one generation rank (--gen_ranks_per_node 1):
#  (a) --async_queue_size 0 is the synchronous loop: identical metrics record by record;
#  (b) --async_queue_size 1 / 2: each step records the weight version its rollout was generated
#      with, and the staleness (updates since) is min(step - 1, k);
#  (c) async k = 1: resuming at step 4 from an 8-step run's checkpoint gives that run's steps 5-8
#      and weights (the rollout generated ahead for step 5 is in the checkpoint); a synchronous
#      run refuses that checkpoint;
#  (d) async GRPO still learns: the reward of the last steps is clearly above the first steps';
#  (e) a colocated placement is refused with the reason, on every rank, without hanging.
# Usage: async.sh <rlhf binary> <source dir>     (env MPIEXEC: mpiexec's path)
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
      --actor_learning_rate 3e-4 --lr_scheduler constant --threads 1)
run() {  # run <name> <args...>
  local name=$1
  shift
  timeout 300 "${MPI[@]}" -np 2 "$RLHF" "${GRPO[@]}" --save_path "$W/$name" \
    --ckpt_path "$W/$name/ckpt" "$@" > "$W/$name.log" 2>&1 \
    || { tail "$W/$name.log"; fail "$name exited"; }
}

# (a) Queue 0 == synchronous.
run sync --max_steps 6
grep -q "placement (2 ranks" "$W/sync.log" || fail "no placement recap"
run async0 --max_steps 6 --async_train --async_queue_size 0
same_metrics "$W/sync/metrics.jsonl" "$W/async0/metrics.jsonl" \
  || fail "--async_train --async_queue_size 0 differs from the synchronous loop"
echo "ok: --async_queue_size 0 equals the synchronous loop on every metric"

# (b) Staleness: k = 1 and k = 2.
run async1 --max_steps 6 --async_train --async_queue_size 1
run async2 --max_steps 6 --async_train --async_queue_size 2
python3 - "$W/async1/metrics.jsonl" "$W/async2/metrics.jsonl" "$W/sync/metrics.jsonl" <<'EOF' \
  || fail "wrong rollout staleness"
import json, sys
sync = [json.loads(l) for l in open(sys.argv[3])]
for k, path in ((1, sys.argv[1]), (2, sys.argv[2])):
    recs = [json.loads(l) for l in open(path)]
    assert len(recs) == 6, len(recs)
    for r in recs:
        want = min(r["step"] - 1, k)
        assert r["rollout_staleness"] == want, (k, r["step"], r["rollout_staleness"], want)
        assert r["rollout_weight_version"] == r["step"] - 1 - want, r
        assert ("async_wait_s" in r) == (r["step"] <= 6 - k), r  # none ahead of the last step
    # The same prompts in the same order: step 1 trains on the same rollout as the synchronous
    # run (generated with the initial weights); later rollouts come from older weights.
    assert recs[0]["reward_mean"] == sync[0]["reward_mean"], (recs[0], sync[0])
    assert recs[0]["policy_loss"] == sync[0]["policy_loss"]
for r in sync:
    assert r["rollout_staleness"] == 0, r
print("staleness ok")
EOF
echo "ok: --async_queue_size 1 and 2 train on rollouts min(step - 1, k) updates old"

# (c) Resume with a rollout in flight: the straight run's step-4 checkpoint holds the rollout it
# generated ahead for step 5; a new run resumes from it (as after a crash at step 5).
run straight --max_steps 8 --async_train --save_steps 4
copy_ckpt "$W/straight/ckpt" 4 "$W/resumed/ckpt" || fail "copying step 4"
head -4 "$W/straight/metrics.jsonl" > "$W/resumed/metrics.jsonl"
run resumed --max_steps 8 --async_train --save_steps 4 --load_checkpoint
grep -q "resumed from .*step_4.h5 at step 4" "$W/resumed.log" || fail "the async run did not resume"
same_metrics "$W/straight/metrics.jsonl" "$W/resumed/metrics.jsonl" \
  || fail "async: 4 + resume + 4 steps differ from 8 steps straight"
fa=$(fp "$W/straight.log")
fb=$(fp "$W/resumed.log")
[ -n "$fa" ] && [ "$fa" = "$fb" ] || fail "async resume: final weights differ: $fa vs $fb"
# A synchronous run cannot take over a checkpoint that holds a rollout generated ahead.
copy_ckpt "$W/straight/ckpt" 4 "$W/syncres/ckpt" || fail "copying step 4"
if timeout 120 "${MPI[@]}" -np 2 "$RLHF" "${GRPO[@]}" --max_steps 8 --save_path "$W/syncres" \
  --ckpt_path "$W/syncres/ckpt" --load_checkpoint > "$W/syncres.log" 2>&1; then
  fail "a synchronous resume of an async checkpoint was accepted"
fi
grep -q "generated ahead by --async_train" "$W/syncres.log" || { tail "$W/syncres.log"; fail "no reason given"; }
echo "ok: async 4 steps + resume + 4 steps == 8 steps straight (weights $fa)"

# (d) Learning with one-step-stale rollouts.
# grpo.sh's learning run (4 optimizer steps a step), with rollouts one update old.
run learn --max_steps 100 --rollout_batch_size 16 --train_batch_size 32 --async_train
python3 - "$W/learn/metrics.jsonl" <<'EOF' || fail "async GRPO did not learn"
import json, sys
r = [json.loads(l)["reward_mean"] for l in open(sys.argv[1])]
first, last = sum(r[:20]) / 20, sum(r[-20:]) / 20
print(f"async GRPO reward: first 20 steps {first:.3f} -> last 20 steps {last:.3f}")
sys.exit(0 if last > first + 0.15 else 1)
EOF

# (e) Colocated: refused.
if timeout 60 "${MPI[@]}" -np 2 "$RLHF" "${GRPO[@]}" --gen_ranks_per_node 0 --async_train \
  --max_steps 2 --save_path "$W/colo" > "$W/colo.log" 2>&1; then
  fail "--async_train colocated was accepted"
fi
grep -q "async_train needs generation ranks apart from the training ranks" "$W/colo.log" \
  || { tail "$W/colo.log"; fail "colocated refusal without the reason"; }
echo "ok: --async_train on a colocated placement is refused with the reason"
