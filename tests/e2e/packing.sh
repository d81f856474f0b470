#!/usr/bin/env bash
# --packing_samples end to end (tiny model, no download): each micro-batch's samples packed into
# one row without padding train like the padded micro-batches — the same loss curve up to fp32
# summation order — in rlhf sft, rm and grpo (2 ranks, with and without --use_dynamic_batch,
# whose packed budget counts real tokens: never more micro-batches than the padded budget).
# Usage: packing.sh <rlhf binary> <source dir>     (env MPIEXEC: mpiexec's path)
set -u
RLHF=$1
SRC=$2
# shellcheck source=lib/common.sh
. "$SRC/tests/e2e/lib/common.sh"
field() { grep -o "\"$2\":[-0-9.e+]*" "$1/metrics.jsonl" | cut -d: -f2; }
same() {  # <what> <run a> <run b> <key> <relative tolerance>: every step's value agrees
  paste <(field "$2" "$4") <(field "$3" "$4") | awk -v t="$5" -v k="$4" '{ d = $1 - $2;
    if (d < 0) d = -d; s = ($1 < 0 ? -$1 : $1); if (s < 1) s = 1;
    if (d > t * s) { print "step " NR " " k ": " $1 " vs " $2; bad = 1 } n++ }
    END { exit bad || n == 0 }' || fail "$1: packed and padded $4 differ"
}

# sft: ragged sentences (3..30 words) so that the padded micro-batches carry real padding.
awk 'BEGIN { srand(5); split("the cat dog sat on a mat and ran to big small red blue house tree", w, " ");
  for (i = 0; i < 200; i++) { s = ""; n = 3 + int(rand() * 28); for (j = 0; j < n; j++) s = s w[int(rand() * 16) + 1] " ";
    print s "."; print "" } }' > "$W/text.txt"
SFT=(sft --model_config "$SRC/examples/models/tiny.toml" --dataset "$W/text.txt" --max_len 64
     --train_batch_size 16 --micro_train_batch_size 8 --learning_rate 3e-3 --max_steps 20
     --seed 3 --log_level warn)
timeout 300 "$RLHF" "${SFT[@]}" --save_path "$W/sft_pad" || fail "sft padded exited $?"
timeout 300 "$RLHF" "${SFT[@]}" --save_path "$W/sft_pack" --packing_samples \
  || fail "sft packed exited $?"
same sft "$W/sft_pad" "$W/sft_pack" loss 1e-4
first=$(field "$W/sft_pack" loss | head -1)
last=$(field "$W/sft_pack" loss | tail -1)
awk -v f="$first" -v l="$last" 'BEGIN { exit !(l < 0.8 * f) }' || fail "packed sft did not learn"
echo "ok: sft packed = padded over 20 steps (1e-4), loss $first -> $last"

# rm: preference pairs of different lengths.
awk 'BEGIN { srand(3); split("kind nice helpful good", g, " "); split("rude mean bad awful", b, " ");
  for (i = 0; i < 64; i++) { c = ""; r = ""; nc = 1 + int(rand() * 8); nr = 1 + int(rand() * 8);
    for (j = 0; j < nc; j++) c = c " " g[int(rand() * 4) + 1];
    for (j = 0; j < nr; j++) r = r " " b[int(rand() * 4) + 1];
    printf "{\"prompt\": \"Q: say something. A:\", \"chosen\": \"%s\", \"rejected\": \"%s\"}\n", c, r } }' \
  > "$W/pairs.jsonl"
RM=(rm --model_config "$SRC/examples/models/tiny.toml" --dataset "$W/pairs.jsonl" --prompt_key prompt
    --max_len 64 --train_batch_size 16 --micro_train_batch_size 4 --learning_rate 1e-3
    --max_steps 6 --seed 1 --log_level warn)
timeout 300 "$RLHF" "${RM[@]}" --save_path "$W/rm_pad" || fail "rm padded exited $?"
timeout 300 "$RLHF" "${RM[@]}" --save_path "$W/rm_pack" --packing_samples || fail "rm packed exited $?"
same rm "$W/rm_pad" "$W/rm_pack" loss 1e-4
echo "ok: rm packed = padded over 6 steps (1e-4)"

# grpo on 2 ranks: padded, packed, packed with a 40-token budget (1-digit prompts and 8 new tokens
# are ~10-16 tokens: two or three samples a micro-batch).
TASK="builtin:addition?n=200&digits=1&seed=1"
GRPO=(grpo --model_config "$SRC/examples/models/tiny.toml" --prompt_data "$TASK" --input_key input
      --label_key label --reward math --n_samples_per_prompt 4 --rollout_batch_size 4
      --train_batch_size 8 --micro_train_batch_size 2 --max_epochs 2 --generate_max_len 8
      --seed 1 --actor_learning_rate 1e-3 --max_steps 2 --kv_cache_dtype fp32 --log_level warn)
grpo() {  # <name> <args...>
  local name=$1
  shift
  timeout 300 "${MPI[@]}" -np 2 "$RLHF" "${GRPO[@]}" --save_path "$W/$name" \
    --ckpt_path "$W/$name/ckpt" "$@" > "$W/$name.log" 2>&1 \
    || { tail "$W/$name.log"; fail "grpo $name exited"; }
}
grpo g_pad
grpo g_pack --packing_samples
grpo g_budget --packing_samples --use_dynamic_batch --train_max_tokens_per_gpu 40 \
  --rollout_max_tokens_per_gpu 40
grpo g_padbudget --use_dynamic_batch --train_max_tokens_per_gpu 40 --rollout_max_tokens_per_gpu 40
# Step 1 (the same rollout: the engine does not see the trainer's layout) agrees; later steps
# sample from weights that differ by rounding, so only step 1 is compared.
for run in g_pack g_budget; do
  for k in policy_loss actor_grad_norm reward_mean kl_mean; do
    a=$(field "$W/g_pad" "$k" | head -1)
    b=$(field "$W/$run" "$k" | head -1)
    awk -v a="$a" -v b="$b" 'BEGIN { d = a - b; if (d < 0) d = -d; s = (a < 0 ? -a : a); if (s < 1) s = 1;
      exit !(d <= 1e-4 * s) }' || fail "$run step 1 $k: $b vs padded $a"
  done
done
# The packed budget counts real tokens, the padded one (samples) x (longest): never more passes.
mb() { field "$W/$1" train_micro_batches | head -1; }
[ "$(mb g_budget)" -le "$(mb g_padbudget)" ] \
  || fail "a packed budget of 40 tokens needs more micro-batches: $(mb g_budget) vs $(mb g_padbudget)"
echo "ok: grpo on 2 ranks, packed (and with a 40-token budget: $(mb g_budget) micro-batches vs" \
  "$(mb g_padbudget) padded) = padded at step 1 (1e-4)"
echo PASS
