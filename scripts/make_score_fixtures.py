#!/usr/bin/env python3
"""Reference scores for `rlhf score` (tests/fixtures/score/expected.json), from transformers.

The model is TinyStories-656K (a Hugging Face folder: LlamaForCausalLM + tokenizer.json), the one
`tests/e2e/score.sh` scores with rlhf. For every record of tests/fixtures/score/records.jsonl the
prompt (a string, or the contents of chat messages joined by newlines) is encoded with BOS and the
response without special tokens, concatenated, and the log-probability of each response token is
read from the model's logits in float64 (the bf16 weights upcast). For tests/fixtures/score/story.txt
the text is encoded with BOS and scored with Hugging Face's strided perplexity (windows of WINDOW
tokens every STRIDE tokens, each scoring only the tokens after the previous window's end), written
here from the description in the transformers docs ("Perplexity of fixed-length models").

usage: /work/venvs/fixtures/bin/python scripts/make_score_fixtures.py <tinystories-656k folder>
  (torch + transformers; the folder is bf16_upstream/ of the TinyStories-656K data set)
"""
import json
import os
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

WINDOW, STRIDE = 64, 32
HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "score")


def prompt_text(value):
    if isinstance(value, str):
        return value
    return "\n".join(m["content"] for m in value)


def main():
    folder = sys.argv[1]
    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, torch_dtype=torch.float64)
    model.eval()
    bos = tok.bos_token_id

    def logprobs(ids):  # log p(ids[t] | ids[:t]) for t >= 1
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0]
        lp = torch.log_softmax(logits, dim=-1)
        return [lp[t - 1, ids[t]].item() for t in range(1, len(ids))]

    records = []
    with open(os.path.join(HERE, "records.jsonl")) as f:
        for line in f:
            r = json.loads(line)
            p = [bos] + tok(prompt_text(r["input"]), add_special_tokens=False).input_ids
            resp = tok(r["output"], add_special_tokens=False).input_ids
            lp = logprobs(p + resp)[len(p) - 1:]
            records.append({"prompt_ids": p, "response_ids": resp, "logprobs": lp,
                            "nll": -sum(lp) / len(lp)})

    text = open(os.path.join(HERE, "story.txt")).read()
    ids = [bos] + tok(text, add_special_tokens=False).input_ids
    scored, prev_end = [], 0
    for begin in range(0, len(ids), STRIDE):
        end = min(begin + WINDOW, len(ids))
        lp = logprobs(ids[begin:end])  # lp[i] predicts ids[begin + 1 + i]
        for t in range(max(prev_end, begin + 1), end):
            scored.append(lp[t - begin - 1])
        prev_end = end
        if end == len(ids):
            break
    nll = -sum(scored) / len(scored)
    out = {
        "generator": "scripts/make_score_fixtures.py",
        "model": "TinyStories-656K (bf16_upstream), transformers float64",
        "transformers": __import__("transformers").__version__,
        "torch": torch.__version__,
        "records": records,
        "text": {"window": WINDOW, "stride": STRIDE, "text_tokens": len(ids),
                 "tokens": len(scored), "nll": nll},
    }
    with open(os.path.join(HERE, "expected.json"), "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    print(f"{len(records)} records, text: {len(scored)} tokens, nll {nll:.6f}")


if __name__ == "__main__":
    main()
