# The opening every end-to-end script shares. Source it after RLHF=$1 and SRC=$2:
#   . "$SRC/tests/e2e/lib/common.sh"
# Sets MPIEXEC (default mpiexec), W (a temporary folder, removed at exit), fail (prints
# "FAIL: <message>" and exits 1), Open MPI's run-as-root variables, OMP_NUM_THREADS=1, and
# MPI=(mpiexec --oversubscribe --bind-to none) for the script to add -np and a time limit to.
# warm_start_sft STEPS (below) trains the tiny policy most RL scripts start from.
MPIEXEC=${MPIEXEC:-mpiexec}
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
fail() {
  echo "FAIL: $*"
  exit 1
}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
MPI=("$MPIEXEC" --oversubscribe --bind-to none)

# warm_start_sft STEPS: SFT of the tiny model (examples/models/tiny.toml) on $TASK for STEPS
# steps (batches of 32, learning rate 3e-3, seed 1, one thread) into $W/sft/model.h5. On 1-digit
# additions 150 steps reach ~30% exact answers: enough signal for GRPO. Fails the script when the
# run fails or writes no model.
warm_start_sft() {
  "$RLHF" sft --model_config "$SRC/examples/models/tiny.toml" --dataset "$TASK" --max_len 16 \
    --train_batch_size 32 --micro_train_batch_size 32 --learning_rate 3e-3 --max_steps "$1" \
    --max_epochs 100 --seed 1 --threads 1 --save_path "$W/sft" --log_level warn \
    || fail "sft warm start exited $?"
  [ -f "$W/sft/model.h5" ] || fail "sft warm start wrote no model.h5"
}
