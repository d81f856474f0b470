#!/usr/bin/env python3
"""PEFT / transformers reference fixture for LoRA on a sequence-classification model (a reward
model or a PPO critic): PEFT's task_type SEQ_CLS adapts the trunk's projections and trains the
score head fully (modules_to_save = ["classifier", "score"]; in memory the trained copy is
`base_model.model.score.modules_to_save.default.weight`, save_pretrained writes it as
`base_model.model.score.weight`).

Writes
  tests/fixtures/lora/lora_llama_seqcls.h5      the base model and the adapted model's reference
  tests/fixtures/lora/lora_llama_seqcls_peft/   the same adapter + score head as PEFT saves it
Layout: as tests/fixtures/lora/README.md (scripts/make_lora_fixtures.py) with per-token values in
place of log-probs: `/value_r` (B, T), `/values` (base), `/lora/values`, `/lora/loss`,
`/lora/grads/<adapter names and score.weight>`, `/lora/train/...` (5 AdamW steps on the adapter
and the score head), `/lora/score_init` (the score head the adapter starts from = the base's).
The loss is value: Σ values · value_r / (B·T), as scripts/make_fixtures.py's value fixtures.

The reference is PEFT's LoRA layers around transformers' LlamaForSequenceClassification (the
per-token scores score(hidden) (B, T) that the class pools at the last token), float64. Every file
is read back and re-derived by an own float64 model on merged weights with an own AdamW.

Usage (same virtual environment as make_lora_fixtures.py):
    /work/venvs/lora/bin/python scripts/make_lora_seqcls_fixtures.py               # write+check
    /work/venvs/lora/bin/python scripts/make_lora_seqcls_fixtures.py --check-only  # only check
"""

import argparse
import json
import math
import os
import shutil
import sys

import h5py
import numpy as np
import torch

import peft
import transformers
from peft import LoraConfig, get_peft_model
from safetensors.torch import load_file
from transformers import LlamaForSequenceClassification

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_fixtures as mf  # noqa: E402
import make_arch_fixtures as mfa  # noqa: E402
import make_lora_fixtures as mlf  # noqa: E402

GENERATOR = "scripts/make_lora_seqcls_fixtures.py"
GENERATOR_VERSION = "1"
F64 = torch.float64
TRAIN = mf.TRAIN
SPEC = dict(name="lora_llama_seqcls", model_type="llama", tie_word_embeddings=False,
            rope_theta=10000.0, rms_norm_eps=1e-5, head_dim=16, attention_bias=False,
            rope_scaling=None, qk_norm_range=None, r=4, lora_alpha=8,
            target_modules=["q_proj", "v_proj", "o_proj", "up_proj", "down_proj"])


def seqcls_model(model32, gen):
    """LlamaForSequenceClassification (num_labels 1) with model32's trunk and a random score head
    N(0, 0.1^2) rounded to bfloat16 (float32)."""
    cfg = transformers.LlamaConfig.from_dict(model32.config.to_dict())
    cfg.num_labels = 1
    cfg._attn_implementation = "eager"
    m = LlamaForSequenceClassification(cfg)
    m.model.load_state_dict(model32.model.state_dict())
    with torch.no_grad():
        s = 0.1 * torch.randn(m.score.weight.shape, generator=gen, dtype=F64)
        m.score.weight.copy_(s.to(torch.bfloat16).to(torch.float32))
    m.eval()
    return m


def lora_config(spec):
    return LoraConfig(r=spec["r"], lora_alpha=spec["lora_alpha"],
                      target_modules=list(spec["target_modules"]), lora_dropout=0.0, bias="none",
                      task_type="SEQ_CLS")


@torch.no_grad()
def peft_wrap(model, spec, adapter, dtype):
    """PEFT's SEQ_CLS LoRA around `model` (modified in place), its adapter set to `adapter`; the
    score head's trained copy starts as the base's (PEFT's own copy)."""
    pm = get_peft_model(model, lora_config(spec)).to(dtype)
    mods = dict(pm.base_model.model.named_modules())
    for m in mlf.module_names(spec):
        mods[m].lora_A["default"].weight.copy_(adapter[m + ".lora_A.weight"])
        mods[m].lora_B["default"].weight.copy_(adapter[m + ".lora_B.weight"])
    return pm


def trained_params(pm):
    """{rlhf/PEFT-file name: parameter}: the adapters and the score head's trained copy."""
    out = {}
    for n, p in pm.base_model.model.named_parameters():
        if ".lora_" in n:
            out[n.replace(".default.weight", ".weight")] = p
        elif n == "score.modules_to_save.default.weight":
            out["score.weight"] = p
    assert {n for n, p in pm.named_parameters() if p.requires_grad} == {
        n for n, p in pm.named_parameters() if p.requires_grad and (
            ".lora_" in n or "modules_to_save" in n)}
    return out


def values_of(inner, ids):
    """Per-token scores (B, T): score(final-normed hidden)[..., 0], no attention_mask."""
    return mf.hf_head_output(inner, {"head": "value"}, ids)


def value_loss(values, value_r):
    return (values * value_r).sum() / values.numel()


def train(pm, ids, value_r):
    params = trained_params(pm)
    opt = torch.optim.AdamW(list(params.values()), lr=TRAIN["lr"],
                            betas=(TRAIN["beta1"], TRAIN["beta2"]), eps=TRAIN["eps"],
                            weight_decay=TRAIN["weight_decay"], foreach=False)
    inner = pm.base_model.model
    losses, norms = [], []
    for _ in range(TRAIN["steps"]):
        opt.zero_grad(set_to_none=True)
        loss = value_loss(values_of(inner, ids), value_r)
        loss.backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(list(params.values()),
                                                          TRAIN["max_norm"])))
        opt.step()
        losses.append(loss.item())
    with torch.no_grad():
        final_loss = value_loss(values_of(inner, ids), value_r)
    return losses, norms, float(final_loss), {n: p.detach().clone() for n, p in params.items()}


def generate(spec, out_dir):
    gen = torch.Generator().manual_seed(mf.SEED + 7)
    model32 = mfa.build_model(spec)
    mfa.init_params(model32, spec, gen)
    ids, _ = mf.make_inputs(gen)
    value_r = torch.randn(ids.shape, generator=gen, dtype=F64).to(torch.float32).to(F64)
    adapter = mlf.random_adapter(model32, spec, gen)
    sc32 = seqcls_model(model32, gen)
    cfg_json = mfa.config_json(spec, model32)
    cfg_json["head"] = "reward"
    params = {n: p.detach().clone().to(F64) for n, p in sc32.named_parameters()}

    base = mfa.clone_model(sc32).to(F64)
    with mfa.f64_patches(), torch.no_grad():
        base_values = values_of(base, ids)

    pm = peft_wrap(mfa.clone_model(sc32), spec, adapter, F64)
    inner = pm.base_model.model
    with mfa.f64_patches():
        values = values_of(inner, ids)
        loss = value_loss(values, value_r)
        loss.backward()
        grads = {n: p.grad.detach().clone() for n, p in trained_params(pm).items()}
    assert set(grads) == set(adapter) | {"score.weight"}
    dev = (values - base_values).abs().max().item()
    print(f"  {spec['name']}: max |values(adapted) - values(base)| {dev:.3e}, loss "
          f"{loss.item():.6f}")
    assert dev > 1e-3, "the adapter barely changes the model: the fixture would not test it"
    with mfa.f64_patches():
        tr_pm = peft_wrap(mfa.clone_model(sc32), spec, adapter, F64)
        losses, norms, final_loss, final = train(tr_pm, ids, value_r)
    moved = (final["score.weight"] - params["score.weight"]).abs().max().item()
    assert moved > 1e-3, "the score head did not train"

    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, spec["name"] + ".h5")
    tmp = path + ".tmp"
    with mf.create_h5(tmp) as f:
        a = f.attrs
        a["generator"] = GENERATOR
        a["generator_version"] = GENERATOR_VERSION
        a["torch_version"] = str(torch.__version__)
        a["transformers_version"] = str(transformers.__version__)
        a["peft_version"] = str(peft.__version__)
        a["seed"] = np.int64(mf.SEED + 7)
        a["config"] = json.dumps(cfg_json)
        a["head"] = "reward"
        a["reference"] = ("peft.get_peft_model(LoraConfig(task_type='SEQ_CLS')) around "
                          "transformers LlamaForSequenceClassification in float64; per-token "
                          "scores score(hidden), no attention_mask, positions 0..T-1")
        a["loss_definition"] = "value: loss = sum(values * value_r) / (B*T)"
        mf.put(f, "input_ids", ids.numpy().astype(np.int32))
        mf.put(f, "value_r", mf.f32(value_r))
        mf.put(f, "values", mf.f32(base_values))
        gp = mf.group(f, "params")
        for n, p in params.items():
            mf.put(gp, n, mf.f32(p))
        g = mf.group(f, "lora")
        g.attrs["r"] = np.int64(spec["r"])
        g.attrs["lora_alpha"] = np.float64(spec["lora_alpha"])
        g.attrs["target_modules"] = ",".join(spec["target_modules"])
        g.attrs["modules_to_save"] = "score"
        ga, gg = mf.group(g, "adapter"), mf.group(g, "grads")
        for n in sorted(adapter):
            mf.put(ga, n, mf.f32(adapter[n]))
        for n in sorted(grads):
            mf.put(gg, n, mf.f32(grads[n]))
        mf.put(g, "values", mf.f32(values))
        mf.put(g, "loss", np.float32(loss.item()))
        g["loss"].attrs["float64_value"] = np.float64(loss.item())
        gt = mf.group(g, "train")
        gt.attrs["optimizer"] = ("torch.optim.AdamW(foreach=False) over the adapters and the score "
                                 "head's trained copy (all decayed); the base frozen")
        for k, v in TRAIN.items():
            gt.attrs[k] = v
        mf.put(gt, "losses", np.asarray(losses, dtype=np.float32))
        mf.put(gt, "grad_norms", np.asarray(norms, dtype=np.float32))
        mf.put(gt, "final_loss", np.float32(final_loss))
        gf = mf.group(gt, "final")
        for n in sorted(final):
            mf.put(gf, n, mf.f32(final[n]))
    os.replace(tmp, path)
    print(f"  wrote {path} ({os.path.getsize(path) / 1024:.0f} KiB)")

    adir = os.path.join(out_dir, spec["name"] + "_peft")
    if os.path.isdir(adir):
        shutil.rmtree(adir)
    pm32 = peft_wrap(mfa.clone_model(sc32), spec, adapter, torch.float32)
    pm32.save_pretrained(adir)
    os.remove(os.path.join(adir, "README.md"))
    cpath = os.path.join(adir, "adapter_config.json")
    with open(cpath) as fh:
        acfg = json.load(fh)
    acfg["target_modules"] = sorted(acfg["target_modules"])
    acfg["modules_to_save"] = sorted(acfg["modules_to_save"])
    with open(cpath, "w") as fh:
        json.dump(acfg, fh, indent=2, sort_keys=True)
        fh.write("\n")
    print(f"  wrote {adir}/ ({', '.join(sorted(os.listdir(adir)))})")


def own_values(P, T, cfg, spec, ids):
    """Own float64 model on merged weights W + s·B·A, the score head from T["score.weight"];
    differentiable in T (adapters and score head)."""
    s = spec["lora_alpha"] / spec["r"]
    Q = dict(P)
    for m in mlf.module_names(spec):
        Q[m + ".weight"] = P[m + ".weight"] + s * T[m + ".lora_B.weight"] @ T[m + ".lora_A.weight"]
    Q["lm_head.weight"] = T["score.weight"]
    return mfa.own_forward(Q, dict(cfg, tie_word_embeddings=False), ids, F64)[..., 0]


def own_train(P, T0, cfg, spec, ids, value_r):
    A = {n: t.clone().requires_grad_(True) for n, t in T0.items()}
    m = {n: torch.zeros_like(t) for n, t in A.items()}
    v = {n: torch.zeros_like(t) for n, t in A.items()}
    lr, b1, b2, eps = TRAIN["lr"], TRAIN["beta1"], TRAIN["beta2"], TRAIN["eps"]
    losses = []
    for step in range(1, TRAIN["steps"] + 1):
        for t in A.values():
            t.grad = None
        loss = value_loss(own_values(P, A, cfg, spec, ids), value_r)
        loss.backward()
        with torch.no_grad():
            total = math.sqrt(sum(float((t.grad ** 2).sum()) for t in A.values()))
            coef = min(TRAIN["max_norm"] / (total + 1e-6), 1.0)
            for n, p in A.items():
                gr = p.grad * coef
                p.mul_(1 - lr * TRAIN["weight_decay"])
                m[n] = b1 * m[n] + (1 - b1) * gr
                v[n] = b2 * v[n] + (1 - b2) * gr * gr
                p.sub_(lr / (1 - b1 ** step) * m[n] / (v[n].sqrt() / math.sqrt(1 - b2 ** step)
                                                       + eps))
        losses.append(loss.item())
    return losses, {n: t.detach() for n, t in A.items()}


def check(spec, out_dir):
    path = os.path.join(out_dir, spec["name"] + ".h5")
    with h5py.File(path, "r") as f:
        cfg = json.loads(f.attrs["config"])
        ids = torch.from_numpy(f["input_ids"][...].astype(np.int64))
        value_r = torch.from_numpy(f["value_r"][...]).to(F64)
        P = {n: torch.from_numpy(f["params/" + n][...]).to(F64) for n in f["params"]}
        g = f["lora"]
        T0 = {n: torch.from_numpy(g["adapter/" + n][...]).to(F64) for n in g["adapter"]}
        T0["score.weight"] = P["score.weight"]
        G = {n: torch.from_numpy(g["grads/" + n][...]) for n in g["grads"]}
        vals = torch.from_numpy(g["values"][...])
        base_vals = torch.from_numpy(f["values"][...])
        losses_ref = [float(x) for x in g["train/losses"][...]]
        final_ref = {n: torch.from_numpy(g["train/final/" + n][...]) for n in g["train/final"]}
    A = {n: t.clone().requires_grad_(True) for n, t in T0.items()}
    out = own_values(P, A, cfg, spec, ids)
    value_loss(out, value_r).backward()
    with torch.no_grad():
        off = own_values(P, dict(T0, **{n: 0 * t for n, t in T0.items() if ".lora_B" in n}),
                         cfg, spec, ids)
    worst = {"values": mf.rel_max(out.detach(), vals),
             "base_values": mf.rel_max(off, base_vals),
             "grads": max(mf.rel_max(A[n].grad, G[n]) for n in G)}
    assert set(G) == set(T0)
    for k, e in worst.items():
        assert e < 1e-6, f"{path}: {k} disagrees with the independent re-derivation ({e:.2e})"
    losses, final = own_train(P, T0, cfg, spec, ids, value_r)
    dl = max(abs(a - b) for a, b in zip(losses, losses_ref))
    dw = max((final[n] - final_ref[n].to(F64)).abs().max().item() for n in final)
    assert dl < 1e-6 and dw < 1e-5, f"{path}: training trajectory differs ({dl:.1e}, {dw:.1e})"
    print(f"  check {os.path.basename(path)}: own fp64 model vs file (rel max): "
          + ", ".join(f"{k} {e:.1e}" for k, e in worst.items())
          + f"; own AdamW x{TRAIN['steps']}: max |dloss| {dl:.1e}, max |dw| {dw:.1e}")
    adir = os.path.join(out_dir, spec["name"] + "_peft")
    with open(os.path.join(adir, "adapter_config.json")) as fh:
        acfg = json.load(fh)
    assert acfg["task_type"] == "SEQ_CLS" and "score" in acfg["modules_to_save"]
    st = load_file(os.path.join(adir, "adapter_model.safetensors"))
    assert set(st) == {"base_model.model." + n for n in T0}, sorted(st)
    for n, t in T0.items():
        assert torch.equal(st["base_model.model." + n].to(F64), t), n
    print(f"  check {os.path.basename(adir)}/: {len(st)} tensors (score head as "
          "base_model.model.score.weight), values equal")


README = """# tests/fixtures/lora/lora_llama_seqcls* — PEFT reference for LoRA on a sequence classifier

Written by `scripts/make_lora_seqcls_fixtures.py` (generator_version {gv}; torch {tv},
transformers {trv}, peft {pv}) in the virtual environment of `scripts/make_lora_fixtures.py`:

```
/work/venvs/lora/bin/python scripts/make_lora_seqcls_fixtures.py               # writes and re-checks
/work/venvs/lora/bin/python scripts/make_lora_seqcls_fixtures.py --check-only  # only re-checks
/work/venvs/lora/bin/python scripts/make_lora_seqcls_fixtures.py --check-adapter DIR
```

A Llama `LlamaForSequenceClassification` (num_labels 1; 2 layers, hidden 64) under PEFT's
`LoraConfig(task_type="SEQ_CLS", r={r}, lora_alpha={alpha}, target_modules={targets})`: the
projections get adapters and the score head trains fully (`modules_to_save`; in memory
`base_model.model.score.modules_to_save.default.weight`, in `adapter_model.safetensors`
`base_model.model.score.weight`).

`lora_llama_seqcls.h5`: `/input_ids`, `/value_r` (B, T), `/params/<HF name>` (the base, with its
`score.weight`), `/values` (the base's per-token scores score(hidden)), and `/lora`: `adapter/`
(A, B; B != 0), `values` and `loss` = sum(values * value_r) / (B*T) of the adapted model,
`grads/` (A, B and `score.weight`), `train/` ({steps} AdamW steps over the adapters and the score
head with clip_grad_norm_, as make_lora_fixtures.py: `losses`, `grad_norms`, `final/`).
`lora_llama_seqcls_peft/`: the same adapter and score head as `save_pretrained` writes them.
Float64 reference, stored float32, re-derived by an own float64 model within 1e-6.

`--check-adapter DIR` loads DIR with `PeftModel.from_pretrained` onto the fixture's base and
compares its per-token values with `/lora/values` (exit 1 on a mismatch).
"""


def check_adapter(adir, out_dir):
    """PEFT loads `adir` onto the fixture's base; its values must equal /lora/values."""
    spec = SPEC
    path = os.path.join(out_dir, spec["name"] + ".h5")
    with h5py.File(path, "r") as f:
        ids = torch.from_numpy(f["input_ids"][...].astype(np.int64))
        P = {n: torch.from_numpy(f["params/" + n][...]) for n in f["params"]}
        want = torch.from_numpy(f["lora/values"][...]).to(F64)
    gen = torch.Generator().manual_seed(0)
    model32 = mfa.build_model(spec)
    sc = seqcls_model(model32, gen)
    sc.load_state_dict(P, strict=True)
    pm = peft.PeftModel.from_pretrained(sc.to(F64), adir).to(F64)
    with mfa.f64_patches(), torch.no_grad():
        got = values_of(pm.base_model.model, ids)
    err = (got - want).abs().max().item() / want.abs().max().item()
    print(f"  PEFT loads {adir}: values vs /lora/values rel max {err:.1e}")
    return err < 1e-5


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "tests",
                                                  "fixtures", "lora"))
    ap.add_argument("--check-only", action="store_true", help="only re-check existing files")
    ap.add_argument("--check-adapter", metavar="DIR",
                    help="have PEFT load adapter folder DIR and compare with /lora/values")
    args = ap.parse_args()
    torch.set_num_threads(1)
    if args.check_adapter:
        sys.exit(0 if check_adapter(args.check_adapter, args.out) else 1)
    print(SPEC["name"])
    if not args.check_only:
        generate(SPEC, args.out)
        with open(os.path.join(args.out, "README_seqcls.md"), "w") as fh:
            fh.write(README.format(gv=GENERATOR_VERSION, tv=torch.__version__,
                                   trv=transformers.__version__, pv=peft.__version__,
                                   r=SPEC["r"], alpha=SPEC["lora_alpha"],
                                   targets=SPEC["target_modules"], steps=TRAIN["steps"]))
    check(SPEC, args.out)


if __name__ == "__main__":
    main()
