#!/usr/bin/env bash
# examples/env/python_exec.py, the sandboxed Python tool:
#  (a) hostile programs — a fork bomb, a memory hog, an infinite loop, a sleeper, network access,
#      huge output, a huge file, writing outside its folder — are each contained and reported as
#      the observation (a limit's message, or the program's own error), the tool answers every
#      query in order, each within the deadline plus a margin, and no sandbox process is left;
#  (b) a well-behaved program's output comes back, and the final answer is scored;
#  (c) GRPO with the tool runs 2 steps on 2 ranks (the job goes on with the environment).
# Where no network namespace can be made, the tool must refuse to start with the reason (checked),
# and the rest is skipped (77).
# Usage: python_exec.sh <rlhf binary> <source dir>
set -u
RLHF=$1
SRC=$2
# shellcheck source=lib/common.sh
. "$SRC/tests/e2e/lib/common.sh"
TOOL=(python3 "$SRC/examples/env/python_exec.py" --wall-seconds 3 --cpu-seconds 2 --memory-mb 256
      --file-mb 1 --procs 16 --output-bytes 1000)

if ! unshare -n true 2> /dev/null && ! unshare -Un true 2> /dev/null; then
  echo '{"id":"0","action":"<python>print(1)</python>"}' | "${TOOL[@]}" > "$W/out" 2> "$W/err"
  rc=$?
  [ $rc -eq 2 ] && grep -q "refusing to run model-written code with the network open" "$W/err" \
    || fail "no network namespace here, but the tool did not refuse (rc $rc): $(cat "$W/err")"
  echo "skipped: no network namespace can be made here; the tool refuses with: $(head -1 "$W/err")"
  exit 77
fi

python3 - "$W/req.jsonl" "$W" <<'EOF'
import json, sys
W = sys.argv[2]
progs = [
    ("ok", "print(6 * 7)"),
    ("fork_bomb", "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"),
    ("memory_hog", "x = bytearray(1 << 30)\nprint('allocated')"),
    ("infinite_loop", "while True:\n    pass"),
    ("sleeper", "import subprocess\nsubprocess.Popen(['sleep', '1000'], start_new_session=True)\nimport time\ntime.sleep(1000)"),
    ("network", "import socket\nsocket.create_connection(('1.1.1.1', 80), 2)\nprint('connected')"),
    ("huge_output", "while True:\n    print('x' * 1000)"),
    ("big_file", "f = open('big', 'wb')\nwhile True:\n    f.write(b'0' * 65536)"),
    ("write_outside", f"open('{W}/escaped.txt', 'w').write('escaped')\nprint('wrote')"),
    ("final", None),
]
with open(sys.argv[1], "w") as f:
    for name, code in progs:
        action = f"<python>{code}</python>" if code else "so the answer is 42"
        f.write(json.dumps({"id": name, "turn": 0, "prompt": "", "text": "", "action": action,
                            "label": "#### 42", "eos": False}) + "\n")
EOF
t0=$SECONDS
timeout 120 "${TOOL[@]}" < "$W/req.jsonl" > "$W/answers.jsonl" 2> "$W/tool.err" \
  || { cat "$W/tool.err"; fail "the tool exited or hung (rc $?)"; }
took=$((SECONDS - t0))
python3 - "$W/answers.jsonl" <<'EOF' || fail "an answer is wrong: $(cat "$W/answers.jsonl" | cut -c1-300)"
import json, sys
a = {}
order = []
for line in open(sys.argv[1]):
    r = json.loads(line)
    a[r["id"]] = r
    order.append(r["id"])
assert order == ["ok", "fork_bomb", "memory_hog", "infinite_loop", "sleeper", "network",
                 "huge_output", "big_file", "write_outside", "final"], order
def obs(k):
    assert a[k]["done"] is False, (k, a[k])
    return a[k]["observation"]
assert obs("ok") == "<output>\n42\n[exit status 0]\n</output>", obs("ok")
# A fork bomb gets EAGAIN at --procs and spins until a limit stops it.
assert "[stopped: " in obs("fork_bomb"), obs("fork_bomb")
assert "MemoryError" in obs("memory_hog") and "allocated" not in obs("memory_hog"), obs("memory_hog")
assert ("[stopped: CPU time limit of 2 s]" in obs("infinite_loop")
        or "[stopped: wall-clock deadline of 3 s]" in obs("infinite_loop")), obs("infinite_loop")
assert "[stopped: wall-clock deadline of 3 s]" in obs("sleeper"), obs("sleeper")
assert "Network is unreachable" in obs("network") and "connected" not in obs("network"), obs("network")
assert "[stopped: output over 1000 bytes]" in obs("huge_output"), obs("huge_output")
assert len(obs("huge_output")) < 1100, len(obs("huge_output"))
assert ("File too large" in obs("big_file")
        or "[stopped: file size limit of 1 MiB]" in obs("big_file")), obs("big_file")
assert "Permission denied" in obs("write_outside") or "Read-only" in obs("write_outside"), obs("write_outside")
assert a["final"] == {"id": "final", "observation": "", "done": True, "reward": 1.0}, a["final"]
EOF
[ ! -e "$W/escaped.txt" ] || fail "a sandboxed program wrote outside its folder"
# Deadlines: 10 programs, the slow ones stopped at 3 s each (plus cleanup).
[ $took -lt 60 ] || fail "the tool took ${took}s for 10 programs with a 3 s deadline"
pgrep -f "sleep 1000" > /dev/null && fail "a sandboxed process (sleep 1000) outlived its run"
echo "ok: python_exec: fork bomb, memory hog, infinite loop, sleeper, network, huge output, huge file and a write outside the folder each contained and reported (${took}s for 10 programs)"

# (c) GRPO with the tool on 2 ranks: episodes run, the job ends normally.
TASK="builtin:addition?n=200&digits=1&seed=1"
timeout 300 "${MPI[@]}" -np 2 "$RLHF" grpo --model_config "$SRC/examples/models/tiny.toml" \
  --prompt_data "$TASK" --input_key input --label_key label --reward math \
  --env_command "${TOOL[*]}" --env_timeout 60 --stop_strings "</python>" --env_max_turns 2 \
  --n_samples_per_prompt 4 --rollout_batch_size 4 --train_batch_size 16 \
  --micro_train_batch_size 8 --generate_max_len 16 --max_steps 2 --seed 1 \
  --save_path "$W/grpo" > "$W/grpo.log" 2>&1 || { tail "$W/grpo.log"; fail "GRPO with python_exec exited"; }
[ "$(grep -c '"env_turns_mean"' "$W/grpo/metrics.jsonl")" -eq 2 ] || fail "GRPO with python_exec: metrics"
echo "ok: GRPO with python_exec.py: 2 steps on 2 ranks"
echo PASS
