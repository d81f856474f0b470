#!/usr/bin/env bash
# Experiment tracking end to end: --use_tensorboard writes event files that TensorBoard's own
# reader reads (where a python3 with tensorboard is available: RLHF_TEST_PYTHON, else python3;
# skipped otherwise), --log_completions samples become a text table, --use_wandb drives W&B's
# client through scripts/wandb_sidecar.py (checked with a stand-in `wandb` module that records the
# calls, and with the real client offline where it is installed), and --use_wandb without the
# client is one clear error before training.
# Usage: tracking.sh <rlhf binary> <source dir>
set -u
RLHF=$1
SRC=$2
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
PY=${RLHF_TEST_PYTHON:-python3}
TASK="builtin:addition?n=64&digits=1&seed=1"
SFT=(sft --model_config "$SRC/examples/models/tiny.toml" --dataset "$TASK" --max_len 16
     --train_batch_size 16 --micro_train_batch_size 16 --max_steps 3 --learning_rate 1e-3)

# 1. TensorBoard: sft scalars, grpo scalars and completions.
"$RLHF" "${SFT[@]}" --save_path "$W/sft" --use_tensorboard "$W/sft/runs" > "$W/sft.log" 2>&1 ||
  { tail -20 "$W/sft.log"; fail "sft --use_tensorboard"; }
ls "$W"/sft/runs/events.out.tfevents.* > /dev/null 2>&1 || fail "sft wrote no event file"
"$RLHF" grpo --pretrain "$W/sft/model.h5" --prompt_data "$TASK" --label_key label --reward math \
  --n_samples_per_prompt 4 --rollout_batch_size 4 --train_batch_size 16 \
  --micro_train_batch_size 4 --generate_max_len 4 --max_steps 2 --log_completions \
  --save_path "$W/grpo" --use_tensorboard "$W/grpo/runs" > "$W/grpo.log" 2>&1 ||
  { tail -20 "$W/grpo.log"; fail "grpo --use_tensorboard --log_completions"; }
if "$PY" -c "import tensorboard" 2> /dev/null; then
  "$PY" "$SRC/scripts/check_tensorboard.py" "$W/sft/runs" --expect loss lr grad_norm --steps 3 ||
    fail "TensorBoard cannot read sft's event files"
  "$PY" "$SRC/scripts/check_tensorboard.py" "$W/grpo/runs" --expect reward_mean kl_mean gen_s \
    --expect-text completions --steps 2 || fail "TensorBoard cannot read grpo's event files"
  echo "ok: TensorBoard reads the event files"
else
  echo "skip: TensorBoard's reader ($PY cannot import tensorboard; set RLHF_TEST_PYTHON to a venv's python)"
fi

# 2. --use_wandb without the W&B client: one clear error, before training.
mkdir -p "$W/nowandb"
printf '#!/bin/sh\nexit 1\n' > "$W/nowandb/python3"
chmod +x "$W/nowandb/python3"
out=$(PATH="$W/nowandb:$PATH" "$RLHF" "${SFT[@]}" --save_path "$W/nw" --use_wandb 2>&1)
rc=$?
[ $rc -eq 1 ] || fail "--use_wandb without wandb: exit $rc, want 1"
echo "$out" | grep -q "the W&B client is not installed" || { echo "$out" | tail -5; fail "no clear W&B error"; }
echo "$out" | grep -q "step 1/" && fail "--use_wandb without wandb trained anyway"
echo "ok: --use_wandb without the client is refused"

# 3. The sidecar with a stand-in wandb module: init with the flags, every step logged, finish.
export FAKE_WANDB_LOG="$W/fake_wandb.jsonl"
PYTHONPATH="$SRC/tests/fixtures/fake_wandb" "$RLHF" "${SFT[@]}" --save_path "$W/fw" \
  --use_wandb --wandb_project proj --wandb_group grp --wandb_run_name run1 > "$W/fw.log" 2>&1 ||
  { tail -20 "$W/fw.log"; fail "sft --use_wandb (stand-in client)"; }
python3 - "$FAKE_WANDB_LOG" "$W/fw/metrics.jsonl" << 'PYEOF' || fail "the sidecar's W&B calls are wrong"
import json, sys
calls = [json.loads(l) for l in open(sys.argv[1])]
metrics = [json.loads(l) for l in open(sys.argv[2])]
init = calls[0]["init"]
assert init == {"project": "proj", "group": "grp", "name": "run1", "entity": None,
                "job_type": "sft"}, init
assert calls[0]["config"], "no run config"
logs = [c for c in calls if "step" in c]
assert [c["step"] for c in logs] == [m["step"] for m in metrics], (logs, metrics)
for c, m in zip(logs, metrics):
    assert abs(c["values"]["loss"] - m["loss"]) < 1e-12, (c, m)
assert calls[-1] == {"finish": True}, calls[-1]
print(f"ok: sidecar logged {len(logs)} steps to project proj and finished")
PYEOF
unset FAKE_WANDB_LOG

# 4. The real client, offline, where it is installed.
WPY=$PY
if "$WPY" -c "import wandb" 2> /dev/null; then
  WBIN=$(dirname "$(command -v "$WPY")")
  PATH="$WBIN:$PATH" WANDB_MODE=offline WANDB_DIR="$W/wb" WANDB_SILENT=true \
    "$RLHF" "${SFT[@]}" --save_path "$W/rw" --use_wandb --wandb_project rlhf-test > "$W/rw.log" 2>&1 ||
    { tail -20 "$W/rw.log"; fail "sft --use_wandb with W&B offline"; }
  grep -q "W&B sidecar ended with" "$W/rw.log" && { tail -20 "$W/rw.log"; fail "the W&B sidecar failed"; }
  ls -d "$W"/wb/wandb/offline-run-* > /dev/null 2>&1 || fail "no offline W&B run written"
  echo "ok: W&B offline run written by the real client"
else
  echo "skip: the real W&B client ($WPY cannot import wandb)"
fi
echo PASS
