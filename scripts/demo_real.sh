#!/usr/bin/env bash
# The main job on a real chat model (`make demo-real`): GRPO on SmolLM2-135M-Instruct (a GGUF with
# its own chat template, fetched by scripts/get_model.sh) for chat-form additions, on 2 ranks.
#   0. data: "What is a + b? Reply with only the number." with a, b in [1, 30], as user turns
#      rendered by the model's chat template (its default system prompt included); 2,000 training
#      and 64 held-out problems from fixed seeds (python3, standard library only);
#   1. rlhf eval before training: greedy accuracy on the held-out problems;
#   2. mpirun -np 2 rlhf grpo --apply_chat_template --reward math (exact answer = 1, else 0);
#   3. rlhf eval after training on the trained policy; prints before -> after.
# Takes about 18 minutes on 2 cores after the build (docs/install.md has the measured figures).
# Usage: scripts/demo_real.sh [path to rlhf] [output dir]
#   env SMOLLM2_GGUF (a local copy of the GGUF instead of the download), MPIEXEC, DEMO_STEPS (12)
set -euo pipefail
RLHF=${1:-build-demo/rlhf}
OUT=${2:-demo_real_out}
SRC=$(cd "$(dirname "$0")/.." && pwd)
MPIEXEC=${MPIEXEC:-mpirun}
STEPS=${DEMO_STEPS:-12}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
MPI=("$MPIEXEC" --oversubscribe --bind-to none -np 2)
[ "$(id -u)" -eq 0 ] && MPI+=(--allow-run-as-root)
MODEL=${SMOLLM2_GGUF:-$(bash "$SRC/scripts/get_model.sh" smollm2-135m-instruct)}
start=$(date +%s)
rm -rf "$OUT/grpo"
mkdir -p "$OUT"

echo "=== demo-real 0/3: data (chat-form additions, a, b in [1, 30])"
python3 - "$OUT" <<'EOF'
import json, random, sys
out = sys.argv[1]
def write(name, seed, n):
    r = random.Random(seed)
    with open(f"{out}/{name}.jsonl", "w") as f:
        for _ in range(n):
            a, b = r.randint(1, 30), r.randint(1, 30)
            q = f"What is {a} + {b}? Reply with only the number."
            f.write(json.dumps({"input": [{"role": "user", "content": q}], "label": str(a + b)}) + "\n")
write("train", 1, 2000)
write("test", 2, 64)
EOF

EVAL=(eval --input_key input --label_key label --reward math --apply_chat_template --greedy
  --generate_max_len 48 --dataset "$OUT/test.jsonl" --log_level warn)
accuracy() { python3 -c 'import json,sys; print(json.loads(open(sys.argv[1]).readlines()[-1])["summary"]["accuracy"])' "$1"; }

echo "=== demo-real 1/3: rlhf eval before training (64 held-out problems, greedy)"
"${MPI[@]}" "$RLHF" "${EVAL[@]}" --pretrain "$MODEL" --output_path "$OUT/eval_before.jsonl"
before=$(accuracy "$OUT/eval_before.jsonl")
echo "accuracy before: $before"

echo "=== demo-real 2/3: ${MPI[*]} rlhf grpo on SmolLM2-135M-Instruct ($STEPS steps)"
"${MPI[@]}" "$RLHF" grpo --pretrain "$MODEL" --prompt_data "$OUT/train.jsonl" --input_key input \
  --label_key label --apply_chat_template --reward math --n_samples_per_prompt 8 \
  --rollout_batch_size 8 --train_batch_size 64 --micro_train_batch_size 8 --generate_max_len 48 \
  --temperature 1.0 --actor_learning_rate 5e-6 --init_kl_coef 0 --max_steps "$STEPS" --seed 1 \
  --save_path "$OUT/grpo" --ckpt_path "$OUT/grpo/checkpoints" \
  --save_steps 6 --max_ckpt_num 1

echo "=== demo-real 3/3: rlhf eval after training"
"${MPI[@]}" "$RLHF" "${EVAL[@]}" --pretrain "$OUT/grpo/model.h5" --output_path "$OUT/eval_after.jsonl"
after=$(accuracy "$OUT/eval_after.jsonl")
python3 - "$OUT/grpo/metrics.jsonl" <<'EOF'
import json, sys
r = [json.loads(l)["reward_mean"] for l in open(sys.argv[1]) if l.strip()]
k = max(1, len(r) // 4)
print(f"training reward: first {k} steps {sum(r[:k]) / k:.3f} -> last {k} steps {sum(r[-k:]) / k:.3f}")
EOF
echo "held-out accuracy (greedy, 64 problems): $before -> $after"
echo "demo-real took $(($(date +%s) - start)) s | policy $OUT/grpo/model.h5 | metrics $OUT/grpo/metrics.jsonl | evaluations $OUT/eval_before.jsonl, $OUT/eval_after.jsonl"
