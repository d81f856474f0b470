#!/usr/bin/env python3
"""Checks a PEFT LoRA adapter folder (e.g. `rlhf export --format peft` output: adapter_config.json
+ adapter_model.safetensors) against a LoRA fixture: PEFT loads the folder onto the fixture's base
model and must reproduce the fixture's adapted logits.

    python3 scripts/check_peft_adapter.py --adapter DIR --fixture tests/fixtures/lora/X.h5 \
        [--tol 1e-5] [--logits-from /lora/logits]

Builds the base model with transformers from the fixture's `config` attribute and `/params`
(float64, eager attention), loads DIR with `peft.PeftModel.from_pretrained` (PEFT reports missing
or unexpected adapter keys as an error here), runs the fixture's `/input_ids` (no attention mask,
positions 0..T-1, as the fixtures were made) and compares the logits with the fixture dataset
given by --logits-from (default `/lora/logits`), or with logits saved by numpy (--reference-npy,
e.g. rlhf's own logits for an adapter it trained). Prints one summary line: max |diff| / max |logit|.
Exit status 0 if that is <= --tol, 1 if not (or if PEFT cannot load DIR), 2 on a usage error.

    --reference-npy FILE   compare against logits (B, T, V) saved by numpy instead of the fixture's

Needs torch, transformers (< 5), peft, h5py, numpy (the venv of scripts/make_lora_fixtures.py).
"""

import argparse
import json
import os
import sys

USAGE_ERROR, MISMATCH, OK = 2, 1, 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--adapter", required=True, help="PEFT adapter folder")
    ap.add_argument("--fixture", required=True, help="tests/fixtures/lora/*.h5")
    ap.add_argument("--tol", type=float, default=1e-5)
    ap.add_argument("--logits-from", default="lora/logits")
    ap.add_argument("--reference-npy", help="reference logits (B,T,V) as a .npy file")
    args = ap.parse_args()
    for p in (args.fixture, os.path.join(args.adapter, "adapter_config.json"),
              os.path.join(args.adapter, "adapter_model.safetensors")):
        if not os.path.exists(p):
            print(f"check_peft_adapter: {p}: no such file", file=sys.stderr)
            return USAGE_ERROR

    import h5py
    import numpy as np
    import torch
    import transformers
    from peft import PeftModel

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import make_arch_fixtures as mfa  # float64 patches, head logits

    with h5py.File(args.fixture, "r") as f:
        cfg = json.loads(f.attrs["config"])
        ids = torch.from_numpy(f["input_ids"][...].astype(np.int64))
        params = {n: torch.from_numpy(f["params/" + n][...]) for n in f["params"]}
        if args.reference_npy:
            ref = torch.from_numpy(np.load(args.reference_npy))
        else:
            if args.logits_from.strip("/") not in f:
                print(f"check_peft_adapter: {args.fixture}: no dataset /{args.logits_from}",
                      file=sys.stderr)
                return USAGE_ERROR
            ref = torch.from_numpy(f[args.logits_from.strip("/")][...])

    hf_cfg = {k: v for k, v in cfg.items() if k not in ("rope_style", "head")}
    config = transformers.AutoConfig.for_model(**hf_cfg)
    config._attn_implementation = "eager"
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    missing, unexpected = model.load_state_dict(params, strict=False)
    missing = [m for m in missing if not (m == "lm_head.weight" and cfg["tie_word_embeddings"])]
    if missing or unexpected:
        print(f"check_peft_adapter: fixture params do not fit the model: missing {missing}, "
              f"unexpected {unexpected}", file=sys.stderr)
        return MISMATCH
    try:
        pm = PeftModel.from_pretrained(model, args.adapter, is_trainable=False)
    except Exception as e:  # PEFT raises several types on a malformed adapter
        print(f"check_peft_adapter: PEFT cannot load {args.adapter}: {e}", file=sys.stderr)
        return MISMATCH
    pm = pm.to(torch.float64).eval()
    with mfa.f64_patches(), torch.no_grad():
        logits = mfa.head_logits(pm.base_model.model, ids)
    scale = max(ref.abs().max().item(), 1e-30)
    err = (logits - ref.to(torch.float64)).abs().max().item() / scale
    ok = err <= args.tol
    print(f"check_peft_adapter: {args.adapter} on {os.path.basename(args.fixture)}: max |dlogits| "
          f"/ max |logit| = {err:.2e} (tol {args.tol:.0e}) -> {'OK' if ok else 'MISMATCH'}")
    return OK if ok else MISMATCH


if __name__ == "__main__":
    sys.exit(main())
