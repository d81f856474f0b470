#!/usr/bin/env bash
# rlhf generate end to end: sft a tiny model a few steps, then sample from its checkpoint. The JSONL
# out has one valid object per sample with the requested count, sample indices, finish reasons
# and per-token log-probs; the same seed gives the same file whatever the KV budget and batch
# limit (continuous batching) and whatever the number of ranks and engines (4 ranks with 2
# disaggregated engines, 3 colocated engines); another seed changes it; greedy samples agree, and
# 1 rank's greedy file equals 2 engines'; bad inputs are one-line errors with a non-zero exit, on
# every rank of a multi-rank run, without hanging.
# Usage: generate.sh <rlhf binary> <source dir>     (env MPIEXEC: mpiexec's path)
set -u
RLHF=$1
SRC=$2
# shellcheck source=lib/common.sh
. "$SRC/tests/e2e/lib/common.sh"
export OMP_NUM_THREADS=2

# --- a tiny policy: 30 sft steps on a 16-word text
awk 'BEGIN { srand(7); split("the cat dog sat on a mat and ran to big small red blue house tree", w, " ");
  for (i = 0; i < 300; i++) { s = ""; for (j = 0; j < 10; j++) s = s w[int(rand() * 16) + 1] " "; print s "."; print "" } }' > "$W/text.txt"
"$RLHF" sft --model_config "$SRC/examples/models/tiny.toml" --dataset "$W/text.txt" --max_len 64 \
  --train_batch_size 16 --micro_train_batch_size 8 --learning_rate 3e-3 --max_steps 30 \
  --seed 3 --log_level warn --save_path "$W/ck" || fail "sft exited $?"
[ -f "$W/ck/model.h5" ] || fail "sft wrote no model.h5"

cat > "$W/prompts.jsonl" <<'EOF'
{"input": "the cat", "id": 1}
{"input": "a dog sat on"}

{"input": "big red house", "other": [1, 2]}
{"input": "blue"}
{"input": "ünïcödé ✓ the"}
EOF

GEN=(generate --pretrain "$W/ck" --dataset "$W/prompts.jsonl" --generate_max_len 40
     --n_samples_per_prompt 3 --temperature 0.8 --top_p 0.95 --log_level warn)
"$RLHF" "${GEN[@]}" --output_path "$W/out/a.jsonl" || fail "generate a exited $?"
[ -f "$W/out/a.jsonl" ] || fail "no output file"
ls "$W/out" | grep -q '\.tmp' && fail "a .tmp file was left behind"
[ "$(wc -l < "$W/out/a.jsonl")" -eq 15 ] || fail "expected 15 lines (5 prompts x 3 samples)"

# Every line: a JSON object with the documented fields, consistent with each other.
check_jsonl() {  # check_jsonl <file> <n prompts> <n samples> <max len> (prompts from prompts.jsonl)
  if command -v python3 >/dev/null; then
    python3 - "$@" "$W/prompts.jsonl" <<'EOF' || fail "JSONL check of $1"
import json, sys
path, n_prompts, n_samples, max_len = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
prompts = [json.loads(l)["input"] for l in open(sys.argv[5], encoding="utf-8") if l.strip()]
rows = [json.loads(l) for l in open(path, encoding="utf-8")]
assert len(rows) == n_prompts * n_samples, len(rows)
for k, r in enumerate(rows):
    assert r["prompt_index"] == k // n_samples and r["sample_index"] == k % n_samples, r
    ids, lps = r["completion_token_ids"], r["logprobs"]
    assert r["prompt"] == prompts[r["prompt_index"]], r["prompt"]
    assert isinstance(r["completion"], str)
    assert len(ids) == len(lps) == r["completion_tokens"] >= 1, r
    assert all(isinstance(t, int) and 0 <= t < 259 for t in ids), ids
    assert all(isinstance(x, float) and x <= 1e-6 for x in lps), lps
    assert r["prompt_tokens"] == len(r["prompt"].encode()) + 1  # bytes + BOS
    if r["finish_reason"] == "stop":
        assert ids[-1] == 257 and 257 not in ids[:-1], ids
    else:
        assert r["finish_reason"] == "length" and len(ids) == max_len and 257 not in ids, r
print("ok:", path, len(rows), "rows,", sum(r["finish_reason"] == "stop" for r in rows), "stop")
EOF
  elif command -v jq >/dev/null; then
    jq -e 'select(.finish_reason != "stop" and .finish_reason != "length") | halt_error' "$1" >/dev/null \
      || fail "JSONL check of $1 (jq)"
  else
    echo "note: neither python3 nor jq: JSONL checked by line count only"
  fi
}
check_jsonl "$W/out/a.jsonl" 5 3 40

# Same seed, a 1 MiB KV cache and at most 2 sequences at a time: requests wait, and every sample
# is still its own (decode is batch-invariant, the random stream is per request and step).
"$RLHF" "${GEN[@]}" --output_path "$W/out/b.jsonl" --gen_kv_cache_mb 1 --gen_max_num_seqs 2 \
  || fail "generate b exited $?"
cmp -s "$W/out/a.jsonl" "$W/out/b.jsonl" || fail "same seed, other KV budget / batch: different output"
echo "ok: same seed with --gen_kv_cache_mb 1 --gen_max_num_seqs 2 gives the same file"
# The checkpoint file instead of its directory: the same.
"$RLHF" "${GEN[@]}" --pretrain "$W/ck/model.h5" --output_path "$W/out/f.jsonl" || fail "generate f exited $?"
cmp -s "$W/out/a.jsonl" "$W/out/f.jsonl" || fail "--pretrain dir vs file: different output"
"$RLHF" "${GEN[@]}" --output_path "$W/out/c.jsonl" --seed 7 || fail "generate c exited $?"
cmp -s "$W/out/a.jsonl" "$W/out/c.jsonl" && fail "another seed gave the same output"
echo "ok: another seed changes the output"

# Greedy: the samples of a prompt agree; --max_samples limits the prompts.
"$RLHF" generate --pretrain "$W/ck" --dataset "$W/prompts.jsonl" --generate_max_len 30 --greedy \
  --n_samples_per_prompt 2 --max_samples 3 --log_level warn --output_path "$W/out/g.jsonl" \
  || fail "greedy exited $?"
[ "$(wc -l < "$W/out/g.jsonl")" -eq 6 ] || fail "greedy: expected 6 lines (3 prompts x 2)"
check_jsonl "$W/out/g.jsonl" 3 2 30
ids() { grep -o '"completion_token_ids":\[[0-9,]*\]' "$1" | sed -n "$2p"; }
for k in 1 3 5; do
  [ "$(ids "$W/out/g.jsonl" $k)" = "$(ids "$W/out/g.jsonl" $((k + 1)))" ] || fail "greedy samples differ (line $k)"
done
echo "ok: greedy samples of one prompt agree"

# The progress/summary line reports tokens per second.
"$RLHF" "${GEN[@]}" --log_level info --output_path "$W/out/d.jsonl" 2>&1 | grep -q "tok/s" \
  || fail "no tok/s in the log"
echo "ok: tok/s reported"

# --- bad inputs: exit code and message
expect_error() {  # expect_error <what> <message fragment> <args...>
  local what=$1 msg=$2
  shift 2
  out=$("$RLHF" generate "$@" 2>&1)
  code=$?
  [ $code -ne 0 ] || fail "$what: exit 0"
  echo "$out" | grep -qF -- "$msg" || { echo "$out" | tail -3; fail "$what: message lacks '$msg'"; }
  echo "ok: $what -> exit $code"
}
printf '{"input": "a"}\n{"prompt": "b"}\n' > "$W/nokey.jsonl"
BASE=(--pretrain "$W/ck" --dataset "$W/prompts.jsonl" --output_path "$W/out/bad.jsonl" --log_level warn)
expect_error "missing checkpoint" "--pretrain $W/none.h5: no such file" "${BASE[@]}" --pretrain "$W/none.h5"
expect_error "missing prompt key" "nokey.jsonl:2: no key \"input\"" "${BASE[@]}" --dataset "$W/nokey.jsonl"
expect_error "missing prompt key hint" "--input_key" "${BASE[@]}" --dataset "$W/nokey.jsonl"
expect_error "bad --top_p" "--top_p" "${BASE[@]}" --top_p 1.5
expect_error "zero --top_p" "--top_p" "${BASE[@]}" --top_p 0
expect_error "bad --top_k" "--top_k" "${BASE[@]}" --top_k -3
expect_error "negative --temperature" "--temperature" "${BASE[@]}" --temperature -1
expect_error "missing dataset" "no-such.jsonl: no such file" "${BASE[@]}" --dataset "$W/no-such.jsonl"
expect_error "no output path" "--output_path is required" --pretrain "$W/ck" --dataset "$W/prompts.jsonl"
[ -f "$W/out/bad.jsonl" ] && fail "a failed run left an output file"

# --- several ranks: engines on the ranks the topology gives, prompts split across them, the file
# written by rank 0 in prompt order — the same file as one rank (per-sample random streams are keyed
# by the prompt index, not the rank).
MPI=(timeout 300 "$MPIEXEC" --oversubscribe --allow-run-as-root --bind-to none)
# 4 ranks, 2 simulated nodes of 2, 1 generation rank per node: 2 engines (ranks 1 and 3).
"${MPI[@]}" -np 4 "$RLHF" "${GEN[@]}" --threads 1 --gen_ranks_per_node 1 --ranks_per_node 2 \
  --log_level info --output_path "$W/out/m4.jsonl" > "$W/m4.log" 2>&1 \
  || { tail -5 "$W/m4.log"; fail "4 ranks, 2 engines: exit $?"; }
grep -q "on 2 engines" "$W/m4.log" || { tail -5 "$W/m4.log"; fail "4 ranks: not 2 engines"; }
grep -q "tok/s" "$W/m4.log" || fail "4 ranks: no tok/s in the log"
cmp -s "$W/out/a.jsonl" "$W/out/m4.jsonl" || fail "4 ranks (2 engines): not the 1-rank file"
ls "$W/out" | grep -q '\.tmp' && fail "4 ranks: a .tmp file was left behind"
echo "ok: 4 ranks, 2 disaggregated engines: the same sampled file as 1 rank"
# 3 ranks colocated (3 engines, 5 prompts: blocks of 1, 2, 2).
"${MPI[@]}" -np 3 "$RLHF" "${GEN[@]}" --threads 1 --output_path "$W/out/m3.jsonl" \
  || fail "3 ranks colocated: exit $?"
cmp -s "$W/out/a.jsonl" "$W/out/m3.jsonl" || fail "3 colocated engines: not the 1-rank file"
echo "ok: 3 ranks, 3 colocated engines: the same sampled file as 1 rank"
# Greedy: 1 rank == 2 engines (2 ranks colocated), also with more engines than prompts.
ids_all() { grep -o '"completion_token_ids":\[[0-9,]*\]' "$1"; }  # the tokens of every line
GREEDY=(generate --pretrain "$W/ck" --dataset "$W/prompts.jsonl" --generate_max_len 30 --greedy
        --n_samples_per_prompt 2 --log_level warn --threads 1)
"$RLHF" "${GREEDY[@]}" --output_path "$W/out/g1.jsonl" || fail "greedy 1 rank exited $?"
"${MPI[@]}" -np 2 "$RLHF" "${GREEDY[@]}" --output_path "$W/out/g2.jsonl" \
  || fail "greedy 2 engines exited $?"
cmp -s "$W/out/g1.jsonl" "$W/out/g2.jsonl" || fail "greedy: 1 rank and 2 engines differ"
"${MPI[@]}" -np 4 "$RLHF" "${GREEDY[@]}" --max_samples 3 --output_path "$W/out/g4.jsonl" \
  || fail "greedy 4 engines, 3 prompts exited $?"
head -6 "$W/out/g1.jsonl" | cmp -s - "$W/out/g4.jsonl" || fail "greedy: 4 engines for 3 prompts differ"
echo "ok: greedy: 1 rank == 2 engines; 4 engines for 3 prompts (one idle) == 1 rank"
# Tensor parallel: one engine of 2 ranks (heads and MLP columns split); 4 ranks as 2 engines of 2.
"${MPI[@]}" -np 2 "$RLHF" "${GREEDY[@]}" --vllm_tensor_parallel_size 2 --output_path "$W/out/t2.jsonl" \
  || fail "greedy TP 2 exited $?"
cmp -s <(ids_all "$W/out/g1.jsonl") <(ids_all "$W/out/t2.jsonl") || fail "greedy: TP 2 tokens differ from 1 rank"
"${MPI[@]}" -np 4 "$RLHF" "${GREEDY[@]}" --vllm_tensor_parallel_size 2 --output_path "$W/out/t4.jsonl" \
  || fail "greedy 2 engines of TP 2 exited $?"
cmp -s <(ids_all "$W/out/g1.jsonl") <(ids_all "$W/out/t4.jsonl") || fail "greedy: 2 engines of TP 2 differ from 1 rank"
echo "ok: greedy: TP 2 (1 engine of 2 ranks, and 2 engines of 2) gives 1 rank's tokens"

# An empty prompt generates from BOS alone (llama2.c's default): the prompt is 1 token (BOS) and
# the completion is ordinary tokens with log-probs.
printf '{"input": ""}\n' > "$W/empty.jsonl"
"$RLHF" generate --pretrain "$W/ck" --dataset "$W/empty.jsonl" --generate_max_len 12 --greedy \
  --log_level warn --output_path "$W/out/empty.jsonl" || fail "generate from an empty prompt exited $?"
python3 - "$W/out/empty.jsonl" <<'EOF' || fail "generation from BOS is wrong"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert len(rows) == 1, rows
r = rows[0]
assert r["prompt"] == "" and r["prompt_tokens"] == 1, r
ids, lps = r["completion_token_ids"], r["logprobs"]
assert len(ids) == len(lps) == r["completion_tokens"] >= 1, r
assert all(0 <= t < 259 for t in ids) and all(x <= 1e-6 for x in lps), r
EOF
echo "ok: an empty prompt generates from BOS ($(python3 -c "import json,sys; print(json.loads(open(sys.argv[1]).readline())['completion_tokens'])" "$W/out/empty.jsonl") tokens)"
# With --apply_chat_template an empty message is still refused, with its clear error.
out=$("$RLHF" generate --pretrain "$W/ck" --dataset "$W/empty.jsonl" --apply_chat_template \
  --output_path "$W/out/empty_chat.jsonl" 2>&1)
[ $? -ne 0 ] || fail "an empty chat message was accepted"
echo "$out" | grep -qF "must be a non-empty string (or chat messages)" || { echo "$out" | tail -3; fail "empty chat message: unclear error"; }
echo "ok: an empty chat message is still refused"

# Errors on several ranks: non-zero exit on every rank, no hang (timeout 300 → 124 fails).
expect_mpi_error() {  # expect_mpi_error <what> <message fragment> <np> <args...>
  local what=$1 msg=$2 np=$3
  shift 3
  out=$("${MPI[@]}" -np "$np" "$RLHF" generate "$@" 2>&1)
  code=$?
  [ $code -ne 0 ] && [ $code -ne 124 ] || fail "$what: exit $code"
  echo "$out" | grep -qF -- "$msg" || { echo "$out" | tail -3; fail "$what: message lacks '$msg'"; }
  echo "ok: $what -> exit $code"
}
expect_mpi_error "4 ranks, missing dataset" "no-such.jsonl: no such file" 4 "${BASE[@]}" \
  --gen_ranks_per_node 1 --ranks_per_node 2 --dataset "$W/no-such.jsonl"
expect_mpi_error "4 ranks, missing checkpoint" "--pretrain $W/none.h5: no such file" 4 "${BASE[@]}" \
  --gen_ranks_per_node 1 --ranks_per_node 2 --pretrain "$W/none.h5"
expect_mpi_error "2 ranks, no training rank" "--gen_ranks_per_node" 2 "${BASE[@]}" \
  --gen_ranks_per_node 2 --ranks_per_node 2
expect_mpi_error "3 ranks, tensor parallel 3 (4 heads)" "tensor parallel size 3 must divide" 3 \
  "${BASE[@]}" --vllm_tensor_parallel_size 3
expect_mpi_error "2 ranks, bad --top_p" "--top_p" 2 "${BASE[@]}" --top_p 1.5
[ -f "$W/out/bad.jsonl" ] && fail "a failed multi-rank run left an output file"
echo PASS
