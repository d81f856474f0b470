#!/usr/bin/env bash
# rlhf eval end to end: sft a tiny model a few seconds on the built-in addition task, then evaluate
# it with --reward math on hand-written additions whose labels we control. The output has one line
# per sample and a summary line; the per-sample "correct" flags agree with the scores and with an
# independent check of the completions against the labels; accuracy × samples is the number of
# correct samples, pass@1 = accuracy, pass@k is the unbiased estimator over the per-prompt counts;
# the same seed gives the same samples on 1 rank, 2 colocated engines and 2 disaggregated engines
# (4 ranks); another seed changes them; a builtin:<task> dataset works; bad input (no --reward, a
# missing dataset, a record without the label key) is a one-line error with a non-zero exit on
# every rank, without hanging and without an output file.
# Usage: eval.sh <rlhf binary> <source dir>     (env MPIEXEC: mpiexec's path)
set -u
RLHF=$1
SRC=$2
# shellcheck source=lib/common.sh
. "$SRC/tests/e2e/lib/common.sh"
command -v python3 >/dev/null || { echo "SKIP: python3 is needed to check the JSONL"; exit 77; }
MPI=(timeout 300 "$MPIEXEC" --oversubscribe --allow-run-as-root --bind-to none)
TASK="builtin:addition?n=2000&digits=1&seed=1"

# --- a tiny policy: 120 SFT steps on 1-digit additions (a few seconds; some answers right)
warm_start_sft 120

# Held-out prompts: labels as strings and as numbers; "answer" is not the label key.
cat > "$W/add.jsonl" <<'EOF'
{"input": "3+5=", "label": "8"}
{"input": "2+2=", "label": 4}
{"input": "7+1=", "label": "8", "answer": "wrong"}
{"input": "0+6=", "label": "6"}

{"input": "9+9=", "label": "18"}
{"input": "4+3=", "label": 7}
{"input": "1+0=", "label": "1"}
EOF

EVAL=(eval --pretrain "$W/sft/model.h5" --dataset "$W/add.jsonl" --label_key label --reward math
      --n_samples_per_prompt 4 --temperature 1.0 --generate_max_len 6 --seed 3 --threads 1)
"$RLHF" "${EVAL[@]}" --output_path "$W/out/e1.jsonl" > "$W/e1.log" 2>&1 \
  || { tail -5 "$W/e1.log"; fail "eval on 1 rank exited"; }
[ -f "$W/out/e1.jsonl" ] || fail "no output file"
ls "$W/out" | grep -q '\.tmp' && fail "a .tmp file was left behind"
grep -q "eval: 7 prompts x 4 samples | accuracy" "$W/e1.log" || { tail -3 "$W/e1.log"; fail "no summary in the log"; }
grep -q "pass@4" "$W/e1.log" || fail "no pass@4 in the log"
grep -q "tok/s" "$W/e1.log" || fail "no tok/s in the log"

# check <file> <prompts> <n>: the lines, their fields and the summary agree with each other and
# with the labels of add.jsonl.
check() {
  python3 - "$1" "$2" "$3" "$W/add.jsonl" <<'EOF' || fail "check of $1"
import json, math, re, sys
path, P, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
recs = [json.loads(l) for l in open(sys.argv[4]) if l.strip()]
lines = [json.loads(l) for l in open(path, encoding="utf-8")]
rows, summary = lines[:-1], lines[-1]["summary"]
assert set(lines[-1]) == {"summary"}, lines[-1]
assert len(rows) == P * n, (len(rows), P, n)
fields = ["prompt_index", "sample_index", "prompt", "completion", "score", "correct",
          "completion_tokens", "finish_reason"]
checked = 0
for k, r in enumerate(rows):
    assert list(r) == fields, list(r)
    assert r["prompt_index"] == k // n and r["sample_index"] == k % n, r
    assert r["prompt"] == recs[r["prompt_index"]]["input"], r
    assert r["score"] in (0.0, 1.0), r
    assert r["correct"] == (r["score"] >= 1.0), r
    assert r["finish_reason"] in ("stop", "length"), r
    assert r["completion_tokens"] >= 1, r
    # An independent answer check where the completion is a bare integer.
    c = r["completion"].strip()
    if re.fullmatch(r"-?\d+", c):
        assert r["correct"] == (int(c) == int(recs[r["prompt_index"]]["label"])), r
        checked += 1
correct = sum(r["correct"] for r in rows)
assert summary["prompts"] == P and summary["samples"] == P * n, summary
assert abs(summary["accuracy"] * len(rows) - correct) < 1e-9, (summary["accuracy"], correct)
assert abs(summary["pass@1"] - summary["accuracy"]) < 1e-12, summary
assert abs(summary["reward_mean"] - sum(r["score"] for r in rows) / len(rows)) < 1e-9, summary
mean_len = sum(r["completion_tokens"] for r in rows) / len(rows)
assert abs(summary["response_length_mean"] - mean_len) < 1e-9, summary
stops = sum(r["finish_reason"] == "stop" for r in rows) / len(rows)
assert abs(summary["stop_fraction"] - stops) < 1e-9, summary
# pass@k (Chen et al. 2021): 1 - C(n-c, k) / C(n, k), averaged over prompts; k = 1, 2, 4, ..., n.
per = [sum(r["correct"] for r in rows[p * n:(p + 1) * n]) for p in range(P)]
ks = sorted(int(key[5:]) for key in summary if key.startswith("pass@"))
want = sorted({2 ** i for i in range(n.bit_length()) if 2 ** i <= n} | {n})
assert ks == want, (ks, want)
for k in ks:
    est = sum(1.0 - math.comb(n - c, k) / math.comb(n, k) for c in per) / P
    assert abs(summary[f"pass@{k}"] - est) < 1e-9, (k, summary[f"pass@{k}"], est)
print(f"ok: {path}: {len(rows)} samples, {correct} correct ({checked} checked against the labels), "
      f"accuracy {summary['accuracy']:.3f}, " +
      ", ".join(f"pass@{k} {summary[f'pass@{k}']:.3f}" for k in ks))
EOF
}
check "$W/out/e1.jsonl" 7 4

# Same samples: the sample lines byte for byte, the summary but for its timings.
same() {  # same <a> <b>
  cmp -s <(sed '$d' "$1") <(sed '$d' "$2") || return 1
  python3 - "$1" "$2" <<'EOF'
import json, sys
def summary(p):
    s = json.loads(open(p).readlines()[-1])["summary"]
    return {k: v for k, v in s.items() if k not in ("seconds", "tokens_per_s")}
sys.exit(0 if summary(sys.argv[1]) == summary(sys.argv[2]) else 1)
EOF
}

# --- 2 ranks (2 colocated engines) and 4 ranks (2 simulated nodes, 1 generation rank each): the
# same file as 1 rank (per-sample random streams keyed by the prompt index, not the rank).
"${MPI[@]}" -np 2 "$RLHF" "${EVAL[@]}" --output_path "$W/out/e2.jsonl" > "$W/e2.log" 2>&1 \
  || { tail -5 "$W/e2.log"; fail "eval on 2 ranks exited"; }
grep -q "engines: 2 " "$W/e2.log" || { tail -5 "$W/e2.log"; fail "2 ranks: not 2 engines"; }
check "$W/out/e2.jsonl" 7 4
same "$W/out/e1.jsonl" "$W/out/e2.jsonl" || fail "2 ranks: not the 1-rank samples"
echo "ok: 2 ranks (2 colocated engines): the same samples and summary as 1 rank"
"${MPI[@]}" -np 4 "$RLHF" "${EVAL[@]}" --ranks_per_node 2 --gen_ranks_per_node 1 \
  --output_path "$W/out/e4.jsonl" > "$W/e4.log" 2>&1 \
  || { tail -5 "$W/e4.log"; fail "eval on 4 ranks, 2 engines exited"; }
same "$W/out/e1.jsonl" "$W/out/e4.jsonl" || fail "4 ranks (2 engines): not the 1-rank samples"
echo "ok: 4 ranks (2 disaggregated engines): the same samples and summary as 1 rank"

"$RLHF" "${EVAL[@]}" --seed 4 --output_path "$W/out/s4.jsonl" --log_level warn || fail "seed 4 exited $?"
cmp -s <(sed '$d' "$W/out/e1.jsonl") <(sed '$d' "$W/out/s4.jsonl") && fail "another seed gave the same samples"
echo "ok: another seed changes the samples"

# Greedy, one sample per prompt, --max_samples: pass@1 only.
"$RLHF" "${EVAL[@]}" --greedy --n_samples_per_prompt 1 --max_samples 5 --log_level warn \
  --output_path "$W/out/g.jsonl" || fail "greedy exited $?"
check "$W/out/g.jsonl" 5 1

# A builtin task (its records are written next to the output for inspection).
"$RLHF" eval --pretrain "$W/sft/model.h5" --dataset "builtin:addition?n=40&digits=1&split=test" \
  --label_key label --reward math --n_samples_per_prompt 2 --generate_max_len 6 --threads 1 \
  --log_level warn --output_path "$W/bi/b.jsonl" || fail "builtin dataset exited $?"
[ "$(wc -l < "$W/bi/b.jsonl")" -eq 81 ] || fail "builtin: expected 80 samples + a summary line"
ls "$W/bi" | grep -q '^builtin_addition' || fail "builtin: the task's records were not written"
echo "ok: builtin:addition (test split) evaluates"

# --- bad input: one-line error, non-zero exit, on 1 rank and on every rank of 2 ranks
printf '{"input": "1+1=", "label": "2"}\n{"input": "2+3=", "answer": "5"}\n' > "$W/nolabel.jsonl"
BASE=(eval --pretrain "$W/sft/model.h5" --dataset "$W/add.jsonl" --label_key label --reward math
      --generate_max_len 6 --threads 1 --log_level warn --output_path "$W/out/bad.jsonl")
expect_error() {  # expect_error <what> <np> <want status: 1|2> <message fragment> <args...>
  local what=$1 np=$2 want=$3 msg=$4
  shift 4
  local out code
  if [ "$np" -eq 1 ]; then
    out=$(timeout 120 "$RLHF" "$@" 2>&1)
  else
    out=$("${MPI[@]}" -np "$np" "$RLHF" "$@" 2>&1)
  fi
  code=$?
  [ $code -ne 0 ] || fail "$what: exit 0"
  [ $code -ne 124 ] || fail "$what: the job hung (killed by timeout)"
  [ "$np" -gt 1 ] || [ $code -eq "$want" ] || fail "$what: exit $code, want $want"
  echo "$out" | grep -qF -- "$msg" || { echo "$out" | tail -3; fail "$what: message lacks '$msg'"; }
  [ "$(echo "$out" | grep -c "error: ")" -ge 1 ] || fail "$what: no 'error:' line"
  echo "ok: $what -> exit $code: $(echo "$out" | grep -m1 "error: " | cut -c1-160)"
}
noreward=()
for a in "${BASE[@]}"; do [ "$a" != "--reward" ] && [ "$a" != "math" ] && noreward+=("$a"); done
for np in 1 2; do
  expect_error "$np rank(s), no --reward" $np 2 "--reward is required" "${noreward[@]}"
  expect_error "$np rank(s), missing dataset" $np 1 "--dataset $W/no-such.jsonl: no such file" \
    "${BASE[@]}" --dataset "$W/no-such.jsonl"
  expect_error "$np rank(s), a record without the label key" $np 1 \
    "nolabel.jsonl:2: no label key 'label'" "${BASE[@]}" --dataset "$W/nolabel.jsonl"
  expect_error "$np rank(s), --reward math without --label_key" $np 2 \
    "--reward math needs --label_key" "${BASE[@]}" --label_key ""
  expect_error "$np rank(s), unknown reward" $np 1 "--reward" "${BASE[@]}" --reward bogus
done
expect_error "missing checkpoint" 1 1 "$W/none.h5" "${BASE[@]}" --pretrain "$W/none.h5"
expect_error "no --output_path" 1 2 "--output_path is required" eval --pretrain "$W/sft/model.h5" \
  --dataset "$W/add.jsonl" --label_key label --reward math
[ -f "$W/out/bad.jsonl" ] && fail "a failed run left an output file"
echo PASS
