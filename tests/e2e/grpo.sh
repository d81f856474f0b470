#!/usr/bin/env bash
# rlhf grpo end to end on the built-in 1-digit addition task (no download):
#  (a) after a short SFT warm start, a fixed-seed GRPO run on 2 ranks with the math reward raises
#      the mean reward of its last steps clearly above its first steps';
#  (b) k steps + checkpoint + --load_checkpoint k more steps == 2k steps straight: identical
#      per-step metrics and the same final weights fingerprint;
#  (c) a checkpoint written by 2 ranks resumes on 1 rank and continues;
#  (d) a truncated newest checkpoint is detected and the previous one is used;
#  (e) bad configurations on 2 ranks exit non-zero with a clear message, without hanging;
#  (f) rlhf ppo with a reward model (critic from it) resumes exactly too.
# Usage: grpo.sh <rlhf binary> <source dir>     (env MPIEXEC: mpiexec's path)
set -u
RLHF=$1
SRC=$2
# shellcheck source=lib/common.sh
. "$SRC/tests/e2e/lib/common.sh"
# shellcheck source=lib/resume.sh
. "$SRC/tests/e2e/lib/resume.sh"
TASK="builtin:addition?n=2000&digits=1&seed=1"

# Warm start: 150 SFT steps reach ~30% exact answers (enough for GRPO to have a signal).
warm_start_sft 150

GRPO=(grpo --pretrain "$W/sft/model.h5" --prompt_data "$TASK" --input_key input --label_key label
      --reward math --n_samples_per_prompt 8 --rollout_batch_size 8 --train_batch_size 32
      --micro_train_batch_size 8 --generate_max_len 8 --seed 1)
# Mean of a metric over metrics.jsonl records [lo, hi) (0-based).
mean_of() {
  python3 - "$1" "$2" "$3" "$4" <<'EOF'
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
v = [r[sys.argv[2]] for r in recs[int(sys.argv[3]):int(sys.argv[4])]]
print(f"{sum(v) / len(v):.4f}")
EOF
}

# (a) Learning: the reward rises.
timeout 300 "${MPI[@]}" -np 2 "$RLHF" "${GRPO[@]}" --rollout_batch_size 16 --actor_learning_rate 3e-4 \
  --max_steps 100 \
  --save_path "$W/learn" --ckpt_path "$W/learn/ckpt" > "$W/learn.log" 2>&1 \
  || { tail "$W/learn.log"; fail "grpo (learning run) exited"; }
grep -q "placement (2 ranks" "$W/learn.log" || fail "no placement recap at start"
[ "$(wc -l < "$W/learn/metrics.jsonl")" -eq 100 ] || fail "metrics.jsonl does not have 100 records"
# Seen: ~0.35 -> ~0.65. Without learning the two means differ by sampling noise (~0.03).
first=$(mean_of "$W/learn/metrics.jsonl" reward_mean 0 20)
last=$(mean_of "$W/learn/metrics.jsonl" reward_mean 80 100)
python3 -c "import sys; sys.exit(0 if $last > $first + 0.15 else 1)" \
  || fail "reward did not rise enough: first 20 steps $first, last 20 steps $last"
echo "ok: GRPO on 2 ranks raises the math reward: first 20 steps $first -> last 20 steps $last"
# Every record carries the docs/algorithms.md metrics and the phase timings with their communication.
python3 - "$W/learn/metrics.jsonl" <<'EOF' || fail "metrics.jsonl misses keys"
import json, sys
need = ["step", "reward_mean", "reward_std", "response_length_mean", "response_length_max",
        "kl_mean", "policy_loss", "value_loss", "clip_frac", "approx_kl", "entropy",
        "actor_grad_norm", "actor_lr", "gen_s", "gen_comm_s", "gen_comm_bytes", "reward_s",
        "reward_comm_s", "reward_comm_bytes", "logprob_s", "logprob_comm_s", "logprob_comm_bytes", "logprob_old_skipped",
        "train_s", "train_comm_s", "train_comm_bytes", "sync_s", "sync_comm_s", "sync_bytes",
        "gen_tokens_per_s", "train_tokens_per_s", "step_s",
        "gen_decode_s", "gen_decode_steps", "gen_decode_read_bytes", "gen_decode_read_GBps"]
for i, l in enumerate(open(sys.argv[1])):
    r = json.loads(l)
    miss = [k for k in need if k not in r]
    if miss:
        print(f"record {i + 1} misses {miss}")
        sys.exit(1)
    # The decode steps: the longest sample's (its first token comes from the prefill), and the
    # bytes they read at the rate the record gives.
    if r["gen_decode_steps"] < r["response_length_max"] - 1 or r["gen_decode_read_bytes"] <= 0:
        print(f"record {i + 1}: {r['gen_decode_steps']} decode steps, "
              f"{r['gen_decode_read_bytes']} bytes, longest response {r['response_length_max']}")
        sys.exit(1)
    rate = r["gen_decode_read_bytes"] / r["gen_decode_s"] / 1e9
    if abs(rate - r["gen_decode_read_GBps"]) > 1e-6 * rate:
        print(f"record {i + 1}: gen_decode_read_GBps {r['gen_decode_read_GBps']} != {rate}")
        sys.exit(1)
EOF
echo "ok: every metrics.jsonl record has the metrics, phase timings and communication"

# (b) Resume exactness (constant learning rate, so a 4-step run and an 8-step run share a schedule).
K=4
RES=("${GRPO[@]}" --actor_learning_rate 3e-4 --lr_scheduler constant)
"${MPI[@]}" -np 2 "$RLHF" "${RES[@]}" --max_steps $((2 * K)) --save_path "$W/straight" \
  --ckpt_path "$W/straight/ckpt" --save_steps $K > "$W/straight.log" 2>&1 \
  || { tail "$W/straight.log"; fail "straight run exited"; }
"${MPI[@]}" -np 2 "$RLHF" "${RES[@]}" --max_steps $K --save_path "$W/resumed" \
  --ckpt_path "$W/resumed/ckpt" --save_steps $K > "$W/first.log" 2>&1 \
  || { tail "$W/first.log"; fail "first half exited"; }
[ -f "$W/resumed/ckpt/step_$K.h5" ] || fail "no checkpoint step_$K.h5"
# As if the job had died after step K+1 (no checkpoint) in the middle of writing step K+2's record:
# the resumed run drops both and writes those steps again.
printf '{"step": %d, "reward_mean": 9}\n{"step": %d, "rew' $((K + 1)) $((K + 2)) >> "$W/resumed/metrics.jsonl"
"${MPI[@]}" -np 2 "$RLHF" "${RES[@]}" --max_steps $((2 * K)) --save_path "$W/resumed" \
  --ckpt_path "$W/resumed/ckpt" --save_steps $K --load_checkpoint > "$W/second.log" 2>&1 \
  || { tail "$W/second.log"; fail "resumed run exited"; }
grep -q "resumed from .*step_$K.h5 at step $K" "$W/second.log" || fail "the run did not resume"
# The step count changed (K -> 2K): the resume says so.
grep -q "settings that differ from the checkpoint's: total_steps $K -> $((2 * K))" "$W/second.log" \
  || fail "the changed step count was not reported"
same_metrics "$W/straight/metrics.jsonl" "$W/resumed/metrics.jsonl" \
  || fail "k + k steps after resume differ from 2k steps straight"
fa=$(fp "$W/straight.log")
fb=$(fp "$W/second.log")
[ -n "$fa" ] && [ "$fa" = "$fb" ] || fail "final weights differ: $fa (straight) vs $fb (resumed)"
echo "ok: $K steps + resume + $K steps == $((2 * K)) steps straight (metrics and weights $fa)"

# (c) N -> M: the 2-rank checkpoint resumes on 1 rank and continues to step 2k.
copy_ckpt "$W/resumed/ckpt" $K "$W/onerank/ckpt" || fail "copying step $K"
# --threads 1: one rank would take both cores, and OpenMP threads crawl on a busy machine.
"${MPI[@]}" -np 1 "$RLHF" "${RES[@]}" --threads 1 --max_steps $((2 * K)) --save_path "$W/onerank" \
  --ckpt_path "$W/onerank/ckpt" --load_checkpoint > "$W/onerank.log" 2>&1 \
  || { tail "$W/onerank.log"; fail "1-rank resume of a 2-rank checkpoint exited"; }
grep -q "resumed from .*step_$K.h5 at step $K" "$W/onerank.log" || fail "1 rank did not resume"
[ "$(wc -l < "$W/onerank/metrics.jsonl")" -eq "$K" ] || fail "1 rank did not run the last $K steps"
# Its first resumed step starts from the same weights and the same samples' prompts: the loss is
# the 2-rank one up to reduction order.
python3 - "$W/onerank/metrics.jsonl" "$W/straight/metrics.jsonl" $K <<'EOF' || fail "1-rank resume diverged"
import json, sys, math
a = json.loads(open(sys.argv[1]).readline())
b = [json.loads(l) for l in open(sys.argv[2])][int(sys.argv[3])]
assert a["step"] == b["step"], (a["step"], b["step"])
for k in ["policy_loss", "kl_mean", "entropy"]:
    if not math.isfinite(a[k]):
        sys.exit(f"{k} is not finite")
if abs(a["entropy"] - b["entropy"]) > 1e-3 * max(1.0, abs(b["entropy"])):
    sys.exit(f"entropy {a['entropy']} vs {b['entropy']}")
EOF
echo "ok: a 2-rank checkpoint resumes on 1 rank at step $K and continues"

# (d) A truncated newest checkpoint: detected, the previous one is used.
for k in $K $((2 * K)); do copy_ckpt "$W/straight/ckpt" $k "$W/trunc/ckpt" || fail "copying step $k"; done
f="$W/trunc/ckpt/step_$((2 * K)).h5"
truncate -s $(($(stat -c %s "$f") / 2)) "$f"
timeout 120 "${MPI[@]}" -np 2 "$RLHF" "${RES[@]}" --max_steps $((2 * K)) --save_path "$W/trunc" \
  --ckpt_path "$W/trunc/ckpt" --load_checkpoint > "$W/trunc.log" 2>&1 \
  || { tail "$W/trunc.log"; fail "resume next to a truncated checkpoint exited"; }
grep -q "step_$((2 * K)).h5 is unusable" "$W/trunc.log" || fail "truncated checkpoint not reported"
grep -q "resumed from .*step_$K.h5 at step $K" "$W/trunc.log" || fail "previous checkpoint not used"
echo "ok: a truncated newest checkpoint is reported and the previous one is used"

# (e) Bad configurations on 2 ranks: non-zero exit, a clear message, no hang.
bad() {  # bad <name> <expected message regex> <extra args...>
  local name=$1 want=$2
  shift 2
  timeout 60 "${MPI[@]}" -np 2 "$RLHF" "${GRPO[@]}" --max_steps 2 --save_path "$W/bad_$name" \
    --ckpt_path "$W/bad_$name/ckpt" "$@" > "$W/bad_$name.log" 2>&1
  local code=$?
  [ $code -ne 0 ] || fail "$name: exit 0"
  [ $code -ne 124 ] || fail "$name: the job hung (killed by timeout)"
  grep -qE -- "$want" "$W/bad_$name.log" || { tail -5 "$W/bad_$name.log"; fail "$name: no message /$want/"; }
  echo "ok: $name -> exit $code: $(grep -m1 -E -- "$want" "$W/bad_$name.log" | cut -c1-150)"
}
bad batch_not_multiple "not a multiple of --train_batch_size 24" --train_batch_size 24
bad micro_not_dividing "not a multiple of --micro_train_batch_size 5" --micro_train_batch_size 5
bad micro_over_ranks "micro_train_batch_size 32 x 2 training ranks" --micro_train_batch_size 32
bad rollout_over_prompts "rollout_batch_size 16 is larger than the 10 usable prompts" \
  --max_samples 10 --rollout_batch_size 16 --train_batch_size 16
bad one_sample_group "needs --n_samples_per_prompt > 1" --n_samples_per_prompt 1 \
  --train_batch_size 8
bad critic_flag "critic_learning_rate is a critic option" --critic_learning_rate 1e-5
bad critic_pretrain "critic_pretrain is a critic option" --critic_pretrain "$W/sft/model.h5"
bad missing_label "no label key 'answer'" --label_key answer
bad no_label_key "--reward math needs --label_key" --label_key ""
# (f) rlhf ppo with a reward model from rlhf rm (the critic starts from it): 2 + 2 steps after a
# resume == 4 steps straight, critic and its moments included.
printf '{"prompt": "1+1=", "chosen": "2", "rejected": "7"}\n%.0s' $(seq 16) > "$W/pairs.jsonl"
"$RLHF" rm --model_config "$SRC/examples/models/tiny.toml" --dataset "$W/pairs.jsonl" \
  --prompt_key prompt --max_len 16 --train_batch_size 8 --micro_train_batch_size 8 --max_steps 2 \
  --learning_rate 1e-3 --threads 1 --save_path "$W/rm" --log_level warn || fail "rm exited $?"
PPO=(ppo --pretrain "$W/sft/model.h5" --reward_pretrain "$W/rm/model.h5" --prompt_data "$TASK"
     --input_key input --rollout_batch_size 8 --n_samples_per_prompt 2 --train_batch_size 16
     --micro_train_batch_size 4 --generate_max_len 8 --lr_scheduler constant
     --actor_learning_rate 1e-4 --critic_learning_rate 1e-4 --seed 3)
"${MPI[@]}" -np 2 "$RLHF" "${PPO[@]}" --max_steps 4 --save_path "$W/ppo_a" --ckpt_path "$W/ppo_a/ckpt" \
  > "$W/ppo_a.log" 2>&1 || { tail "$W/ppo_a.log"; fail "ppo exited"; }
grep -q "critic yes" "$W/ppo_a.log" || fail "ppo without a critic"
"${MPI[@]}" -np 2 "$RLHF" "${PPO[@]}" --max_steps 2 --save_path "$W/ppo_b" --ckpt_path "$W/ppo_b/ckpt" \
  --save_steps 2 > "$W/ppo_b1.log" 2>&1 || { tail "$W/ppo_b1.log"; fail "ppo first half exited"; }
"${MPI[@]}" -np 2 "$RLHF" "${PPO[@]}" --max_steps 4 --save_path "$W/ppo_b" --ckpt_path "$W/ppo_b/ckpt" \
  --load_checkpoint > "$W/ppo_b2.log" 2>&1 || { tail "$W/ppo_b2.log"; fail "ppo resume exited"; }
same_metrics "$W/ppo_a/metrics.jsonl" "$W/ppo_b/metrics.jsonl" || fail "ppo resume differs"
[ "$(fp "$W/ppo_a.log")" = "$(fp "$W/ppo_b2.log")" ] || fail "ppo resume: final weights differ"
echo "ok: ppo (critic from the reward model): 2 steps + resume + 2 steps == 4 steps straight"
echo PASS
