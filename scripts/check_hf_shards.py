#!/usr/bin/env python3
"""Checks a sharded Hugging Face export (ours: model-0000k-of-0000n.safetensors +
model.safetensors.index.json) against what transformers itself writes for the same weights.

    python3 scripts/check_hf_shards.py --model DIR --max-shard-size 20KB --out REF_DIR

Loads DIR with AutoModelForCausalLM in bfloat16, writes it again with transformers'
save_pretrained(REF_DIR, max_shard_size=...) and requires: the two model.safetensors.index.json
files byte for byte equal (weight_map, metadata total_parameters / total_size, sorted keys, indent
2), and every shard file of DIR holding the same tensor names as transformers' file of the same
name, with bfloat16 values equal to them. Prints one line; exit status 0 when all hold, 1 if not.
Needs torch, transformers and safetensors.
"""
import argparse
import json
import os
import sys

import torch
import transformers
from safetensors.torch import load_file


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--max-shard-size", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    m = transformers.AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.bfloat16)
    m.save_pretrained(a.out, max_shard_size=a.max_shard_size)
    index = "model.safetensors.index.json"
    ours = open(os.path.join(a.model, index)).read()
    theirs = open(os.path.join(a.out, index)).read()
    if ours != theirs:
        print(f"FAIL: the index differs\n--- ours\n{ours}\n--- transformers\n{theirs}")
        return 1
    files = sorted(set(json.loads(ours)["weight_map"].values()))
    for f in files:
        x, y = load_file(os.path.join(a.model, f)), load_file(os.path.join(a.out, f))
        if sorted(x) != sorted(y):
            print(f"FAIL: {f} holds {sorted(x)}, transformers' {sorted(y)}")
            return 1
        for k in x:
            if x[k].dtype != torch.bfloat16 or not torch.equal(x[k], y[k]):
                print(f"FAIL: {f}: {k} differs from transformers' ({x[k].dtype})")
                return 1
    print(f"ok: the index and {len(files)} shards equal transformers' save_pretrained")
    return 0


if __name__ == "__main__":
    sys.exit(main())
