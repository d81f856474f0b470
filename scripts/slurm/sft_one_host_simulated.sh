#!/bin/bash
# Without Slurm: 4 ranks on one host, simulated as 2 nodes of 2 ranks (RLHF_RANKS_PER_NODE or
# --ranks_per_node). Useful to test placement rules and cross-"node" paths on a laptop or CI box.
set -euo pipefail
RLHF=${RLHF:-build/rlhf}
mpirun -np 4 --oversubscribe --bind-to none -x OMP_NUM_THREADS=1 \
  "$RLHF" sft --ranks_per_node 2 --model_config examples/models/tiny.toml \
  --dataset "${1:?usage: $0 DATASET}" --max_len 128 --train_batch_size 16 \
  --micro_train_batch_size 2 --learning_rate 1e-3 --save_path out/sft-4ranks
