#!/usr/bin/env bash
# The `rlhf` binary's front end, end to end: help and version, usage errors (exit status and the
# flag or file:line they name), a model config past the size limits, stub subcommands failing
# loudly, and a 2-rank usage error that must end every rank (MPI_Abort, exit status 2) instead of
# hanging.
#
# usage: cli_errors.sh <path to rlhf> <source dir>     (env MPIEXEC: mpiexec's path)
set -u
RLHF=${1:?usage: cli_errors.sh <rlhf binary> <source dir>}
SRC=${2:?usage: cli_errors.sh <rlhf binary> <source dir>}
MPIEXEC=${MPIEXEC:-mpiexec}
TMP=$(mktemp -d)
RLHF_ABS=$(realpath "$RLHF")
trap 'rm -rf "$TMP"' EXIT
failures=0

fail() {
  echo "FAIL: $*"
  failures=$((failures + 1))
}

# run <name> <args...>: runs rlhf (no mpirun) with a timeout; sets $rc and $out (stdout+stderr).
run() {
  local name=$1
  shift
  out=$(timeout 60 "$RLHF" "$@" 2>&1)
  rc=$?
  printf '%s\n' "$out" >"$TMP/$name.log"
}

# expect_rc <name> <want: 0 | nonzero | N>
expect_rc() {
  case $2 in
    nonzero) [[ $rc -ne 0 && $rc -ne 124 ]] || fail "$1: exit status $rc, want non-zero (124 = timeout)" ;;
    *) [[ $rc -eq $2 ]] || fail "$1: exit status $rc, want $2" ;;
  esac
}

# expect_out <name> <fixed string>
expect_out() {
  grep -qF -- "$2" <<<"$out" || fail "$1: output lacks '$2'; got: $(head -c 2000 <<<"$out")"
}

# --- help and version ------------------------------------------------------------------------
run help --help
expect_rc help 0
for cmd in sft rm grpo ppo generate eval score export import bench; do expect_out help "$cmd"; done

run sft_help sft --help
expect_rc sft_help 0
for opt in "--dataset" "--input_key TEXT=input" "--output_key TEXT=output" "--max_len INT=512" \
  "--truncation TEXT=truncate" "--max_samples INT=100000000" "--micro_train_batch_size INT=8" \
  "--train_batch_size INT=128" "--max_epochs INT=1" "--learning_rate FLOAT=5e-06" \
  "--lr_scheduler TEXT=cosine_with_min_lr" "--lr_warmup_ratio FLOAT=0.03" \
  "--adam_betas [FLOAT,FLOAT]=[0.9,0.95]" "--l2 FLOAT=0" "--max_norm FLOAT=1" "--seed INT=42" \
  "--save_path TEXT=./ckpt" "--save_steps INT=-1" "--logging_steps INT=1" "--model_config" \
  "--pretrain" "--gradient_checkpointing=false" "--zero_stage INT=3" "--adam_offload=false" \
  "--ranks_per_node INT=0" "--threads INT=0" "--log_dir" \
  "--log_level TEXT=info" "--max_steps INT=-1" "--disable_progress=false" "--config"; do
  expect_out sft_help "$opt"
done

run version --version
expect_rc version 0
expect_out version "rlhf "

# --- usage errors ----------------------------------------------------------------------------
run unknown_flag sft --dataset d.jsonl --pretrain p.h5 --lerning_rate 1e-4
expect_rc unknown_flag 2
expect_out unknown_flag "--lerning_rate"
expect_out unknown_flag "did you mean '--learning_rate'"

run bad_value sft --dataset d.jsonl --pretrain p.h5 --learning_rate -1
expect_rc bad_value 2
expect_out bad_value "invalid value for --learning_rate"

run missing_dataset sft --pretrain p.h5
expect_rc missing_dataset 2
expect_out missing_dataset "--dataset is required"

run no_model sft --dataset d.jsonl
expect_rc no_model 2
expect_out no_model "exactly one of --model_config"

run no_subcommand
expect_rc no_subcommand 2

printf 'dataset = "d.jsonl"\npretrain = "p.h5"\nlearning_rate = = 3\n' >"$TMP/syntax.toml"
run bad_toml sft --config "$TMP/syntax.toml"
expect_rc bad_toml 2
expect_out bad_toml "$TMP/syntax.toml:3:17: TOML syntax error"

printf 'dataset = "d.jsonl"\npretrain = "p.h5"\nlerning_rate = 1e-4\n' >"$TMP/key.toml"
run unknown_key sft --config "$TMP/key.toml"
expect_rc unknown_key 2
expect_out unknown_key "$TMP/key.toml:3:1: unknown key 'lerning_rate' for \`rlhf sft\`"

printf 'dataset = "d.jsonl"\npretrain = "p.h5"\nmax_len = "long"\n' >"$TMP/type.toml"
run wrong_type sft --config "$TMP/type.toml"
expect_rc wrong_type 2
expect_out wrong_type "$TMP/type.toml:3:11: key 'max_len': expected an integer, got a string"

# --- sizes past the model limits: a clear error naming the file, key and limit, never a crash ----
# (2^61 positions used to wrap max_position_embeddings x head_dim / 2 and segfault.)
sed 's/^max_position_embeddings = .*/max_position_embeddings = 2305843009213693952/' \
  "$SRC/examples/models/tiny.toml" >"$TMP/huge.toml"
printf '{"input": "1+1=", "output": "2"}\n' >"$TMP/tiny.jsonl"
huge_args=(sft --model_config "$TMP/huge.toml" --dataset "$TMP/tiny.jsonl" --train_batch_size 2
  --micro_train_batch_size 1 --max_steps 1 --save_path "$TMP/huge_out")
run huge_config "${huge_args[@]}"
expect_rc huge_config nonzero
[[ $rc -lt 128 ]] || fail "huge_config: killed by a signal (exit status $rc)"
expect_out huge_config "$TMP/huge.toml"
expect_out huge_config "max_position_embeddings 2305843009213693952 exceeds the limit 16777216"

out=$(timeout 60 "$MPIEXEC" -np 2 --oversubscribe --allow-run-as-root "$RLHF" "${huge_args[@]}" 2>&1)
rc=$?
printf '%s\n' "$out" >"$TMP/mpi_huge_config.log"
[[ $rc -ne 124 ]] || fail "mpi_huge_config: mpiexec -np 2 timed out (a rank hung)"
expect_rc mpi_huge_config nonzero
[[ $rc -lt 128 ]] || fail "mpi_huge_config: killed by a signal (exit status $rc)"
expect_out mpi_huge_config "max_position_embeddings 2305843009213693952 exceeds the limit 16777216"

# --- stubs: every subcommand still stubbed in app/cmd_stubs.cpp must fail loudly ----------------
stubs=$(grep -oE 'int run_[a-z]+\(' "$SRC/app/cmd_stubs.cpp" | sed -E 's/int run_([a-z]+)\(/\1/')
for cmd in $stubs; do
  args=("$cmd" --log_dir "$TMP/logs_$cmd")
  [[ $cmd == sft ]] && args+=(--dataset d.jsonl --pretrain p.h5)
  run "stub_$cmd" "${args[@]}"
  expect_rc "stub_$cmd" 1
  expect_out "stub_$cmd" "\`rlhf $cmd\` is not implemented yet"
  [[ -s $TMP/logs_$cmd/rank_00000.log ]] || fail "stub_$cmd: no log file $TMP/logs_$cmd/rank_00000.log"
done
[[ -n $stubs ]] || echo "note: no stub subcommands left in app/cmd_stubs.cpp"

# --- two ranks: a usage error ends the job on every rank, without hanging ----------------------
out=$(timeout 60 "$MPIEXEC" -np 2 --oversubscribe --allow-run-as-root "$RLHF" sft \
  --dataset d.jsonl --pretrain p.h5 --learning_rate -1 2>&1)
rc=$?
printf '%s\n' "$out" >"$TMP/mpi_bad_value.log"
[[ $rc -ne 124 ]] || fail "mpi_bad_value: mpiexec -np 2 timed out (a rank hung)"
# A usage error is exit status 2 under mpirun too (MPI_Abort carries it to mpirun's status).
expect_rc mpi_bad_value 2
expect_out mpi_bad_value "invalid value for --learning_rate"

# rlhf says so itself before MPI_Abort (Open MPI's own report can be lost on a loaded machine).
grep -q "ending the job on every rank (MPI_Abort)" <<<"$out" ||
  fail "mpi_bad_value: the job did not end through MPI_Abort"

# Only rank 1 fails (its log file cannot be created: a directory is in the way) while rank 0 goes
# on into the subcommand: rank 1's MPI_Abort must end rank 0 too.
mkdir -p "$TMP/mpi_logs/rank_00001.log"
out=$(timeout 60 "$MPIEXEC" -np 2 --oversubscribe --allow-run-as-root "$RLHF" sft \
  --dataset d.jsonl --pretrain p.h5 --log_dir "$TMP/mpi_logs" 2>&1)
rc=$?
printf '%s\n' "$out" >"$TMP/mpi_one_rank.log"
[[ $rc -ne 124 ]] || fail "mpi_one_rank: mpiexec -np 2 timed out (a rank hung)"
[[ $rc -ne 0 ]] || fail "mpi_one_rank: mpiexec -np 2 exited 0"
# (Which rank's message gets out first is a race while `rlhf sft` is a stub that fails at once.)
expect_out mpi_one_rank "] error: "

out=$(timeout 60 "$MPIEXEC" -np 2 --oversubscribe --allow-run-as-root "$RLHF" sft --help 2>&1)
rc=$?
[[ $rc -eq 0 ]] || fail "mpi_help: mpiexec -np 2 rlhf sft --help exited $rc"
[[ $(grep -c "^Usage: rlhf sft" <<<"$out") -eq 1 ]] || fail "mpi_help: help not printed exactly once"

# --- two ranks: usage refusals that need the world (placement, flag combinations) exit 2 at
# start-up, before any model or dataset loads (the model and dataset here do not exist: loading
# them would be a different error, status 1).
# mpi_usage <name> <want text> <args...>
mpi_usage() {
  local name=$1 want=$2
  shift 2
  # From an empty folder: a refused run must leave nothing behind (no ./ckpt log folder).
  local cwd="$TMP/$name.cwd"
  mkdir -p "$cwd"
  out=$(cd "$cwd" && timeout 60 "$MPIEXEC" -np 2 --oversubscribe --allow-run-as-root "$RLHF_ABS" "$@" 2>&1)
  rc=$?
  printf '%s\n' "$out" >"$TMP/$name.log"
  [[ $rc -ne 124 ]] || fail "$name: mpiexec -np 2 timed out (a rank hung)"
  expect_rc "$name" 2
  expect_out "$name" "$want"
  ! grep -q "no such file" <<<"$out" || fail "$name: the model or dataset was opened before the refusal"
  [[ -z "$(ls -A "$cwd")" ]] || fail "$name: the refused run left files behind: $(ls -A "$cwd")"
}
GRPO_ARGS=(grpo --pretrain "$TMP/none.h5" --prompt_data "$TMP/none.jsonl" --reward math --label_key label --n_samples_per_prompt 2
  --rollout_batch_size 2 --train_batch_size 4 --micro_train_batch_size 2 --micro_rollout_batch_size 2)
mpi_usage usage_async_colocated "--async_train needs generation ranks apart from the training ranks" \
  "${GRPO_ARGS[@]}" --async_train
mpi_usage usage_placement "--gen_ranks_per_node" "${GRPO_ARGS[@]}" --gen_ranks_per_node 3
mpi_usage usage_tp "--vllm_tensor_parallel_size" "${GRPO_ARGS[@]}" --gen_ranks_per_node 1 \
  --vllm_tensor_parallel_size 2
# The tensor-parallel size against the model's heads: refused from its config alone (tiny with one
# KV head: 2 cannot split it), with the sizes that would work.
sed 's/^num_key_value_heads = .*/num_key_value_heads = 1/' "$SRC/examples/models/tiny.toml" >"$TMP/tiny_mqa.toml"
mpi_usage usage_tp_heads "the KV heads (1) and intermediate_size (352) of the model" \
  grpo --model_config "$TMP/tiny_mqa.toml" "${GRPO_ARGS[@]:3}" --vllm_tensor_parallel_size 2
mpi_usage usage_sft_gen "unknown option '--gen_ranks_per_node'" sft --dataset "$TMP/none.jsonl" \
  --pretrain "$TMP/none.h5" --gen_ranks_per_node 1
mpi_usage usage_generate_placement "--gen_ranks_per_node" generate --pretrain "$TMP/none.h5" \
  --dataset "$TMP/none.jsonl" --output_path "$TMP/out.jsonl" --gen_ranks_per_node 3

if [[ $failures -ne 0 ]]; then
  echo "cli_errors: $failures check(s) failed"
  exit 1
fi
echo "cli_errors: all checks passed"
