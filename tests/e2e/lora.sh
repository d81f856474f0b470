#!/usr/bin/env bash
# LoRA end to end (--lora_rank) on the built-in 1-digit addition task (no download):
#  (a) sft with LoRA adapters: the loss falls; the saved model is the merged one and loads back;
#  (b) GRPO with LoRA (all-linear) on 2 ranks raises the math reward; the reference policy is the
#      base (adapters off) and the engines receive the adapters only: sync_bytes = 4 · adapter
#      floats, a few % of a full-parameter run's;
#  (c) k steps + checkpoint (adapters and their moments) + --load_checkpoint k more steps == 2k
#      steps straight: identical per-step metrics and final weights;
#      export --format peft writes the checkpoint's adapter as the run saved it, and export
#      --merge_lora merges it into the base exactly as the run's merged model;
#  (d) bad LoRA flags exit 2 naming the flag.
# Usage: lora.sh <rlhf binary> <source dir>     (env MPIEXEC: mpiexec's path)
set -u
RLHF=$1
SRC=$2
# shellcheck source=lib/common.sh
. "$SRC/tests/e2e/lib/common.sh"
# shellcheck source=lib/resume.sh
. "$SRC/tests/e2e/lib/resume.sh"
TASK="builtin:addition?n=2000&digits=1&seed=1"
mean_of() {  # mean_of FILE KEY LO HI: mean of KEY over metrics.jsonl records [LO, HI)
  python3 - "$1" "$2" "$3" "$4" <<'EOF'
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
v = [r[sys.argv[2]] for r in recs[int(sys.argv[3]):int(sys.argv[4])]]
print(f"{sum(v) / len(v):.6g}")
EOF
}

# (a) SFT with LoRA on a full-parameter warm start's task: the loss falls.
SFT=(sft --dataset "$TASK" --max_len 16 --train_batch_size 32 --micro_train_batch_size 32
     --max_epochs 100 --seed 1 --threads 1 --log_level warn)
warm_start_sft 150
"$RLHF" "${SFT[@]}" --pretrain "$W/sft/model.h5" --learning_rate 1e-2 --max_steps 30 \
  --lora_rank 8 --lora_alpha 16 --save_path "$W/sft_lora" > "$W/sft_lora.log" 2>&1 \
  || { tail "$W/sft_lora.log"; fail "sft --lora_rank exited"; }
[ -f "$W/sft_lora/model.h5" ] || fail "no merged model from sft --lora_rank"
first=$(mean_of "$W/sft_lora/metrics.jsonl" loss 0 5)
last=$(mean_of "$W/sft_lora/metrics.jsonl" loss 25 30)
python3 -c "import sys; sys.exit(0 if $last < 0.97 * $first else 1)" \
  || fail "LoRA sft loss did not fall: $first -> $last"
echo "ok: sft with LoRA r=8: loss $first (steps 1-5) -> $last (steps 26-30); merged model saved"
# The merged model loads as an ordinary model.
"$RLHF" "${SFT[@]}" --pretrain "$W/sft_lora/model.h5" --learning_rate 1e-9 --max_steps 1 \
  --save_path "$W/reload" > /dev/null 2>&1 || fail "the merged model does not load back"
again=$(mean_of "$W/reload/metrics.jsonl" loss 0 1)
python3 -c "import sys; sys.exit(0 if $again < $first else 1)" \
  || fail "the merged model lost the adapters' training: loss $again vs $first at the start"
echo "ok: the merged model loads back (loss $again)"

GRPO=(grpo --pretrain "$W/sft/model.h5" --prompt_data "$TASK" --input_key input --label_key label
      --reward math --n_samples_per_prompt 8 --rollout_batch_size 8 --train_batch_size 32
      --micro_train_batch_size 8 --generate_max_len 8 --seed 1 --init_kl_coef 0.01 --use_kl_loss)

# (b) Learning with LoRA, and the sync bytes against a full-parameter run's.
timeout 400 "${MPI[@]}" -np 2 "$RLHF" "${GRPO[@]}" --rollout_batch_size 16 --lora_rank 8 \
  --lora_alpha 16 --actor_learning_rate 3e-3 --max_steps 100 --save_path "$W/learn" \
  --ckpt_path "$W/learn/ckpt" > "$W/learn.log" 2>&1 \
  || { tail "$W/learn.log"; fail "grpo --lora_rank (learning run) exited"; }
grep -q "LoRA r=8 alpha=16 on q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj" \
  "$W/learn.log" || fail "no LoRA recap"
first=$(mean_of "$W/learn/metrics.jsonl" reward_mean 0 20)
last=$(mean_of "$W/learn/metrics.jsonl" reward_mean 80 100)
python3 -c "import sys; sys.exit(0 if $last > $first + 0.1 else 1)" \
  || fail "reward did not rise enough with LoRA: first 20 steps $first, last 20 steps $last"
echo "ok: GRPO with LoRA on 2 ranks raises the math reward: $first -> $last"
"${MPI[@]}" -np 2 "$RLHF" "${GRPO[@]}" --actor_learning_rate 3e-4 --max_steps 1 \
  --save_path "$W/full" --ckpt_path "$W/full/ckpt" > "$W/full.log" 2>&1 \
  || { tail "$W/full.log"; fail "full-parameter grpo exited"; }
lora_bytes=$(mean_of "$W/learn/metrics.jsonl" sync_bytes 0 100)
full_bytes=$(mean_of "$W/full/metrics.jsonl" sync_bytes 0 1)
# tiny (4 layers, hidden 128): r = 8 on all 7 projections is 74752 adapter floats.
python3 -c "import sys; sys.exit(0 if $lora_bytes == 4 * 74752 and $lora_bytes < 0.12 * $full_bytes else 1)" \
  || fail "sync bytes: LoRA $lora_bytes, full $full_bytes (want 4 * 74752 and < 12%)"
echo "ok: a LoRA sync sends the adapters only: $lora_bytes bytes vs $full_bytes for the full model"

# (c) Resume exactness with LoRA (constant learning rate: a 3-step and a 6-step run share it).
K=3
RES=("${GRPO[@]}" --lora_rank 4 --target_modules q_proj,v_proj,down_proj --actor_learning_rate 3e-3
     --lr_scheduler constant)
"${MPI[@]}" -np 2 "$RLHF" "${RES[@]}" --max_steps $((2 * K)) --save_path "$W/straight" \
  --ckpt_path "$W/straight/ckpt" --save_steps $((2 * K)) > "$W/straight.log" 2>&1 \
  || { tail "$W/straight.log"; fail "straight LoRA run exited"; }
"${MPI[@]}" -np 2 "$RLHF" "${RES[@]}" --max_steps $K --save_path "$W/resumed" \
  --ckpt_path "$W/resumed/ckpt" --save_steps $K > "$W/first.log" 2>&1 \
  || { tail "$W/first.log"; fail "first LoRA half exited"; }
[ -f "$W/resumed/ckpt/step_$K.h5" ] || fail "no checkpoint step_$K.h5"
"${MPI[@]}" -np 2 "$RLHF" "${RES[@]}" --max_steps $((2 * K)) --save_path "$W/resumed" \
  --ckpt_path "$W/resumed/ckpt" --load_checkpoint > "$W/second.log" 2>&1 \
  || { tail "$W/second.log"; fail "resumed LoRA run exited"; }
grep -q "resumed from .*step_$K.h5 at step $K" "$W/second.log" || fail "the LoRA run did not resume"
same_metrics "$W/straight/metrics.jsonl" "$W/resumed/metrics.jsonl" \
  || fail "k + k LoRA steps after resume differ from 2k steps straight"
fa=$(fp "$W/straight.log")
fb=$(fp "$W/second.log")
[ -n "$fa" ] && [ "$fa" = "$fb" ] || fail "final weights differ: $fa (straight) vs $fb (resumed)"
echo "ok: LoRA $K steps + resume + $K steps == $((2 * K)) steps straight (weights $fa)"
# PEFT interop: the checkpoint's adapter exported as PEFT is the adapter the run saved, byte for
# byte; the base with that adapter merged by `rlhf export --merge_lora` is the run's merged model.
"$RLHF" export --pretrain "$W/straight/ckpt/step_$((2 * K)).h5" --format peft \
  --output_path "$W/peft" --log_level warn || fail "export --format peft exited"
cmp "$W/peft/adapter_model.safetensors" "$W/straight/model_adapter/adapter_model.safetensors" \
  || fail "the exported PEFT adapter differs from the one the run saved"
"$RLHF" export --pretrain "$W/straight/model.h5" --output_path "$W/trained_hf" --log_level warn \
  || fail "export of the trained model exited"
"$RLHF" export --pretrain "$W/sft/model.h5" --lora_path "$W/peft" --merge_lora \
  --output_path "$W/merged_hf" --log_level warn || fail "export --merge_lora exited"
cmp "$W/trained_hf/model.safetensors" "$W/merged_hf/model.safetensors" \
  || fail "base + exported adapter merged differs from the run's merged model"
echo "ok: export --format peft gives the run's adapter; export --merge_lora gives its merged model"
# Disaggregated (1 training rank + 1 generation rank): the adapters reach the engine over the
# intercommunicator, and the run follows the colocated one (same samples, losses and KL).
"${MPI[@]}" -np 2 "$RLHF" "${RES[@]}" --max_steps $K --ranks_per_node 2 --gen_ranks_per_node 1 \
  --save_path "$W/disagg" > "$W/disagg.log" 2>&1 || { tail "$W/disagg.log"; fail "disaggregated LoRA run exited"; }
python3 - "$W/disagg/metrics.jsonl" "$W/straight/metrics.jsonl" <<'EOF2' || fail "disaggregated LoRA run diverged"
import json, sys
a = [json.loads(l) for l in open(sys.argv[1])]
b = [json.loads(l) for l in open(sys.argv[2])][:len(a)]
for x, y in zip(a, b):
    for k in ["reward_mean", "response_length_mean", "policy_loss", "kl_mean", "sync_bytes"]:
        if abs(x[k] - y[k]) > 1e-5 * max(1.0, abs(y[k])):
            sys.exit(f"step {x['step']}: {k} {x[k]} vs {y[k]}")
EOF2
echo "ok: a disaggregated LoRA run (adapters over the intercommunicator) follows the colocated one"
# A full-parameter run refuses the LoRA checkpoint.
out=$("${MPI[@]}" -np 1 "$RLHF" "${GRPO[@]}" --max_steps $((2 * K)) --save_path "$W/resumed" \
  --ckpt_path "$W/resumed/ckpt" --load_checkpoint 2>&1) && fail "a full run resumed a LoRA checkpoint"
echo "$out" | grep -q "holds LoRA adapters" || { echo "$out" | tail -3; fail "no LoRA resume message"; }
echo "ok: a full-parameter run refuses a LoRA checkpoint"

# (d) Bad flags: usage errors.
for bad in "--target_modules q_proj,qq_proj" "--lora_dropout 1" "--lora_rank -1" "--lora_alpha 0"; do
  # shellcheck disable=SC2086
  rank=(--lora_rank 4)
  [ "${bad%% *}" = "--lora_rank" ] && rank=()
  out=$("$RLHF" "${SFT[@]}" --pretrain "$W/sft/model.h5" --max_steps 1 --save_path "$W/bad" \
    "${rank[@]}" $bad 2>&1)
  code=$?
  [ $code -eq 2 ] || { echo "$out" | tail -3; fail "$bad: exit $code, want 2"; }
  echo "$out" | grep -q -- "${bad%% *}" || { echo "$out" | tail -3; fail "$bad: flag not named"; }
  echo "ok: $bad -> exit 2"
done
