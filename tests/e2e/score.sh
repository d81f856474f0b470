#!/usr/bin/env bash
# `rlhf score` against transformers (tests/fixtures/score/expected.json, written by
# scripts/make_score_fixtures.py with TinyStories-656K in float64):
# - every record's response log-probs within 2e-4 nats of transformers' and the same token counts
#   (prompt with BOS, response without special tokens, chat messages joined by newlines);
# - a plain text's strided perplexity (--max_len 64 --stride 32) within 1e-4 nats per token;
# - 2 ranks write the same records as 1 rank; bad input is one clear error.
# Usage: score.sh <rlhf binary> <source dir>   (env RLHF_SHARED_DATA overrides ../shared/data)
set -u
RLHF=$1
SRC=$2
DATA=${RLHF_SHARED_DATA:-$SRC/../shared/data}
TS=$DATA/tinystories-656k/bf16_upstream
if [ ! -d "$TS" ]; then
  echo "skipped: $TS not found (set RLHF_SHARED_DATA)"
  exit 77
fi
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
export OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
FX=$SRC/tests/fixtures/score
Q=(--log_level warn --threads 1)  # the same summation order on 1 and 2 ranks

"$RLHF" score "${Q[@]}" --pretrain "$TS" --dataset "$FX/records.jsonl" --output_path "$W/r1.jsonl" ||
  fail "score records exited $?"
"$RLHF" score "${Q[@]}" --pretrain "$TS" --dataset "$FX/story.txt" --max_len 64 --stride 32 \
  --output_path "$W/t.jsonl" || fail "score text exited $?"
python3 - "$FX/expected.json" "$W/r1.jsonl" "$W/t.jsonl" <<'PY' || fail "scores differ from transformers'"
import json, sys
exp = json.load(open(sys.argv[1]))
lines = [json.loads(l) for l in open(sys.argv[2])]
recs, summary = lines[:-1], lines[-1]["summary"]
assert len(recs) == len(exp["records"]), (len(recs), len(exp["records"]))
worst = 0.0
for i, (got, want) in enumerate(zip(recs, exp["records"])):
    assert got["index"] == i and got["line"] == i + 1, got
    assert got["prompt_tokens"] == len(want["prompt_ids"]), (i, got["prompt_tokens"], want["prompt_ids"])
    assert got["tokens"] == len(want["response_ids"]), (i, got["tokens"], want["response_ids"])
    for a, b in zip(got["logprobs"], want["logprobs"]):
        worst = max(worst, abs(a - b))
    assert abs(got["nll"] - want["nll"]) < 2e-4, (i, got["nll"], want["nll"])
assert worst < 2e-4, worst
tokens = sum(len(r["response_ids"]) for r in exp["records"])
nll = sum(r["nll"] * len(r["response_ids"]) for r in exp["records"]) / tokens
assert summary["scored"] == len(recs) and summary["tokens"] == tokens, summary
assert abs(summary["nll"] - nll) < 2e-4, (summary["nll"], nll)
t = json.loads(open(sys.argv[3]).readline())["summary"]
assert t["text_tokens"] == exp["text"]["text_tokens"] and t["tokens"] == exp["text"]["tokens"], t
assert abs(t["nll"] - exp["text"]["nll"]) < 1e-4, (t["nll"], exp["text"]["nll"])
print(f"score: records max |dlp| {worst:.2e}; text nll {t['nll']:.6f} vs {exp['text']['nll']:.6f}")
PY

# --- 2 ranks = 1 rank (the records; the summary's seconds differ)
mpirun -np 2 --oversubscribe --bind-to none "$RLHF" score "${Q[@]}" --pretrain "$TS" \
  --dataset "$FX/records.jsonl" --output_path "$W/r2.jsonl" || fail "2-rank score exited $?"
cmp <(head -n -1 "$W/r1.jsonl") <(head -n -1 "$W/r2.jsonl") || fail "2 ranks differ from 1 rank"

# --- a record longer than --max_len is skipped and counted
"$RLHF" score "${Q[@]}" --pretrain "$TS" --dataset "$FX/records.jsonl" --max_len 12 \
  --output_path "$W/s.jsonl" || fail "score --max_len 12 exited $?"
grep -q '"skipped":"' "$W/s.jsonl" || fail "no record skipped at --max_len 12"

# --- bad input: one clear error naming the file and line
printf '{"input": "a", "output": "b"}\n{"input": "c"}\n' >"$W/bad.jsonl"
out=$("$RLHF" score "${Q[@]}" --pretrain "$TS" --dataset "$W/bad.jsonl" --output_path "$W/b.jsonl" 2>&1)
rc=$?
[ $rc -ne 0 ] || fail "a record without output_key was accepted"
grep -q "bad.jsonl:2: key 'output' must be a string" <<<"$out" || fail "unclear error: $out"
[ ! -e "$W/b.jsonl" ] || fail "a failed run left $W/b.jsonl"
echo "score: PASS"
