#!/usr/bin/env bash
# LoRA vs full-parameter GRPO on one model and batch: peak RSS, weight-sync bytes per step and
# step time, from each run's metrics.jsonl (peak_rss_bytes, sync_bytes, step_s).
# Usage: scripts/bench_lora.sh RLHF_BINARY MODEL [RANK] [STEPS]
#   MODEL: anything --pretrain reads (e.g. ../shared/data/smollm2-135m-instruct/*.gguf)
#   RANK: --lora_rank (default 16, all-linear, alpha 16); STEPS: --max_steps (default 3)
set -eu
RLHF=$1
MODEL=$2
RANK=${3:-16}
STEPS=${4:-3}
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
COMMON=(grpo --pretrain "$MODEL" --prompt_data "builtin:addition?n=200&digits=1&seed=1"
        --input_key input --label_key label --reward math --n_samples_per_prompt 4
        --rollout_batch_size 2 --train_batch_size 8 --micro_train_batch_size 4
        --generate_max_len 16 --init_kl_coef 0.01 --use_kl_loss --max_steps "$STEPS" --seed 1
        --log_level warn)
run() {  # run NAME ARGS...
  local name=$1
  shift
  "$RLHF" "${COMMON[@]}" "$@" --save_path "$W/$name" --ckpt_path "$W/$name/ckpt" \
    > "$W/$name.log" 2>&1 || { tail "$W/$name.log"; echo "FAIL: $name run"; exit 1; }
}
run full --actor_learning_rate 1e-6
run lora --actor_learning_rate 1e-4 --lora_rank "$RANK" --lora_alpha 16
python3 - "$W/full/metrics.jsonl" "$W/lora/metrics.jsonl" "$RANK" <<'EOF'
import json, platform, subprocess, sys
def load(p):
    return [json.loads(l) for l in open(p) if l.strip()]
full, lora = load(sys.argv[1]), load(sys.argv[2])
def stats(recs):
    rss = max(r["peak_rss_bytes"] for r in recs)
    sync = recs[-1]["sync_bytes"]
    # The first step pays start-up costs (first allocation, packing); report the later ones.
    later = recs[1:] or recs
    step = sum(r["step_s"] for r in later) / len(later)
    return rss, sync, step
cpu = next((l.split(":", 1)[1].strip() for l in subprocess.run(
    ["lscpu"], capture_output=True, text=True).stdout.splitlines() if l.startswith("Model name")),
    platform.processor())
f, l = stats(full), stats(lora)
print(f"CPU: {cpu}")
print(f"{'run':<12}{'peak RSS MiB':>14}{'sync bytes/step':>18}{'step s':>9}")
for name, (rss, sync, step) in (("full", f), (f"lora r={sys.argv[3]}", l)):
    print(f"{name:<12}{rss / 2**20:>14.0f}{sync:>18,}{step:>9.2f}")
print(f"ratios LoRA/full: peak RSS {l[0] / f[0]:.2f}, sync bytes {l[1] / f[1]:.4f}, "
      f"step time {l[2] / f[2]:.2f}")
EOF
