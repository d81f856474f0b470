#!/usr/bin/env bash
# rlhf grpo --vllm_enable_sleep end to end (built-in 1-digit addition, 2 colocated ranks):
#  (a) the same metrics record by record and the same final weights as without sleep (a woken
#      engine generates what a never-slept one does), every step records sleep_freed_bytes (the
#      memory plan's "freed" figure) and sleep_s;
#  (b) the start-up log prints each engine rank's memory plan, with what sleep frees;
#  (c) the training phase's peak RSS (train_peak_rss_bytes) is lower with sleep (prints both);
#  (d) with generation ranks of their own (--gen_ranks_per_node 1) the flag has no effect, and
#      the log says so;
#  (e) where rlhf_emu is built: the same on emulated GPUs (device KV cache and weights freed,
#      graphs re-captured, the device-to-device weight sync into the woken engine): the same
#      weights fingerprint, and the plan in device bytes.
# Usage: sleep.sh <rlhf binary> <source dir>     (env MPIEXEC: mpiexec's path)
set -u
RLHF=$1
SRC=$2
# shellcheck source=lib/common.sh
. "$SRC/tests/e2e/lib/common.sh"
# shellcheck source=lib/resume.sh
. "$SRC/tests/e2e/lib/resume.sh"
TASK="builtin:addition?n=2000&digits=1&seed=1"

warm_start_sft 40

# A KV cache of 64 MiB per engine, touched by the rollout (64 samples of up to 264 positions
# use ~128 blocks of 256 positions).
GRPO=(grpo --pretrain "$W/sft/model.h5" --prompt_data "$TASK" --input_key input --label_key label
      --reward math --n_samples_per_prompt 8 --rollout_batch_size 8 --train_batch_size 64
      --micro_train_batch_size 16 --generate_max_len 8 --seed 1 --gen_kv_cache_mb 64
      --actor_learning_rate 3e-4 --lr_scheduler constant --threads 1 --max_steps 4)
run() {  # run <name> <args...>
  local name=$1
  shift
  timeout 300 "${MPI[@]}" -np 2 "$RLHF" "${GRPO[@]}" --save_path "$W/$name" "$@" \
    > "$W/$name.log" 2>&1 || { tail "$W/$name.log"; fail "$name exited"; }
}

run awake
run asleep --vllm_enable_sleep
python3 - "$W/awake/metrics.jsonl" "$W/asleep/metrics.jsonl" <<'PYEOF' || fail "sleep changed the metrics"
import json, sys
load = lambda p: [json.loads(l) for l in open(p)]
a, b = load(sys.argv[1]), load(sys.argv[2])
assert len(a) == len(b) == 4, (len(a), len(b))
for x, y in zip(a, b):
    assert "sleep_freed_bytes" not in x and "sleep_s" not in x, x
    assert y["sleep_freed_bytes"] > 64 << 20, y["sleep_freed_bytes"]  # the KV cache and more
    assert y["sleep_s"] >= 0, y
    keep = lambda r: {k: v for k, v in r.items()
                      if not (k.endswith("_s") or "per_s" in k or "GBps" in k or k == "mfu"
                              or k.endswith("peak_rss_bytes") or k.startswith("sleep_"))}
    assert keep(x) == keep(y), {k: (keep(x).get(k), keep(y).get(k))
                                for k in set(keep(x)) | set(keep(y)) if keep(x).get(k) != keep(y).get(k)}
print("metrics equal")
PYEOF
fa=$(fp "$W/awake.log")
fb=$(fp "$W/asleep.log")
[ -n "$fa" ] && [ "$fa" = "$fb" ] || fail "final weights differ with sleep: $fa vs $fb"
echo "ok: --vllm_enable_sleep gives the same metrics and weights ($fa)"

# (b) The memory plan: each engine rank (here both alike), with what sleep frees.
grep -q "engine memory plan, ranks 0-1: host: fp32 weights .* | KV cache 64.0 MiB | asleep while training: .* host freed" \
  "$W/asleep.log" || { grep "memory plan" "$W/asleep.log"; fail "no memory plan with sleep in the log"; }
grep -q "engine memory plan, ranks 0-1: .* KV cache 64.0 MiB$" "$W/awake.log" \
  || { grep "memory plan" "$W/awake.log"; fail "no memory plan in the log"; }
echo "ok: the start-up log prints the engines' memory plan"

# (c) The training phase's peak resident memory, the largest step of each run.
python3 - "$W/awake/metrics.jsonl" "$W/asleep/metrics.jsonl" <<'PYEOF' || fail "sleep did not lower the training peak RSS"
import json, sys
peak = lambda p: max(json.loads(l)["train_peak_rss_bytes"] for l in open(p))
a, b = peak(sys.argv[1]), peak(sys.argv[2])
freed = max(json.loads(l)["sleep_freed_bytes"] for l in open(sys.argv[2]))
print(f"train_peak_rss_bytes: awake {a / 2**20:.1f} MiB, asleep {b / 2**20:.1f} MiB, "
      f"lower by {(a - b) / 2**20:.1f} MiB (sleep frees {freed / 2**20:.1f} MiB of address space)")
assert b < a, (a, b)
PYEOF
echo "ok: the training phase's peak RSS is lower with sleep"

# (d) Disaggregated: no effect, said once.
run apart --vllm_enable_sleep --gen_ranks_per_node 1 --max_steps 1
grep -q "vllm_enable_sleep has no effect" "$W/apart.log" || fail "no 'no effect' warning"
! grep -q "sleep_freed_bytes" "$W/apart/metrics.jsonl" || fail "a disaggregated engine slept"
echo "ok: with generation ranks apart, --vllm_enable_sleep has no effect and says so"

# (e) Emulated GPUs: colocated engines with device-to-device sync.
EMU=$(dirname "$RLHF")/rlhf_emu
if [ ! -x "$EMU" ]; then
  echo "skipped (e): $EMU not built"
  exit 0
fi
export RLHF_CUDA_EMU_DEVICES=2
GPU=(grpo --model_config "$SRC/examples/models/tiny.toml" --prompt_data "$TASK" --input_key input
     --label_key label --reward math --n_samples_per_prompt 4 --rollout_batch_size 8
     --train_batch_size 16 --micro_train_batch_size 4 --generate_max_len 6 --seed 1 --threads 1
     --actor_learning_rate 3e-4 --device cuda --max_steps 2)
for name in gpu_awake gpu_asleep; do
  extra=()
  [ $name = gpu_asleep ] && extra=(--vllm_enable_sleep)
  timeout 300 "${MPI[@]}" -np 2 "$EMU" "${GPU[@]}" --save_path "$W/$name" "${extra[@]}" \
    > "$W/$name.log" 2>&1 || { tail "$W/$name.log"; fail "$name exited"; }
done
fa=$(fp "$W/gpu_awake.log")
fb=$(fp "$W/gpu_asleep.log")
[ -n "$fa" ] && [ "$fa" = "$fb" ] || fail "emulated GPUs: final weights differ with sleep: $fa vs $fb"
grep -q "engine memory plan, ranks 0-1: .*device: bf16 weights .* | asleep while training: .* device freed" \
  "$W/gpu_asleep.log" || { grep "memory plan" "$W/gpu_asleep.log"; fail "no device memory plan"; }
grep -q '"sleep_freed_bytes"' "$W/gpu_asleep/metrics.jsonl" || fail "no sleep_freed_bytes on GPUs"
echo "ok: emulated GPU engines sleep and wake with the same weights ($fa)"
