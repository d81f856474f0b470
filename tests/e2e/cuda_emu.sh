#!/usr/bin/env bash
# The GPU path end to end on the CUDA emulator (rlhf_emu: the rlhf binary linked against
# tests/cuda_emu): `rlhf sft --device cuda` follows the CPU run; `rlhf generate --device cuda` on
# two ranks (GPU engines with CUDA graphs) writes every sample; `rlhf grpo --device cuda` on two
# ranks (ZeRO-3 over NCCL, GPU engines) trains, checkpoints and resumes, also with LoRA adapters
# (adapter-only syncs, exact resume); the real binary without
# a GPU refuses --device cuda with a clear message. Exit 77 (skipped) when rlhf_emu was not built.
# Usage: cuda_emu.sh <rlhf binary> <source dir>
set -u
RLHF=$1
SRC=$2
EMU=$(dirname "$RLHF")/rlhf_emu
if [ ! -x "$EMU" ]; then
  echo "SKIP: $EMU not built (no CUDA toolkit, or -DRLHF_CUDA_EMU=OFF)"
  exit 77
fi
MPIEXEC=${MPIEXEC:-mpirun}
MPI=("$MPIEXEC" -np 2 --oversubscribe --allow-run-as-root --bind-to none)
export RLHF_CUDA_EMU_DEVICES=2 OMP_NUM_THREADS=1
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
TASK="builtin:addition?n=400&digits=1&seed=1"
# shellcheck source=lib/resume.sh
. "$SRC/tests/e2e/lib/resume.sh"
fail() {
  echo "FAIL: $*"
  exit 1
}

# --- sft: the GPU run follows the CPU run (bf16 against fp32: measured <= 1.2e-3 relative)
SFT=(sft --model_config "$SRC/examples/models/tiny.toml" --dataset "$TASK" --max_len 16
  --train_batch_size 16 --micro_train_batch_size 8 --learning_rate 3e-3 --max_steps 12
  --seed 1 --threads 1 --logging_steps 1)
"$RLHF" "${SFT[@]}" --device cpu --save_path "$TMP/sft_cpu" > "$TMP/sft_cpu.log" 2>&1 ||
  fail "cpu sft: $(tail -3 "$TMP/sft_cpu.log")"
"$EMU" "${SFT[@]}" --device cuda --save_path "$TMP/sft_gpu" > "$TMP/sft_gpu.log" 2>&1 ||
  fail "gpu sft: $(tail -3 "$TMP/sft_gpu.log")"
grep -q "device: cuda" "$TMP/sft_gpu.log" || fail "the emulated run did not train on cuda"
python3 - "$TMP/sft_cpu/metrics.jsonl" "$TMP/sft_gpu/metrics.jsonl" <<'EOF' || fail "sft losses differ"
import json, sys
a = [json.loads(l) for l in open(sys.argv[1])]
b = [json.loads(l) for l in open(sys.argv[2])]
assert len(a) == len(b) == 12, (len(a), len(b))
for x, y in zip(a, b):
    rel = abs(x["loss"] - y["loss"]) / abs(x["loss"])
    print(f"step {x['step']}: cpu loss {x['loss']:.4f} gpu loss {y['loss']:.4f} rel {rel:.2e}")
    assert rel < 1e-2, rel
assert b[-1]["loss"] < 0.8 * b[0]["loss"], "the GPU run did not learn"
EOF

# --- generate: two GPU engines, every sample written
python3 -c "
import json
for i in range(6): print(json.dumps({'input': f'{i}+{i % 3}='}))" > "$TMP/prompts.jsonl"
"${MPI[@]}" "$EMU" generate --pretrain "$TMP/sft_gpu/model.h5" --dataset "$TMP/prompts.jsonl" \
  --output_path "$TMP/out.jsonl" --n_samples_per_prompt 3 --generate_max_len 6 --temperature 0.8 \
  --device cuda --gen_max_num_seqs 4 --threads 1 > "$TMP/gen.log" 2>&1 ||
  fail "gpu generate: $(tail -3 "$TMP/gen.log")"
[ "$(wc -l < "$TMP/out.jsonl")" -eq 18 ] || fail "generate wrote $(wc -l < "$TMP/out.jsonl") samples, want 18"
grep -q "on cuda" "$TMP/gen.log" || fail "generate did not run its engines on cuda"

# --- grpo: two ranks, ZeRO-3 over NCCL, GPU engines; checkpoint at step 2, resume to step 3
GRPO=(grpo --pretrain "$TMP/sft_gpu/model.h5" --prompt_data "$TASK" --input_key input
  --label_key label --reward math --n_samples_per_prompt 4 --rollout_batch_size 8
  --train_batch_size 16 --micro_train_batch_size 4 --generate_max_len 6 --actor_learning_rate 3e-4
  --num_episodes 1 --seed 1 --threads 1 --device cuda --save_path "$TMP/grpo"
  --ckpt_path "$TMP/grpo/ckpt" --save_steps 2)
"${MPI[@]}" "$EMU" "${GRPO[@]}" --max_steps 2 > "$TMP/grpo1.log" 2>&1 ||
  fail "gpu grpo: $(tail -3 "$TMP/grpo1.log")"
"${MPI[@]}" "$EMU" "${GRPO[@]}" --max_steps 3 --load_checkpoint > "$TMP/grpo2.log" 2>&1 ||
  fail "gpu grpo resume: $(tail -3 "$TMP/grpo2.log")"
grep -q "resumed from" "$TMP/grpo2.log" || fail "the GPU run did not resume"
# Two training ranks write the sharded form by default (--ckpt_format auto), from the GPU store.
ls "$TMP/grpo/ckpt/step_2_shards/"rank-*-of-00002.h5 > /dev/null 2>&1 ||
  fail "no sharded checkpoint from the GPU store: $(ls "$TMP/grpo/ckpt")"
[ "$(wc -l < "$TMP/grpo/metrics.jsonl")" -eq 3 ] ||
  fail "grpo metrics: $(wc -l < "$TMP/grpo/metrics.jsonl") records, want 3"
python3 - "$TMP/grpo/metrics.jsonl" <<'EOF' || fail "grpo metrics not finite"
import json, math, sys
for l in open(sys.argv[1]):
    r = json.loads(l)
    for k, v in r.items():
        if isinstance(v, float):
            assert math.isfinite(v), (k, v)
    print(f"step {r['step']}: reward {r['reward_mean']:.3f}")
EOF
[ -f "$TMP/grpo/model.h5" ] || fail "no final policy"

# --- LoRA on the GPU path: grpo --lora_rank on two ranks (the frozen base in bf16 device stores,
# the adapter branch in the GPU model, GPU engines merging the synced adapters): every sync sends
# the adapters only (tiny, r = 8 on all 7 projections: 74752 floats); 2 steps + checkpoint +
# --load_checkpoint 2 more == 4 steps straight (metrics and final weights), dropout included
LORA=(grpo --pretrain "$TMP/sft_gpu/model.h5" --prompt_data "$TASK" --input_key input
  --label_key label --reward math --n_samples_per_prompt 4 --rollout_batch_size 4
  --train_batch_size 16 --micro_train_batch_size 4 --generate_max_len 6 --actor_learning_rate 3e-3
  --lr_scheduler constant --lora_rank 8 --lora_alpha 16 --lora_dropout 0.1 --init_kl_coef 0.01
  --use_kl_loss --num_episodes 1 --seed 1 --threads 1 --device cuda)
"${MPI[@]}" "$EMU" "${LORA[@]}" --max_steps 4 --save_path "$TMP/lora_s" \
  --ckpt_path "$TMP/lora_s/ckpt" --save_steps 4 > "$TMP/lora_s.log" 2>&1 ||
  fail "gpu grpo --lora_rank: $(tail -3 "$TMP/lora_s.log")"
grep -q "LoRA r=8 alpha=16" "$TMP/lora_s.log" || fail "no LoRA recap in the GPU run"
"${MPI[@]}" "$EMU" "${LORA[@]}" --max_steps 2 --save_path "$TMP/lora_r" \
  --ckpt_path "$TMP/lora_r/ckpt" --save_steps 2 > "$TMP/lora_r1.log" 2>&1 ||
  fail "gpu grpo --lora_rank (first half): $(tail -3 "$TMP/lora_r1.log")"
"${MPI[@]}" "$EMU" "${LORA[@]}" --max_steps 4 --save_path "$TMP/lora_r" \
  --ckpt_path "$TMP/lora_r/ckpt" --load_checkpoint > "$TMP/lora_r2.log" 2>&1 ||
  fail "gpu grpo --lora_rank resume: $(tail -3 "$TMP/lora_r2.log")"
grep -q "resumed from .*step_2.h5 at step 2" "$TMP/lora_r2.log" || fail "the GPU LoRA run did not resume"
same_metrics "$TMP/lora_s/metrics.jsonl" "$TMP/lora_r/metrics.jsonl" ||
  fail "GPU LoRA: 2 + 2 steps after resume differ from 4 steps straight"
fa=$(fp "$TMP/lora_s.log")
fb=$(fp "$TMP/lora_r2.log")
[ -n "$fa" ] && [ "$fa" = "$fb" ] || fail "GPU LoRA final weights differ: $fa (straight) vs $fb (resumed)"
python3 - "$TMP/lora_s/metrics.jsonl" <<'EOF' || fail "GPU LoRA sync bytes or metrics"
import json, math, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
assert len(recs) == 4, len(recs)
for r in recs:
    assert r["sync_bytes"] == 4 * 74752, r["sync_bytes"]
    assert math.isfinite(r["policy_loss"]) and math.isfinite(r["kl_mean"]), r
print("gpu lora: sync bytes", [r["sync_bytes"] for r in recs],
      "reward", [round(r["reward_mean"], 3) for r in recs])
EOF
echo "ok: GPU LoRA (emulator): adapters-only sync, resume exact (weights $fa)"

# --- multi-turn on GPU engines: the toy environment (a turn ends at a digit, the environment
# answers with observation tokens), two steps on two ranks
"${MPI[@]}" "$EMU" grpo --pretrain "$TMP/sft_gpu/model.h5" --prompt_data "$TASK" --input_key input \
  --env_command builtin:toy --stop_strings "0,1,2,3,4,5,6,7,8,9" --env_max_turns 3 \
  --n_samples_per_prompt 4 --rollout_batch_size 4 --train_batch_size 16 --micro_train_batch_size 4 \
  --generate_max_len 12 --max_steps 2 --seed 1 --threads 1 --device cuda \
  --save_path "$TMP/env" --ckpt_path "$TMP/env/ckpt" > "$TMP/env.log" 2>&1 ||
  fail "gpu grpo with --env_command: $(tail -3 "$TMP/env.log")"
python3 - "$TMP/env/metrics.jsonl" <<'EOF' || fail "no multi-turn episodes on the GPU engines"
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
assert len(recs) == 2, len(recs)
assert sum(r["env_observation_tokens"] for r in recs) > 0, recs
print("gpu env: turns", [round(r["env_turns_mean"], 2) for r in recs],
      "observation tokens", [r["env_observation_tokens"] for r in recs])
EOF

# --- partial rollouts on GPU engines: a step stops at its quota of finished groups, the rest
# carry over (re-prefilled on the GPU engine next step); three steps on two ranks
"${MPI[@]}" "$EMU" grpo --pretrain "$TMP/sft_gpu/model.h5" --prompt_data "$TASK" --input_key input \
  --label_key label --reward math --partial_rollout --n_samples_per_prompt 4 \
  --rollout_batch_size 4 --train_batch_size 16 --micro_train_batch_size 4 --generate_max_len 12 \
  --max_steps 3 --seed 1 --threads 1 --device cuda --save_path "$TMP/partial" \
  --ckpt_path "$TMP/partial/ckpt" > "$TMP/partial.log" 2>&1 ||
  fail "gpu grpo with --partial_rollout: $(tail -3 "$TMP/partial.log")"
python3 - "$TMP/partial/metrics.jsonl" <<'EOF' || fail "partial-rollout metrics missing on the GPU engines"
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
assert len(recs) == 3, len(recs)
for r in recs:
    assert r["partial_rounds"] >= 1 and r["partial_age_max"] <= 8, r
print("gpu partial: carried", [r["partial_carried_samples"] for r in recs],
      "interrupted", [r["partial_interrupted_samples"] for r in recs])
EOF

# --- the real binary has no GPU here: --device cuda is a clear error, not a crash
if "$RLHF" "${SFT[@]}" --device cuda --save_path "$TMP/nogpu" > "$TMP/nogpu.log" 2>&1; then
  grep -q "device: cuda" "$TMP/nogpu.log" || fail "--device cuda without a GPU succeeded"
else
  grep -q -- "--device cuda" "$TMP/nogpu.log" || fail "unclear --device cuda error: $(tail -2 "$TMP/nogpu.log")"
fi
echo PASS
