#!/usr/bin/env bash
# --apply_chat_template end to end:
# - `rlhf generate` reads chat-message arrays under --input_key: with --apply_chat_template a
#   byte-tokenizer model (no template) renders them in the built-in Llama 2 format, warns once,
#   and encodes them without an extra BOS; without the flag the contents are joined by newlines;
# - `rlhf sft` (conversations and input/output pairs) and `rlhf rm` (prompt + chosen/rejected)
#   train a step with --apply_chat_template;
# - with ../shared/data, `rlhf generate --pretrain SmolLM2-135M-Instruct.Q4_1.gguf` renders the
#   GGUF's own Jinja template: the prompt written out is transformers' rendering, with SmolLM2's
#   default system prompt (that part is skipped when the data is absent).
# Usage: chat_template.sh <rlhf binary> <source dir>   (env RLHF_SHARED_DATA overrides ../shared/data)
set -u
RLHF=$1
SRC=$2
DATA=${RLHF_SHARED_DATA:-$SRC/../shared/data}
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
export OMP_NUM_THREADS=2
command -v python3 >/dev/null || { echo "skipped: needs python3 to read the JSONL output"; exit 77; }

# --- a tiny byte-tokenizer model (one SFT step is enough to have a checkpoint to sample from)
printf 'the cat sat on the mat.\n\na dog ran.\n' > "$W/text.txt"
"$RLHF" sft --model_config "$SRC/examples/models/tiny.toml" --dataset "$W/text.txt" --max_len 32 \
  --train_batch_size 2 --micro_train_batch_size 2 --max_steps 1 --log_level warn \
  --save_path "$W/ck" || fail "sft exited $?"

cat > "$W/chat.jsonl" <<'EOF'
{"input": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "the cat"}]}
{"input": "a dog"}
EOF
GEN=(generate --pretrain "$W/ck" --dataset "$W/chat.jsonl" --generate_max_len 4 --greedy)
"$RLHF" "${GEN[@]}" --apply_chat_template --output_path "$W/t.jsonl" > "$W/t.log" 2>&1 \
  || { tail -5 "$W/t.log"; fail "generate --apply_chat_template exited $?"; }
grep -q "has no chat template; using the built-in llama2 format" "$W/t.log" \
  || fail "no warning about the built-in format"
[ "$(grep -c "built-in llama2 format" "$W/t.log")" -eq 1 ] || fail "the warning is not logged once"
"$RLHF" "${GEN[@]}" --log_level warn --output_path "$W/p.jsonl" || fail "generate (plain) exited $?"
python3 - "$W/t.jsonl" "$W/p.jsonl" <<'EOF' || fail "prompts of generate"
import json, sys
t = [json.loads(l) for l in open(sys.argv[1], encoding="utf-8")]
p = [json.loads(l) for l in open(sys.argv[2], encoding="utf-8")]
want = ["<s>[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nthe cat [/INST]", "<s>[INST] a dog [/INST]"]
assert [r["prompt"] for r in t] == want, [r["prompt"] for r in t]
assert all(r["prompt_tokens"] == len(r["prompt"].encode()) for r in t), t  # no BOS added
assert [r["prompt"] for r in p] == ["Be brief.\nthe cat", "a dog"], [r["prompt"] for r in p]
assert all(r["prompt_tokens"] == len(r["prompt"].encode()) + 1 for r in p), p  # bytes + BOS
EOF
echo "ok: generate renders chat-message arrays (built-in Llama 2 format, no extra BOS)"

# A record that is neither a string nor messages: one error naming file, line and key.
printf '{"input": {"role": "user"}}\n' > "$W/bad.jsonl"
out=$("$RLHF" generate --pretrain "$W/ck" --dataset "$W/bad.jsonl" --output_path "$W/bad_out.jsonl" \
  --apply_chat_template --log_level warn 2>&1) && fail "bad prompt: exit 0"
echo "$out" | grep -qF "bad.jsonl:1: key 'input': must be a string or chat messages" \
  || { echo "$out" | tail -3; fail "bad prompt: unexpected message"; }
echo "ok: a prompt that is not text or messages is refused"

# --- sft and rm with --apply_chat_template (conversations and pairs)
cat > "$W/sft.jsonl" <<'EOF'
{"input": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]}
{"input": "3+3?", "output": "6"}
EOF
"$RLHF" sft --model_config "$SRC/examples/models/tiny.toml" --dataset "$W/sft.jsonl" --max_len 64 \
  --train_batch_size 2 --micro_train_batch_size 2 --max_steps 1 --apply_chat_template \
  --log_level warn --save_path "$W/sft" || fail "sft --apply_chat_template exited $?"
cat > "$W/rm.jsonl" <<'EOF'
{"prompt": "2+2?", "chosen": "4", "rejected": "5"}
{"prompt": [{"role": "user", "content": "3+3?"}], "chosen": "6", "rejected": "7"}
EOF
"$RLHF" rm --pretrain "$W/sft" --dataset "$W/rm.jsonl" --prompt_key prompt --max_len 64 \
  --train_batch_size 2 --micro_train_batch_size 2 --max_steps 1 --apply_chat_template \
  --log_level warn --save_path "$W/rm" || fail "rm --apply_chat_template exited $?"
echo "ok: sft and rm train with --apply_chat_template"

# --- SmolLM2's own Jinja template, read from its GGUF file
GGUF="$DATA/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf"
if [ ! -f "$GGUF" ]; then
  echo "skipped (part): ../shared/data/smollm2-135m-instruct not found (set RLHF_SHARED_DATA)"
  exit 0
fi
printf '{"input": [{"role": "user", "content": "What is 2+2?"}]}\n' > "$W/smol.jsonl"
"$RLHF" generate --pretrain "$GGUF" --dataset "$W/smol.jsonl" --generate_max_len 8 --greedy \
  --apply_chat_template --log_level warn --output_path "$W/smol_out.jsonl" \
  || fail "generate SmolLM2 exited $?"
python3 - "$W/smol_out.jsonl" <<'EOF' || fail "SmolLM2 prompt"
import json, sys
r = json.loads(open(sys.argv[1], encoding="utf-8").readline())
want = ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
        "<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n")
assert r["prompt"] == want, repr(r["prompt"])
assert r["completion_tokens"] >= 1, r
print("SmolLM2 completion:", repr(r["completion"]))
EOF
echo "ok: the SmolLM2 GGUF's template gives its default system prompt"
