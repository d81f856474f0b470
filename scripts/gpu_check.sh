#!/usr/bin/env bash
# The GPU checks, on a machine with an NVIDIA GPU, from a bundle made by scripts/gpu_bundle.sh:
#   env    the GPU, driver and the NVIDIA libraries found
#   tests  the CUDA unit tests (rlhf_tests, every *_cuda.cpp file and test_cuda_check.cpp)
#   attn   cuDNN attention (cudnn-frontend) against the flash-attention kernels at training shapes:
#          causal GQA, D 64 and 128, T on and off multiples of 128; one "cudnn vs flash" line per
#          shape with the max differences (out, lse, dq, dk, dv) and forward/backward times
#   mpi    the NCCL, device-store, weight-sync and GPU RL-step tests of rlhf_mpi_tests (1 rank)
#   e2e    sft and grpo, --device cpu against --device cuda with the same seed (tiny model)
#   bench  rlhf bench train (flash and auto attention)|generate|sync --device cuda (135M, ~1B);
#          also one at a time: train, generate, sync
#   grpo135m  GRPO steps on the GPU at the SmolLM-135M shape (random weights): step time, phases
#   partial   rlhf bench partial --device cuda: a partial-rollout step against a synchronous one
#   grpo1b    GRPO steps at the ~1B shape (random weights, Llama 2's vocabulary): 64 prompts x 8
#             samples x 512 new tokens, colocated, one GPU; phases from metrics.jsonl, the GPU's
#             peak memory from nvidia-smi sampled every 200 ms (<out dir>/grpo1b_mem.csv)
#   amx    issue 24 on this machine's own CPU (a Xeon with AMX), 2 threads on 2 cores: oneDNN
#          bf16 against fp32 matmuls and attention (bench gemm's gemm_attention rows), bf16
#          (attention through oneDNN: auto) against fp32 training and decode at the SmolLM-135M
#          shape, and PyTorch side by side where this machine has it; with rlhf-cpu.tar.xz
#          beside the bundle (gpu_bundle.sh's CPU build) when there, else the GPU build (whose
#          own kernels are x86-64-v3 only); not in the default list
#   amxgen decode on this machine's CPU next to transformers, both bf16 at the SmolLM-135M shape
#          (random weights; scripts/bench_transformers.py --model_config), batch 16
#   amxgemm, amxtrain, amxdecode (AMX_DECODE_BATCHES, default 1,16), amxtorch, amxgen: the parts
#          of amx, one at a time (each pins itself to CPUs 0 and 1 too)
#   profile   per-kernel GPU time (ncu) of a 1B training step (profile_train; PROFILE_ATTN picks
#             the attention, default cudnn) and of decode steps at batch 1 (profile_decode); not
#             in the default list; ncu needs a Firecracker machine (gVisor has no counters)
# Each step runs under its own time limit and writes <out dir>/<step>.log (grpo135m: e2e.log); the bench rows go to
# <out dir>/bench.jsonl, the runs' metrics (with "run": name) to <out dir>/metrics.jsonl. The
# tokenizer.model the GRPO steps need (Llama 2's) lies beside the bundle. One rank: Open MPI runs as a singleton (no mpirun, no daemon).
# Usage: scripts/gpu_check.sh <rlhf-gpu.tar.xz> <out dir> [step ...]   (default: all, in order)
# A step written with a trailing '&' (quoted: 'amx&') runs in the background while the steps after
# it run on the CPUs but 0 and 1 (the amx step pins itself to those two), so one lease measures
# the CPU and the GPU at once, e.g.: scripts/gpu_check.sh .gpu/rlhf-gpu.tar.xz out env 'amx&'
# partial tests. The script waits for the background steps before it exits.
set -u
TAR=$1
OUT=$2
shift 2
STEPS=${*:-env tests attn mpi bench partial e2e grpo135m grpo1b}
SRC=$(cd "$(dirname "$0")/.." && pwd)
ROOT=/tmp/rlhf-gpu
mkdir -p "$OUT"
[ -x "$ROOT/bin/rlhf" ] || tar -C /tmp -xJf "$TAR" || { echo "cannot unpack $TAR"; exit 1; }

# NVIDIA's libraries from the machine (the toolkit's, else the Python wheels').
NV=""
for lib in libcublasLt.so.13 libcublas.so.13 libcudnn.so.9 libnccl.so.2; do
  p=$(find /usr/local/cuda/ /usr/local/cuda*/ /usr/lib/x86_64-linux-gnu /opt /usr/local/lib \
    -name "$lib" 2> /dev/null | head -1)
  if [ -z "$p" ]; then echo "gpu_check: $lib not found on this machine"; continue; fi
  case ":$NV:" in *":$(dirname "$p"):"*) ;; *) NV="$NV:$(dirname "$p")" ;; esac
done
# wrap <bundle root> <extra library dirs> <binary...>: <root>/wrap/<binary> runs <root>/bin/<binary>
# with the bundle's libraries (for rlhf's binaries only, not for the machine's own tools), and
# lib-fallback's libstdc++ when the machine's is older; prints that library path.
wrap() {
  local root=$1 libs="$1/lib$2" b
  shift 2
  LD_LIBRARY_PATH="$libs" "$root/bin/rlhf" --version > /dev/null 2>&1 || libs="$libs:$root/lib-fallback"
  mkdir -p "$root/wrap"
  for b in "$@"; do
    printf '#!/bin/sh\nLD_LIBRARY_PATH="%s" exec "%s" "$@"\n' "$libs" "$root/bin/$b" > "$root/wrap/$b"
    chmod +x "$root/wrap/$b"
  done
  echo "$libs"
}
LIBS=$(wrap "$ROOT" "$NV" rlhf rlhf_tests rlhf_mpi_tests)
export OMPI_MCA_mca_base_component_path="$ROOT/openmpi" OMPI_MCA_ess_singleton_isolated=1
export OMPI_MCA_btl=self,vader OMPI_MCA_pml=ob1 OMPI_MCA_btl_vader_single_copy_mechanism=none
export OMPI_MCA_mtl="^ofi,psm,psm2" OMPI_MCA_osc="^ucx" OMPI_MCA_coll="^han"
BIN=$ROOT/wrap
RLHF=$BIN/rlhf
TASK="builtin:addition?n=400&digits=1&seed=1"
M135=$SRC/examples/models/smollm-135M.toml  # SmolLM-135M's shape
TMP=/tmp/rlhf-gpu-run
mkdir -p "$TMP"

run() {  # run <step> <seconds> <command...>: output to <out>/<step>.log and the terminal
  local step=$1 secs=$2
  shift 2
  local t0=$SECONDS
  echo "=== $step (limit ${secs}s): $*" | tee -a "$OUT/$step.log"
  timeout -k 5 "$secs" "$@" >> "$OUT/$step.log" 2>&1
  local rc=$?
  echo "=== $step: rc $rc after $((SECONDS - t0))s" | tee -a "$OUT/$step.log"
  grep -v -e "^===" -e "\] | " -e "\] +--" "$OUT/$step.log" | tail -n 8 | cut -c1-300
  return $rc
}

write_m1b() {  # write_m1b <file> <vocab>: the ~1B shape (Llama-3.2-1B's body) as TOML
  cat > "$1" << EOF
model_type = "llama"
vocab_size = $2
hidden_size = 2048
intermediate_size = 8192
num_hidden_layers = 16
num_attention_heads = 32
num_key_value_heads = 8
max_position_embeddings = 4096
rope_theta = 500000.0
tie_word_embeddings = true
EOF
}

step_env() {
  {
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem \
      --format=csv
    nvcc --version | tail -1
    echo "libraries: $LIBS"
    LD_LIBRARY_PATH="$LIBS" ldd "$ROOT/bin/rlhf" | grep -E "cuda|cublas|nccl|cudnn|not found"
    LD_LIBRARY_PATH="$LIBS" ldd "$ROOT/bin/rlhf" | awk '/nccl|cudnn|cublas/ {print $3}' |
      xargs -n1 readlink -f  # the versions, in the files' names
    lscpu | grep -E "Model name|^CPU\(s\)|Flags" | cut -c1-200
    "$RLHF" --version
  } > "$OUT/env.log" 2>&1
  cat "$OUT/env.log"
}

step_tests() {
  run tests 150 "$BIN/rlhf_tests" -sf='*_cuda.cpp,*test_cuda_check.cpp' -s=false --duration=true
}

step_attn() {  # RLHF_CUDNN_DEBUG=1: a refused shape prints cudnn-frontend's reason
  (
    export RLHF_CUDNN_DEBUG=1
    run attn 240 "$BIN/rlhf_tests" -tc='*cudnn vs flash*' --no-skip -s=false --duration=true
  )
  grep -E "^cudnn vs flash|refused" "$OUT/attn.log" | cut -c1-400
}

step_mpi() {
  run mpi 100 "$BIN/rlhf_mpi_tests" -tc='*nccl*,*device*,*gpu*' --duration=true
}

step_e2e() {
  local SFT=(sft --model_config "$SRC/examples/models/tiny.toml" --dataset "$TASK" --max_len 16
    --train_batch_size 16 --micro_train_batch_size 8 --learning_rate 3e-3 --max_steps 30
    --seed 1 --threads 4 --logging_steps 10)
  run e2e 30 "$RLHF" "${SFT[@]}" --device cpu --save_path "$TMP/sft_cpu"
  run e2e 30 "$RLHF" "${SFT[@]}" --device cuda --save_path "$TMP/sft_gpu"
  local GRPO=(grpo --pretrain "$TMP/sft_cpu/model.h5" --prompt_data "$TASK" --input_key input
    --label_key label --reward math --n_samples_per_prompt 8 --rollout_batch_size 16
    --train_batch_size 128 --micro_train_batch_size 16 --generate_max_len 6
    --actor_learning_rate 3e-4 --max_steps 8 --seed 1 --threads 4)
  run e2e 45 "$RLHF" "${GRPO[@]}" --device cpu --save_path "$TMP/grpo_cpu"
  run e2e 45 "$RLHF" "${GRPO[@]}" --device cuda --save_path "$TMP/grpo_gpu"
  for r in sft_cpu sft_gpu grpo_cpu grpo_gpu; do
    sed "s/^{/{\"run\":\"$r\",/" "$TMP/$r/metrics.jsonl" >> "$OUT/metrics.jsonl" 2> /dev/null
  done
}

step_train() {  # training MFU with the flash kernels and with the default (auto: cuDNN); TRAIN_IMPLS
  # picks (default "flash auto")
  local impl
  for impl in ${TRAIN_IMPLS:-flash auto}; do
    run bench 120 "$RLHF" bench train --device cuda --tokens_per_step 16384 --seq_len 1024 \
      --steps 3 --warmup 1 --attn_implementation "$impl" --output "$OUT/bench.jsonl"
  done
}

step_generate() {  # decode at batch 1, 8, 64 (1 with cuBLASLt, 64 with host sampling)
  run bench 90 "$RLHF" bench generate --device cuda --gen_batches 1,8,64 --output "$OUT/bench.jsonl"
}

step_sync() {
  run bench 30 "$RLHF" bench sync --device cuda --output "$OUT/bench.jsonl"
}

step_bench() {
  step_train
  step_generate
  step_sync
}

step_grpo135m() {  # SmolLM-135M's body with Llama 2's 32,000-token vocabulary (tokenizer.model
  # beside the bundle): the real GGUF is too large to carry; the weights are random.
  sed -e 's/^vocab_size = .*/vocab_size = 32000/' -e 's/^bos_token_id = .*/bos_token_id = 1/' \
    -e 's/^eos_token_id = .*/eos_token_id = 2/' "$M135" \
    > "$TMP/m135.toml"
  run e2e 30 "$RLHF" sft --model_config "$TMP/m135.toml" \
    --tokenizer "$(dirname "$TAR")/tokenizer.model" --dataset "$TASK" --max_len 32 \
    --train_batch_size 8 --micro_train_batch_size 8 --max_steps 1 --device cuda \
    --save_path "$TMP/m135"
  run e2e 90 "$RLHF" grpo --pretrain "$TMP/m135/model.h5" --prompt_data "$TASK" \
    --input_key input --label_key label --reward math --n_samples_per_prompt 8 \
    --rollout_batch_size 8 --train_batch_size 64 --micro_train_batch_size 16 \
    --generate_max_len 128 --max_steps 4 --seed 1 --device cuda --save_path "$TMP/g135"
  sed 's/^{/{"run":"grpo135m",/' "$TMP/g135/metrics.jsonl" >> "$OUT/metrics.jsonl" 2> /dev/null
}

step_partial() {  # --partial_rollout against the synchronous step on the GPU engine (one
  # sample in 64 eight times longer; stories15M and SmolLM-135M shapes)
  run partial 60 "$RLHF" bench partial --device cuda --output "$OUT/bench.jsonl"
  run partial 60 "$RLHF" bench partial --device cuda \
    --model_config "$M135" --output "$OUT/bench.jsonl"
}

step_grpo1b() {  # the issue's shape: 64 prompts x 8 samples x 512 new tokens, colocated, one GPU
  write_m1b "$TMP/m1b32k.toml" 32000
  nvidia-smi --query-gpu=timestamp,memory.used,utilization.gpu --format=csv,noheader -lms 200 \
    > "$OUT/grpo1b_mem.csv" 2> /dev/null &
  local smi=$!
  run grpo1b 240 "$RLHF" grpo --model_config "$TMP/m1b32k.toml" \
    --tokenizer "$(dirname "$TAR")/tokenizer.model" --prompt_data "$TASK" --input_key input \
    --label_key label --reward math --n_samples_per_prompt 8 --rollout_batch_size 64 \
    --train_batch_size 512 --micro_train_batch_size 16 --micro_rollout_batch_size 32 \
    --generate_max_len 512 --max_steps 2 --seed 1 --device cuda --save_path "$TMP/g1b" \
    ${GRPO1B_FLAGS:-}
  kill "$smi" 2> /dev/null
  sed 's/^{/{"run":"grpo1b",/' "$TMP/g1b/metrics.jsonl" >> "$OUT/metrics.jsonl" 2> /dev/null
  awk -F', ' '{gsub(/ MiB/, "", $2); if ($2 + 0 > m) m = $2 + 0}
    END {print "grpo1b peak GPU memory used:", m, "MiB"}' "$OUT/grpo1b_mem.csv" |
    tee -a "$OUT/grpo1b.log"
}

ncu_cmd() {  # Nsight Compute: per-kernel GPU time, one metric, no clock locking
  echo ncu --clock-control none --metrics gpu__time_duration.sum --print-summary per-kernel --csv
}

amx_setup() {  # sets AMX_CPU (the CPU build when packed beside the bundle) and AMX_PIN
  [ -z "${AMX_CPU:-}" ] || return 0  # done already (step_amx, then its parts)
  AMX_CPU=$RLHF
  local cpu_tar
  cpu_tar="$(dirname "$TAR")/rlhf-cpu.tar.xz"
  if [ -f "$cpu_tar" ]; then
    local root=/tmp/rlhf-cpu
    [ -x "$root/bin/rlhf" ] || tar -C /tmp -xJf "$cpu_tar" || { echo "cannot unpack $cpu_tar"; return 1; }
    wrap "$root" "" rlhf > /dev/null
    AMX_CPU=$root/wrap/rlhf
  else
    echo "gpu_check: no $cpu_tar: the GPU build measures the CPU (its own kernels x86-64-v3)" |
      tee -a "$OUT/amx.log"
  fi
  AMX_PIN=()
  command -v taskset > /dev/null && AMX_PIN=(taskset -c "0,1")
  {
    lscpu | grep -E "Model name|^CPU\(s\)|Thread\(s\) per core"
    lscpu -e=CPU,CORE,SOCKET,NODE 2> /dev/null | head -4  # are CPUs 0 and 1 one core's two threads?
    grep -o -w -E "amx_(tile|bf16|int8)|avx512_bf16|avx512_fp16" /proc/cpuinfo | sort -u | tr '\n' ' '
    echo
  } >> "$OUT/amx.log"
}

step_amx() {  # all of it: amxgemm, amxtrain, amxdecode, amxtorch, amxgen
  amx_setup || return 1
  step_amxgemm
  step_amxtrain
  step_amxdecode
  step_amxtorch
  step_amxgen
}

step_amxgemm() {
  amx_setup || return 1
  run amx 120 "${AMX_PIN[@]}" "$AMX_CPU" bench gemm --device cpu --threads 2 --output "$OUT/bench.jsonl"
}

step_amxtrain() {
  amx_setup || return 1
  run amx 300 "${AMX_PIN[@]}" "$AMX_CPU" bench train --device cpu --threads 2 \
    --model_config "$M135" --tokens_per_step 2048 --steps 2 \
    --param_dtype bf16 --output "$OUT/bench.jsonl"
}

step_amxdecode() {
  amx_setup || return 1
  run amx 240 "${AMX_PIN[@]}" "$AMX_CPU" bench generate --device cpu --threads 2 \
    --model_config "$M135" --param_dtype bf16 \
    --gen_batches "${AMX_DECODE_BATCHES:-1,16}" --gen_long_requests 0 --gen_long_fixed_batch 0 \
    --output "$OUT/bench.jsonl"
}

step_amxtorch() {
  amx_setup || return 1
  if python3 -c "import torch" 2> /dev/null; then
    run amx 400 "${AMX_PIN[@]}" python3 "$SRC/scripts/bench_torch_train.py" --rlhf "$AMX_CPU" \
      --threads 2 --rounds 2 --steps 2 --output "$OUT/bench.jsonl"
  else
    echo "gpu_check: no PyTorch here: training side by side with PyTorch skipped" | tee -a "$OUT/amx.log"
  fi
}

step_amxgen() {  # issue 24's decode target: rlhf bf16 against transformers bf16, batch 16 (2 threads)
  amx_setup || return 1
  if ! python3 -c "import torch, transformers" 2> /dev/null; then
    echo "gpu_check: no transformers here: decode side by side skipped" | tee -a "$OUT/amx.log"
    return 0
  fi
  run amx 300 "${AMX_PIN[@]}" python3 "$SRC/scripts/bench_transformers.py" --rlhf "$AMX_CPU" \
    --model_config "$M135" --param_dtype bf16 --batches 16 \
    --threads 2 --rounds 1 --hf_inner 1 --output "$OUT/bench.jsonl"
}

step_profile_train() {  # the kernels of one training step (PROFILE_TRAIN: 1b by default, or
  # 135m; PROFILE_ATTN: cudnn by default)
  write_m1b "$TMP/m1b.toml" 128256
  local cfg=$TMP/m1b.toml
  [ "${PROFILE_TRAIN:-1b}" = 135m ] && cfg=$M135
  run profile 120 $(ncu_cmd) --launch-count 3000 "$RLHF" bench train --device cuda \
    --model_config "$cfg" --tokens_per_step 16384 --seq_len 1024 --steps 1 --warmup 1 \
    --attn_implementation "${PROFILE_ATTN:-cudnn}"
}

step_profile_decode() {  # the kernels of the first decode steps at batch 1 (PROFILE_DECODE:
  # "135m 1b" by default): their sum against the benchmark's wall-clock step shows the gaps' share
  write_m1b "$TMP/m1b.toml" 128256
  local m cfg
  for m in ${PROFILE_DECODE:-135m 1b}; do
    cfg=$TMP/m1b.toml
    [ "$m" = 135m ] && cfg=$M135
    run profile 150 $(ncu_cmd) --launch-count 1500 "$RLHF" bench generate --device cuda \
      --model_config "$cfg" --gen_batches 1
  done
}

step_profile() {  # per-kernel GPU time of a 1B training step and of batch-1 decode steps
  step_profile_train
  step_profile_decode
}

BACKGROUND=()
for s in $STEPS; do
  case $s in
    *"&")
      "step_${s%&}" &
      BACKGROUND+=($!)
      # the steps that follow keep off the background step's CPUs (0 and 1)
      [ "$(nproc)" -gt 2 ] && taskset -cp "2-$(($(nproc) - 1))" $$ > /dev/null
      ;;
    *) "step_$s" ;;
  esac
done
[ ${#BACKGROUND[@]} -eq 0 ] || wait "${BACKGROUND[@]}"
exit 0
