#!/usr/bin/env bash
# The fault campaign's CI set (scripts/fault_campaign.py; the full set is its default of 10 trials
# per mode): in sft, grpo (colocated, disaggregated, async, with an environment) and generate on 2
# ranks, one trial per mode stops or kills a rank drawn from a fixed seed at a drawn moment of the
# steady state; each job must end within 2x --comm_timeout with the rank and the phase named, and
# the training modes resume from their last checkpoint to exactly the straight run.
# Usage: fault_campaign.sh <rlhf binary> <source dir>     (env MPIEXEC: mpiexec's path)
set -u
RLHF=$1
SRC=$2
# shellcheck source=lib/common.sh
. "$SRC/tests/e2e/lib/common.sh"
python3 "$SRC/scripts/fault_campaign.py" --rlhf "$RLHF" --src "$SRC" --mpiexec "$MPIEXEC" \
  --trials 1 --seed 1 --comm_timeout 5 --workdir "$W/campaign" || fail "the fault campaign failed"
echo PASS
