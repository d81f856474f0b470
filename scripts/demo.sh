#!/usr/bin/env bash
# The demo main job. Today: supervised training of a tiny byte-level model on generated
# multi-digit additions ("12+34=" -> "46"), showing the loss fall and the checkpoint it writes.
# Usage: scripts/demo.sh [path to rlhf] [output dir]
set -euo pipefail
RLHF=${1:-build/rlhf}
OUT=${2:-demo_out}
SRC=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$OUT"
awk 'BEGIN { srand(2024); for (i = 0; i < 4000; i++) { a = int(rand() * 100); b = int(rand() * 100);
  printf "{\"input\": \"%d+%d=\", \"output\": \"%d\"}\n", a, b, a + b } }' > "$OUT/addition.jsonl"
echo "demo: wrote $OUT/addition.jsonl (4000 two-digit additions)"
"$RLHF" sft --model_config "$SRC/examples/models/tiny.toml" --dataset "$OUT/addition.jsonl" \
  --max_len 16 --train_batch_size 64 --micro_train_batch_size 64 --learning_rate 3e-3 \
  --lr_warmup_ratio 0.05 --max_epochs 4 --save_path "$OUT/sft" --logging_steps 10
echo "demo: checkpoint $OUT/sft/model.h5, metrics $OUT/sft/metrics.jsonl, logs $OUT/sft/logs/"
