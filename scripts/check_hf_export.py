#!/usr/bin/env python3
"""Checks a Hugging Face model folder (e.g. our C++ export: config.json + model.safetensors)
against a fixture: transformers loads the folder and must reproduce the fixture's logits.

    python3 scripts/check_hf_export.py --model DIR --fixture tests/fixtures/X.h5 [--tol 1e-4]

Loads DIR with transformers' AutoConfig / AutoModelForCausalLM in float64 (eager attention), runs
the fixture's /input_ids (no attention mask, positions 0..T-1, as the fixtures were made) and
compares the logits with the fixture's /logits: max |diff| / max |logit|. Prints one summary line;
exit status 0 if that is <= --tol, 1 if not (or if transformers cannot load DIR, or reports
missing, unexpected or mismatched weights), 2 on a usage error (missing file, a fixture without
/logits such as value_head.h5).

    python3 scripts/check_hf_export.py --model DIR --fixture X.h5 --write-reference

instead writes the fixture's initial weights (/params) as a Hugging Face folder DIR with
transformers' own save_pretrained (float32 safetensors; interleaved fixtures converted back to
HF's rotate-half row order), a known-good export to compare ours against.

    python3 scripts/check_hf_export.py --model DIR --rlhf build/rlhf --source MODEL [--tol 1e-3]

checks the tokenizer and the model of an export DIR against rlhf reading MODEL (the model DIR
was exported from: a GGUF, llama2.c .bin, HDF5 or HF folder): `rlhf generate --greedy` completes
a set of varied prompts (ASCII, Unicode, runs of spaces, digits, special tokens written in the
text) from MODEL, with rlhf's tokenizer; transformers loads DIR with AutoTokenizer and
AutoModelForCausalLM (float64), tokenizes each prompt (add_special_tokens=True) — the token count
must equal rlhf's prompt_tokens — and scores rlhf's completion tokens after its own prompt ids:
the log-probs must equal rlhf's within --tol (absolute), so a prompt tokenized differently fails;
AutoTokenizer's decode of the completion ids must equal rlhf's completion text.

Needs torch, transformers (>= 4.51 for Qwen3), h5py, numpy: e.g. the venv of
scripts/make_arch_fixtures.py (see tests/fixtures/README.md).
"""

import argparse
import json
import os
import sys

USAGE_ERROR, MISMATCH, OK = 2, 1, 0


def usage_error(msg):
    print(f"check_hf_export: usage error: {msg}", file=sys.stderr)
    return USAGE_ERROR


def read_fixture(path):
    import h5py
    import numpy as np
    with h5py.File(path, "r") as f:
        if "logits" not in f or "input_ids" not in f:
            return None
        cfg = json.loads(f.attrs["config"])
        ids = f["input_ids"][...].astype(np.int64)
        logits = f["logits"][...].astype(np.float64)
        params = {n: f["params/" + n][...] for n in f["params"]}
    return cfg, ids, logits, params


def hf_order(name, t, cfg):
    """Interleaved fixtures store q_proj/k_proj rows per head as (2i, 2i+1) = HF rows (i, i+D/2);
    returns HF's rotate-half order."""
    if cfg.get("rope_style") != "interleaved":
        return t
    if not (".self_attn.q_proj." in name or ".self_attn.k_proj." in name):
        return t
    D = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    heads = t.shape[0] // D
    rest = t.shape[1:]
    return t.reshape(heads, D // 2, 2, *rest).transpose(1, 2).reshape(t.shape).contiguous()


def write_reference(model_dir, fixture):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    cfg, _, _, params = fixture
    hf_cfg = {k: v for k, v in cfg.items() if k not in ("rope_style", "head")}
    config = AutoConfig.for_model(**hf_cfg)
    model = AutoModelForCausalLM.from_config(config)
    sd = {n: hf_order(n, torch.from_numpy(p), cfg) for n, p in params.items()}
    missing, unexpected = model.load_state_dict(sd, strict=False)
    missing = [n for n in missing if not (n == "lm_head.weight" and config.tie_word_embeddings)]
    if missing or unexpected:
        raise RuntimeError(f"fixture params do not fit {type(model).__name__}: missing {missing}, "
                           f"unexpected {unexpected}")
    model.save_pretrained(model_dir, safe_serialization=True)
    print(f"check_hf_export: wrote {type(model).__name__} with the fixture's params to {model_dir}")
    return OK


def check(model_dir, fixture_path, fixture, tol):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    _, ids, ref, _ = fixture
    where = f"model={model_dir} fixture={os.path.basename(fixture_path)}"
    try:
        config = AutoConfig.from_pretrained(model_dir)
        kw = dict(config=config, attn_implementation="eager", output_loading_info=True)
        try:
            model, info = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float64, **kw)
        except TypeError:  # transformers < 4.56 spells it torch_dtype
            model, info = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float64,
                                                               **kw)
    except Exception as e:  # noqa: BLE001 (any load failure is a failed export)
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        print(f"check_hf_export: FAIL cannot load: {type(e).__name__}: {msg} {where}")
        return MISMATCH
    bad = {k: sorted(v) for k, v in info.items()
           if k in ("missing_keys", "unexpected_keys", "mismatched_keys") and v}
    if bad:
        print(f"check_hf_export: FAIL {type(model).__name__} weights: {bad} {where}")
        return MISMATCH
    model.eval()
    with torch.no_grad():
        out = model(input_ids=torch.from_numpy(ids), use_cache=False).logits.to(torch.float64)
    ref = torch.from_numpy(ref)
    if out.shape != ref.shape:
        print(f"check_hf_export: FAIL logits shape {tuple(out.shape)} vs fixture "
              f"{tuple(ref.shape)} {where}")
        return MISMATCH
    diff = (out - ref).abs().max().item()
    scale = ref.abs().max().item()
    rel = diff / scale if scale > 0 else float("inf")
    ok = bool(torch.isfinite(out).all()) and rel <= tol  # NaN rel compares False
    print(f"check_hf_export: {'OK' if ok else 'FAIL'} {type(model).__name__} "
          f"max|dlogits| {diff:.3e} / max|logit| {scale:.3e} = {rel:.3e} (tol {tol:.0e}) {where}")
    return OK if ok else MISMATCH


PROMPTS = [
    "Once upon a time, there was a little",
    "The capital of France is",
    "Numbers: 7, 42, 1234567 and 3.14159 -",
    "Caf\u00e9 na\u00efve \u00fcber \u65e5\u672c\u8a9e \U0001F642 ok",
    "  two  spaces,\ta tab and\n\na blank line",
    "don't stop; it's I'll we've",
]


def special_prompts(tok):
    """Prompts with the tokenizer's own special tokens written in the text."""
    out = []
    names = [t for t in (tok.bos_token, tok.eos_token) if t]
    if "<|im_start|>" in tok.get_vocab():
        out.append("<|im_start|>user\nWhat is 12+30?<|im_end|>\n<|im_start|>assistant\n")
    for n in names:
        out.append(f"{n}Once upon a time{n} there")
    return out


def check_against_rlhf(model_dir, rlhf, source, tol, max_new):
    import subprocess
    import tempfile
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    where = f"model={model_dir} source={source}"
    try:
        tok = AutoTokenizer.from_pretrained(model_dir)
        try:
            model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float64,
                                                         attn_implementation="eager")
        except TypeError:
            model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float64,
                                                         attn_implementation="eager")
    except Exception as e:  # noqa: BLE001
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        print(f"check_hf_export: FAIL cannot load: {type(e).__name__}: {msg} {where}")
        return MISMATCH
    model.eval()
    prompts = PROMPTS + special_prompts(tok)
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "prompts.jsonl")
        out = os.path.join(tmp, "out.jsonl")
        with open(data, "w", encoding="utf-8") as f:
            for p in prompts:
                f.write(json.dumps({"input": p}) + "\n")
        cmd = [rlhf, "generate", "--pretrain", source, "--dataset", data, "--output_path", out,
               "--greedy", "--generate_max_len", str(max_new), "--log_level", "warn"]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            print(f"check_hf_export: FAIL rlhf generate exited {r.returncode}: "
                  f"{r.stderr.strip()[-500:]} {where}")
            return MISMATCH
        with open(out, encoding="utf-8") as f:
            recs = [json.loads(line) for line in f if line.strip()]
    bad, worst, n_tok = [], 0.0, 0
    for rec in recs:
        prompt = prompts[rec["prompt_index"]]
        ids = tok(prompt)["input_ids"]
        comp = rec["completion_token_ids"]
        if len(ids) != rec["prompt_tokens"]:
            bad.append(f"prompt {prompt!r}: transformers {len(ids)} tokens, rlhf "
                       f"{rec['prompt_tokens']}")
            continue
        if not comp:
            continue
        x = torch.tensor([ids + comp])
        with torch.no_grad():
            logits = model(input_ids=x, use_cache=False).logits[0].to(torch.float64)
        lp = torch.log_softmax(logits, dim=-1)
        got = [lp[len(ids) - 1 + i, t].item() for i, t in enumerate(comp)]
        diff = max(abs(a - b) for a, b in zip(got, rec["logprobs"]))
        worst = max(worst, diff)
        n_tok += len(comp)
        if not diff <= tol:
            bad.append(f"prompt {prompt!r}: max |dlogprob| {diff:.3e}")
        text = tok.decode(comp, skip_special_tokens=True, clean_up_tokenization_spaces=False)
        if text != rec["completion"]:
            bad.append(f"prompt {prompt!r}: decode {text!r} vs rlhf {rec['completion']!r}")
    ok = not bad and len(recs) == len(prompts)
    for b in bad:
        print(f"check_hf_export:   {b}")
    print(f"check_hf_export: {'OK' if ok else 'FAIL'} {type(tok).__name__} + "
          f"{type(model).__name__}: {len(recs)} prompts, same token counts, {n_tok} completion "
          f"tokens, max |dlogprob| {worst:.3e} (tol {tol:.0e}) {where}")
    return OK if ok else MISMATCH


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, help="Hugging Face model folder (config.json, ...)")
    ap.add_argument("--fixture", help="tests/fixtures/*.h5 with /logits")
    ap.add_argument("--rlhf", help="rlhf binary: check tokenizer and log-probs against it")
    ap.add_argument("--source", help="with --rlhf: the model DIR was exported from")
    ap.add_argument("--max-new", type=int, default=8,
                    help="with --rlhf: completion tokens per prompt (default 8)")
    ap.add_argument("--tol", type=float, default=1e-4,
                    help="max |dlogits| / max |logit| allowed (default 1e-4)")
    ap.add_argument("--write-reference", action="store_true",
                    help="write the fixture's params to --model with save_pretrained instead")
    args = ap.parse_args(argv)  # exits 2 on a usage error
    if args.rlhf:
        if not os.path.isfile(os.path.join(args.model, "config.json")):
            return usage_error(f"{args.model} is not a Hugging Face model folder (no config.json)")
        if not os.path.exists(args.rlhf):
            return usage_error(f"no rlhf binary {args.rlhf}")
        try:
            import torch
            import transformers
        except ImportError as e:
            return usage_error(f"{e}: run it with a Python that has torch and transformers")
        transformers.logging.set_verbosity_error()
        torch.set_num_threads(2)
        tol = args.tol if args.tol != 1e-4 else 1e-3  # rlhf computes in float32
        return check_against_rlhf(args.model, args.rlhf, args.source or args.model, tol,
                                  args.max_new)
    if not args.fixture:
        return usage_error("--fixture (or --rlhf) is required")
    if not os.path.isfile(args.fixture):
        return usage_error(f"no fixture file {args.fixture}")
    if not (args.tol >= 0):
        return usage_error(f"--tol must be >= 0, got {args.tol}")
    if not args.write_reference and not os.path.isfile(os.path.join(args.model, "config.json")):
        return usage_error(f"{args.model} is not a Hugging Face model folder (no config.json)")
    try:
        import h5py  # noqa: F401
        import torch
        import transformers
    except ImportError as e:
        return usage_error(f"{e}: run it with a Python that has torch, transformers and h5py "
                           "(tests/fixtures/README.md)")
    transformers.logging.set_verbosity_error()
    torch.set_num_threads(1)
    fixture = read_fixture(args.fixture)
    if fixture is None:
        return usage_error(f"{args.fixture} has no /logits (value-head fixtures are not supported)")
    if args.write_reference:
        return write_reference(args.model, fixture)
    return check(args.model, args.fixture, fixture, args.tol)


if __name__ == "__main__":
    sys.exit(main())
