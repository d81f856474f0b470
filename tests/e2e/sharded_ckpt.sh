#!/usr/bin/env bash
# Sharded checkpoints and sharded Hugging Face exports, end to end with sft on 2 ranks:
# (a) --ckpt_format sharded writes step_N.h5 (the index) + step_N_shards/rank-*-of-00002.h5 and
#     logs the checkpoint's seconds and GB/s;
# (b) a job killed while writing a checkpoint (RLHF_INJECT_FAILURE=checkpoint_write:1 aborts every
#     rank in the middle of the shards) leaves the previous checkpoint the newest: the next run
#     resumes from it and ends with the weights of the run that was never interrupted;
# (c) 2 -> 1 ranks: the sharded checkpoint and the single-file one of the same step resume on one
#     rank to the same final weights;
# (d) `rlhf export --dtype bfloat16 --max_shard_size` writes model-0000k-of-0000n.safetensors +
#     model.safetensors.index.json, which `rlhf import` reads back; a sharded training checkpoint
#     is a --pretrain like any other;
# (e) grpo writes and resumes sharded checkpoints (2 + 2 steps == 4 steps, bit for bit).
# Usage: sharded_ckpt.sh <rlhf binary> <source dir>     (env MPIEXEC: mpiexec's path)
set -u
RLHF=$1
SRC=$2
. "$SRC/tests/e2e/lib/common.sh"
. "$SRC/tests/e2e/lib/resume.sh"

awk 'BEGIN { srand(11); split("the cat dog sat on a mat and ran to big small red blue house tree", w, " ");
  for (i = 0; i < 200; i++) { s = ""; for (j = 0; j < 10; j++) s = s w[int(rand() * 16) + 1] " "; print s "."; print "" } }' > "$W/text.txt"
# A constant learning rate: runs of different --max_steps share the schedule.
ARGS=(sft --model_config "$SRC/examples/models/tiny.toml" --dataset "$W/text.txt" --max_len 48
      --train_batch_size 16 --micro_train_batch_size 2 --learning_rate 3e-3 --lr_scheduler constant
      --seed 5 --save_steps 2)
run() {  # run <np> <name> <args...>: log in $W/<name>.log
  local np=$1 name=$2
  shift 2
  timeout 300 "${MPI[@]}" -np "$np" "$RLHF" "${ARGS[@]}" --save_path "$W/$name" "$@" \
    > "$W/$name.log" 2>&1
}

# The uninterrupted runs: 6 steps on 2 ranks, sharded and single-file checkpoints.
run 2 straight --max_steps 6 --ckpt_path "$W/straight/ckpt" --ckpt_format sharded \
  || { tail "$W/straight.log"; fail "straight run exited"; }
run 2 single --max_steps 6 --ckpt_path "$W/single/ckpt" --ckpt_format single \
  || { tail "$W/single.log"; fail "single-file run exited"; }
fs=$(fp "$W/straight.log")
[ -n "$fs" ] && [ "$fs" = "$(fp "$W/single.log")" ] || fail "the checkpoint form changed the run"

# (a) The files and the log line.
C=$W/straight/ckpt
for f in step_2.h5 step_2_shards/rank-00000-of-00002.h5 step_2_shards/rank-00001-of-00002.h5; do
  [ -f "$C/$f" ] || fail "no $f"
done
[ ! -e "$C/step_2_shards.tmp" ] || fail "a .tmp shard folder was left behind"
grep -qE "checkpoint .*step_2.h5: [0-9.]+ GB in [0-9.]+ s \([0-9.]+ GB/s, 2 shards\)" "$W/straight.log" \
  || fail "no checkpoint speed line"
grep -qE "checkpoint .*step_2.h5: .*one file\)" "$W/single.log" || fail "no single-file speed line"
echo "ok: sharded checkpoint files and speed: $(grep -oE 'step_4.h5: .*shards\)' "$W/straight.log")"

# (b) Killed while writing step 4: 3 steps with a step-2 checkpoint, then a resumed run that dies
# in the middle of writing step 4's shards.
run 2 killed --max_steps 3 --ckpt_path "$W/killed/ckpt" --ckpt_format sharded \
  || { tail "$W/killed.log"; fail "first part exited"; }
RLHF_INJECT_FAILURE=checkpoint_write:1 run 2 killed2 --max_steps 6 --ckpt_path "$W/killed/ckpt" \
  --ckpt_format sharded --load_checkpoint && fail "the injected failure did not end the job"
grep -q "injected failure at checkpoint_write on rank 1" "$W/killed2.log" \
  || { tail "$W/killed2.log"; fail "no injected-failure message"; }
[ ! -e "$W/killed/ckpt/step_4.h5" ] || fail "a half-written step_4.h5 was committed"
run 2 killed3 --max_steps 6 --ckpt_path "$W/killed/ckpt" --ckpt_format sharded --load_checkpoint \
  || { tail "$W/killed3.log"; fail "resume after the kill exited"; }
grep -q "resumed from .*step_2.h5 at step 2" "$W/killed3.log" || fail "did not resume from step 2"
[ "$(fp "$W/killed3.log")" = "$fs" ] || fail "resumed after the kill: weights differ from straight"
echo "ok: a kill while writing step 4 leaves step 2, which resumes to the straight run's weights $fs"

# (c) 2 -> 1 ranks from both forms of step 2: the same final weights.
for form in straight single; do
  mkdir -p "$W/one_$form/ckpt"
  cp -r "$W/$form/ckpt/step_2.h5" "$W/one_$form/ckpt/"
  [ -d "$W/$form/ckpt/step_2_shards" ] && cp -r "$W/$form/ckpt/step_2_shards" "$W/one_$form/ckpt/"
  run 1 "one_$form" --threads 1 --max_steps 6 --ckpt_path "$W/one_$form/ckpt" --load_checkpoint \
    || { tail "$W/one_$form.log"; fail "1-rank resume of the $form checkpoint exited"; }
  grep -q "resumed from .*step_2.h5 at step 2" "$W/one_$form.log" || fail "$form: no resume"
done
f1=$(fp "$W/one_straight.log")
[ -n "$f1" ] && [ "$f1" = "$(fp "$W/one_single.log")" ] \
  || fail "1-rank resumes of the sharded and the single-file checkpoint differ"
echo "ok: 2 -> 1 ranks: the sharded and single-file step-2 checkpoints resume to weights $f1"

# (d) A bf16 export cut into shards of at most 500 KB, read back by import.
"$RLHF" export --log_level warn --pretrain "$W/straight/model.h5" --dtype bfloat16 \
  --max_shard_size 500KB --output_path "$W/hf" || fail "sharded export exited"
[ ! -e "$W/hf/model.safetensors" ] || fail "a sharded export also wrote model.safetensors"
n=$(ls "$W/hf"/model-000*-of-000*.safetensors | wc -l)
[ "$n" -ge 2 ] || fail "expected several shards, got $n"
grep -q '"total_size"' "$W/hf/model.safetensors.index.json" || fail "index has no total_size"
grep -q '"model.norm.weight": "model-' "$W/hf/model.safetensors.index.json" || fail "weight_map"
"$RLHF" import --log_level warn --pretrain "$W/hf" --output_path "$W/back.h5" \
  || fail "import of the sharded export exited"
"$RLHF" export --log_level warn --pretrain "$W/straight/ckpt/step_4.h5" --format hdf5 \
  --output_path "$W/from_shards.h5" || fail "export of a sharded training checkpoint exited"
out=$("$RLHF" export --pretrain "$W/straight/model.h5" --max_shard_size 5XB --output_path "$W/x" 2>&1)
[ $? -eq 2 ] && echo "$out" | grep -q "max_shard_size" || fail "bad --max_shard_size not refused: $out"
echo "ok: bf16 export in $n shards + index, imported back; a sharded checkpoint exports"
# (e) GRPO (policy + its critic-free RL state) with sharded checkpoints: 2 + 2 steps resumed equal
# 4 steps straight.
G=(grpo --pretrain "$W/straight/model.h5" --prompt_data "builtin:addition?n=200&digits=1&seed=1"
   --input_key input --label_key label --reward length --n_samples_per_prompt 4 --rollout_batch_size 4
   --train_batch_size 16 --micro_train_batch_size 4 --generate_max_len 6 --seed 1 --threads 1
   --ckpt_format sharded --save_steps 2 --lr_scheduler constant)
grpo() {  # grpo <name> <args...>
  local name=$1
  shift
  timeout 300 "${MPI[@]}" -np 2 "$RLHF" "${G[@]}" --save_path "$W/$name" --ckpt_path "$W/g/ckpt_$name" \
    "$@" > "$W/$name.log" 2>&1 || { tail "$W/$name.log"; fail "grpo $name exited"; }
}
grpo g_straight --max_steps 4
grpo g_first --max_steps 3
cp -r "$W/g/ckpt_g_first" "$W/g/ckpt_g_second"
grpo g_second --max_steps 4 --load_checkpoint
grep -q "resumed from .*step_2.h5 at step 2" "$W/g_second.log" || fail "grpo did not resume"
[ -d "$W/g/ckpt_g_first/step_2_shards" ] || fail "grpo wrote no shards"
g=$(fp "$W/g_straight.log")
[ -n "$g" ] && [ "$g" = "$(fp "$W/g_second.log")" ] || fail "grpo: 2 + resume + 2 steps differ from 4"
[ "$g" != "$fs" ] || fail "grpo did not change the weights (the test would prove nothing)"
echo "ok: grpo with sharded checkpoints: 2 + resume + 2 steps == 4 steps (weights $g)"
echo PASS
