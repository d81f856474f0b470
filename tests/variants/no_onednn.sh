#!/usr/bin/env bash
# rlhf as a build without oneDNN makes it (CMake's rlhf_nodnnl: the same code, matmul_bf16.cpp
# compiled without RLHF_ONEDNN): it says so at start-up, --param_dtype bf16 is a usage error
# (exit 2) naming the flag on every command tried, auto computes in fp32, and the fp32 path is the
# one the oneDNN build runs: the same SFT run gives bitwise the same weights with either binary,
# and GRPO trains end to end.
# Usage: no_onednn.sh <rlhf built without oneDNN> <rlhf> <source dir>   (env MPIEXEC: mpiexec's path)
set -u
NODNNL=$1
RLHF=$2
SRC=$3
# shellcheck source=../e2e/lib/common.sh
. "$SRC/tests/e2e/lib/common.sh"
# shellcheck source=../e2e/lib/resume.sh
. "$SRC/tests/e2e/lib/resume.sh"
TASK="builtin:addition?n=400&digits=1&seed=1"
SFT=(sft --model_config "$SRC/examples/models/tiny.toml" --dataset "$TASK" --max_len 16
     --train_batch_size 16 --micro_train_batch_size 8 --learning_rate 3e-3 --max_steps 20
     --seed 1 --threads 2)

# refused <command> <args...>: the command with --param_dtype bf16 exits 2 with the flag and the
# missing library named.
refused() {
  local cmd=$1 out rc
  out=$("$NODNNL" "$@" --param_dtype bf16 2>&1)
  rc=$?
  [ $rc -eq 2 ] || fail "$cmd --param_dtype bf16 without oneDNN: exit $rc, not 2: $(tail -2 <<<"$out")"
  grep -qF -- "--param_dtype bf16: bf16 compute on the CPU needs oneDNN" <<<"$out" \
    || fail "$cmd --param_dtype bf16 without oneDNN: no clear message: $(tail -2 <<<"$out")"
}
refused "${SFT[@]}" --save_path "$W/refused"
refused grpo --model_config "$SRC/examples/models/tiny.toml" --prompt_data "$TASK" \
  --input_key input --label_key label --reward math --max_steps 1 --save_path "$W/refused"

# auto = fp32, and the fp32 path is the oneDNN build's, bit for bit.
"$NODNNL" "${SFT[@]}" --save_path "$W/nodnnl" > "$W/nodnnl.log" 2>&1 \
  || { tail "$W/nodnnl.log"; fail "sft without oneDNN exited $?"; }
grep -q "param_dtype: fp32" "$W/nodnnl.log" || fail "sft without oneDNN: auto did not pick fp32"
"$RLHF" "${SFT[@]}" --param_dtype fp32 --save_path "$W/dnnl" > "$W/dnnl.log" 2>&1 \
  || { tail "$W/dnnl.log"; fail "sft (fp32) exited $?"; }
a=$(fp "$W/nodnnl.log") b=$(fp "$W/dnnl.log")
[ -n "$a" ] && [ "$a" = "$b" ] || fail "fp32 sft weights differ between the builds: '$a' vs '$b'"
echo "ok: sft without oneDNN runs fp32 and ends on the oneDNN build's fp32 weights ($a)"
printf '{"input": "1+2="}\n' > "$W/prompts.jsonl"
refused generate --pretrain "$W/nodnnl/model.h5" --dataset "$W/prompts.jsonl" \
  --output_path "$W/refused.jsonl"
echo "ok: sft, grpo and generate refuse --param_dtype bf16 (exit 2) without oneDNN"

"$NODNNL" grpo --pretrain "$W/nodnnl/model.h5" --prompt_data "$TASK" --input_key input \
  --label_key label --reward math --n_samples_per_prompt 4 --rollout_batch_size 8 \
  --train_batch_size 32 --micro_train_batch_size 16 --generate_max_len 6 --max_steps 2 --seed 1 \
  --threads 2 --save_path "$W/grpo" > "$W/grpo.log" 2>&1 \
  || { tail "$W/grpo.log"; fail "grpo without oneDNN exited $?"; }
[ "$(wc -l < "$W/grpo/metrics.jsonl")" -eq 2 ] || fail "grpo without oneDNN: expected 2 steps"
echo "ok: grpo without oneDNN trains (fp32 trainer and engine)"
