# The opening every end-to-end script shares. Source it after RLHF=$1 and SRC=$2:
#   . "$SRC/tests/e2e/lib/common.sh"
# Sets MPIEXEC (default mpiexec), W (a temporary folder, removed at exit), fail (prints
# "FAIL: <message>" and exits 1), Open MPI's run-as-root variables, OMP_NUM_THREADS=1, and
# MPI=(mpiexec --oversubscribe --bind-to none) for the script to add -np and a time limit to.
MPIEXEC=${MPIEXEC:-mpiexec}
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
fail() {
  echo "FAIL: $*"
  exit 1
}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
MPI=("$MPIEXEC" --oversubscribe --bind-to none)
