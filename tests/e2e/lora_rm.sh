#!/usr/bin/env bash
# LoRA on models with a scalar head, end to end (--lora_rank in `rlhf rm` and for the PPO critic):
# the trunk gets adapters, the score head trains fully (PEFT's modules_to_save), the base stays
# frozen.
#  (a) rm with LoRA on separable synthetic preferences: the loss falls and the pairwise accuracy
#      rises; the saved PEFT folder is a SEQ_CLS adapter with the score head;
#  (b) 2 ranks follow the 1-rank loss curve;
#  (c) with --lora_dropout 0.1: a resume from the step-k checkpoint of a 2k-step run repeats its
#      last k steps (metrics and weights; the dropout masks follow the weights and the batch), and
#      export --format peft of the checkpoint is the adapter the run saved then, byte for byte;
#  (d) ppo with LoRA on the actor and the critic (critic from the LoRA reward model): the critic
#      recap, 2 ranks = 1 rank, 2 + 2 steps after a resume == 4 straight; export --format peft
#      writes the critic's adapter (critic_adapter/) beside the actor's; the critic's SEQ_CLS
#      adapter merges into the reward model and is refused onto an LM.
# Usage: lora_rm.sh <rlhf binary> <source dir>     (env MPIEXEC: mpiexec's path)
set -u
RLHF=$1
SRC=$2
# shellcheck source=lib/common.sh
. "$SRC/tests/e2e/lib/common.sh"
# shellcheck source=lib/resume.sh
. "$SRC/tests/e2e/lib/resume.sh"

awk 'BEGIN { srand(3); split("kind nice helpful good", g, " "); split("rude mean bad awful", b, " ");
  for (i = 0; i < 256; i++) { c = ""; r = "";
    for (j = 0; j < 5; j++) { c = c " " g[int(rand() * 4) + 1]; r = r " " b[int(rand() * 4) + 1] }
    printf "{\"prompt\": \"Q: say something. A:\", \"chosen\": \"%s\", \"rejected\": \"%s\"}\n", c, r } }' > "$W/pairs.jsonl"
RM=(rm --model_config "$SRC/examples/models/tiny.toml" --dataset "$W/pairs.jsonl" --prompt_key prompt
    --max_len 64 --train_batch_size 16 --micro_train_batch_size 4 --learning_rate 3e-3
    --seed 1 --threads 1 --lora_rank 4 --lora_alpha 8
    --target_modules q_proj,v_proj,up_proj,down_proj)
field() { grep -o "\"$2\":[-0-9.e+]*" "$1/metrics.jsonl" | cut -d: -f2; }
mean() { field "$1" "$2" | sed -n "$3,$4p" | awk '{ s += $1 } END { printf "%.6g", s / NR }'; }

# (a) Learning.
"${MPI[@]}" -np 1 "$RLHF" "${RM[@]}" --max_steps 16 --save_path "$W/a" --log_level warn > "$W/a.log" 2>&1 \
  || { tail "$W/a.log"; fail "rm --lora_rank exited"; }
first=$(mean "$W/a" loss 1 3)
last=$(mean "$W/a" loss 14 16)
acc0=$(mean "$W/a" acc 1 3)
acc=$(mean "$W/a" acc 14 16)
echo "rm with LoRA r=4: loss $first -> $last, accuracy $acc0 -> $acc"
awk -v f="$first" -v l="$last" -v a0="$acc0" -v a="$acc" 'BEGIN { exit !(l < 0.5 * f && a > a0 && a >= 0.9) }' \
  || fail "rm with LoRA did not learn"
A="$W/a/model_adapter"
python3 - "$A" <<'EOF' || fail "the saved adapter is not a SEQ_CLS PEFT folder with the score head"
import json, struct, sys
c = json.load(open(sys.argv[1] + "/adapter_config.json"))
assert c["task_type"] == "SEQ_CLS" and "score" in c["modules_to_save"], c
raw = open(sys.argv[1] + "/adapter_model.safetensors", "rb").read()
keys = json.loads(raw[8:8 + struct.unpack("<Q", raw[:8])[0]])
assert keys["base_model.model.score.weight"]["shape"] == [1, 128], keys.get("base_model.model.score.weight")
EOF
echo "ok: rm with LoRA learns; $A is a SEQ_CLS adapter with base_model.model.score.weight"

# (b) 2 ranks = 1 rank.
"${MPI[@]}" -np 2 "$RLHF" "${RM[@]}" --max_steps 16 --save_path "$W/b" --log_level warn > "$W/b.log" 2>&1 \
  || { tail "$W/b.log"; fail "rm --lora_rank on 2 ranks exited"; }
paste <(field "$W/a" loss) <(field "$W/b" loss) | awk '{ d = $1 - $2; if (d < 0) d = -d;
  if (d > 1e-3 * ($1 + 1e-3)) { print "step " NR ": " $1 " vs " $2; bad = 1 } } END { exit bad }' \
  || fail "rm with LoRA: 2 ranks diverged from 1 rank"
echo "ok: rm with LoRA, 2 ranks follow 1 rank"

# (c) Resume exactness (constant learning rate). A supervised run checkpoints at --save_steps
# before its last step: the straight 2k-step run writes step_k.h5, and a second run resumes from a
# copy of it.
K=3
R=("${RM[@]}" --lr_scheduler constant --lora_dropout 0.1)  # dropout masks resume too
"${MPI[@]}" -np 2 "$RLHF" "${R[@]}" --max_steps $((2 * K)) --save_path "$W/straight" \
  --ckpt_path "$W/straight/ckpt" --save_steps $K > "$W/straight.log" 2>&1 \
  || { tail "$W/straight.log"; fail "straight rm run exited"; }
[ -f "$W/straight/ckpt/step_$K.h5" ] || fail "no checkpoint step_$K.h5"
copy_ckpt "$W/straight/ckpt" $K "$W/resumed/ckpt" || fail "copying step $K"
"${MPI[@]}" -np 2 "$RLHF" "${R[@]}" --max_steps $((2 * K)) --save_path "$W/resumed" \
  --ckpt_path "$W/resumed/ckpt" --load_checkpoint > "$W/second.log" 2>&1 \
  || { tail "$W/second.log"; fail "resumed rm run exited"; }
grep -q "resumed from .*step_$K.h5 at step $K" "$W/second.log" || fail "the rm LoRA run did not resume"
python3 - "$W/straight/metrics.jsonl" "$W/resumed/metrics.jsonl" <<'EOF2' || fail "rm with LoRA: resumed steps differ from straight"
import json, sys
drop = lambda r: {k: v for k, v in r.items() if not (k.endswith("_s") or "per_s" in k or k in ("mfu", "peak_rss_bytes"))}
a = [drop(json.loads(l)) for l in open(sys.argv[1])]
b = [drop(json.loads(l)) for l in open(sys.argv[2])]
assert len(b) == len(a) // 2 and b == a[len(a) // 2:], (len(a), len(b))
EOF2
fa=$(fp "$W/straight.log")
fb=$(fp "$W/second.log")
[ -n "$fa" ] && [ "$fa" = "$fb" ] || fail "final weights differ: $fa (straight) vs $fb (resumed)"
echo "ok: rm with LoRA and dropout, $K steps + resume + $K steps == $((2 * K)) straight (weights $fa)"
"$RLHF" export --pretrain "$W/straight/ckpt/step_$K.h5" --format peft \
  --output_path "$W/peft" --log_level warn || fail "export --format peft exited"
cmp "$W/peft/adapter_model.safetensors" "$W/straight/model_step${K}_adapter/adapter_model.safetensors" \
  || fail "the exported PEFT adapter differs from the one the rm run saved at step $K"
echo "ok: export --format peft of the rm checkpoint gives the run's adapter and score head"

# (d) PPO with a LoRA critic (and actor), the critic from the LoRA reward model.
TASK="builtin:addition?n=2000&digits=1&seed=1"
PPO=(ppo --model_config "$SRC/examples/models/tiny.toml" --reward_pretrain "$W/a/model.h5"
     --prompt_data "$TASK" --input_key input --rollout_batch_size 8 --n_samples_per_prompt 2
     --train_batch_size 16 --micro_train_batch_size 4 --generate_max_len 8
     --lr_scheduler constant --actor_learning_rate 1e-3 --critic_learning_rate 1e-3 --seed 3
     --lora_rank 4 --lora_alpha 8 --threads 1)
"${MPI[@]}" -np 2 "$RLHF" "${PPO[@]}" --max_steps 4 --save_path "$W/ppo_a" \
  --ckpt_path "$W/ppo_a/ckpt" > "$W/ppo_a.log" 2>&1 || { tail "$W/ppo_a.log"; fail "ppo exited"; }
grep -q "critic: LoRA r=4 alpha=8 .*score head" "$W/ppo_a.log" || fail "no LoRA critic recap"
"${MPI[@]}" -np 1 "$RLHF" "${PPO[@]}" --max_steps 4 --save_path "$W/ppo_1" > "$W/ppo_1.log" 2>&1 \
  || { tail "$W/ppo_1.log"; fail "ppo on 1 rank exited"; }
python3 - "$W/ppo_1/metrics.jsonl" "$W/ppo_a/metrics.jsonl" <<'EOF' || fail "ppo with a LoRA critic: 2 ranks differ from 1"
import json, sys
a = [json.loads(l) for l in open(sys.argv[1])]
b = [json.loads(l) for l in open(sys.argv[2])]
assert len(a) == len(b) == 4, (len(a), len(b))
for x, y in zip(a, b):
    for k in ["reward_mean", "response_length_mean", "policy_loss", "actor_grad_norm",
              "value_loss", "critic_grad_norm"]:
        if abs(x[k] - y[k]) > 1e-3 * max(1.0, abs(y[k])):
            sys.exit(f"step {x['step']}: {k} {x[k]} (1 rank) vs {y[k]} (2 ranks)")
EOF
echo "ok: ppo with LoRA on the actor and the critic: 2 ranks = 1 rank"
"${MPI[@]}" -np 2 "$RLHF" "${PPO[@]}" --max_steps 2 --save_path "$W/ppo_b" \
  --ckpt_path "$W/ppo_b/ckpt" --save_steps 2 > "$W/ppo_b1.log" 2>&1 \
  || { tail "$W/ppo_b1.log"; fail "ppo first half exited"; }
"${MPI[@]}" -np 2 "$RLHF" "${PPO[@]}" --max_steps 4 --save_path "$W/ppo_b" \
  --ckpt_path "$W/ppo_b/ckpt" --load_checkpoint > "$W/ppo_b2.log" 2>&1 \
  || { tail "$W/ppo_b2.log"; fail "ppo resume exited"; }
same_metrics "$W/ppo_a/metrics.jsonl" "$W/ppo_b/metrics.jsonl" || fail "ppo LoRA resume differs"
[ "$(fp "$W/ppo_a.log")" = "$(fp "$W/ppo_b2.log")" ] || fail "ppo LoRA resume: final weights differ"
echo "ok: ppo with a LoRA critic: 2 steps + resume + 2 steps == 4 steps straight"
# export --format peft of a PPO checkpoint: the actor's adapter, and the critic's in
# critic_adapter/ (a SEQ_CLS adapter with the score head). The critic's merges into its base (the
# reward model); merging it into an LM (the actor) is refused instead of dropping its score head.
"$RLHF" export --pretrain "$W/ppo_b/ckpt/step_2.h5" --format peft --output_path "$W/ppo_peft" \
  --log_level warn || fail "export --format peft of a ppo checkpoint exited"
[ -f "$W/ppo_peft/adapter_model.safetensors" ] || fail "no actor adapter in the ppo export"
[ -f "$W/ppo_peft/critic_adapter/adapter_model.safetensors" ] || fail "no critic_adapter/ in the ppo export"
python3 - "$W/ppo_peft" <<'EOF' || fail "the exported adapters' configs"
import json, sys
a = json.load(open(sys.argv[1] + "/adapter_config.json"))
c = json.load(open(sys.argv[1] + "/critic_adapter/adapter_config.json"))
assert a["task_type"] == "CAUSAL_LM" and not a.get("modules_to_save"), a
assert c["task_type"] == "SEQ_CLS" and "score" in c["modules_to_save"] and c["r"] == 4, c
EOF
"$RLHF" export --pretrain "$W/a/model.h5" --merge_lora --lora_path "$W/ppo_peft/critic_adapter" \
  --format hdf5 --output_path "$W/critic_merged.h5" --log_level warn \
  || fail "merging the critic's adapter into the reward model exited"
out=$("$RLHF" export --pretrain "$W/ppo_a/model.h5" --merge_lora --lora_path \
  "$W/ppo_peft/critic_adapter" --format hdf5 --output_path "$W/bad.h5" 2>&1) \
  && fail "a SEQ_CLS adapter merged into an LM"
echo "$out" | grep -q "sequence-classification adapter" || { echo "$out" | tail -3; fail "unclear SEQ_CLS merge error"; }
echo "ok: export --format peft writes the PPO critic's adapter too; a SEQ_CLS adapter is not merged into an LM"
echo PASS
