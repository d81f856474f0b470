#!/usr/bin/env python3
"""PEFT / transformers reference fixtures for LoRA adapters (Hu et al. 2021, "LoRA: Low-Rank
Adaptation of Large Language Models", eq. 3: h = W0 x + (alpha / r) B A x).

Writes, for a tiny Llama (all seven linear projections adapted) and a tiny Qwen2 (q_proj, v_proj
and down_proj only, q/k/v biases present):
  tests/fixtures/lora/lora_{llama,qwen2}.h5      the base model and the adapted model's reference
  tests/fixtures/lora/lora_{llama,qwen2}_peft/   the same adapter as PEFT saves it
                                                 (adapter_config.json + adapter_model.safetensors)
Layout of the .h5 files: see tests/fixtures/lora/README.md (written by this script).

The reference is PEFT's own LoRA layers (peft.get_peft_model with a LoraConfig) around
transformers' LlamaForCausalLM / Qwen2ForCausalLM, run in float64 with the float64 patches of
make_arch_fixtures.py. The adapter is random with B != 0 (PEFT initialises B to zero, which would
make the adapted model equal the base and the gradient of A zero). Every file is read back and
re-derived by an independent, plainly written float64 model (make_arch_fixtures.own_forward on
merged weights W + (alpha/r) B A, differentiated by autograd through the merge) and an own AdamW.

Usage:
    python3 -m venv /work/venvs/lora   # any path outside the repository
    /work/venvs/lora/bin/pip install torch 'transformers<5' peft h5py numpy safetensors
    /work/venvs/lora/bin/python scripts/make_lora_fixtures.py               # writes and re-checks
    /work/venvs/lora/bin/python scripts/make_lora_fixtures.py --check-only  # only re-checks
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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_fixtures as mf  # noqa: E402  (inputs, loss, HDF5 writing)
import make_arch_fixtures as mfa  # noqa: E402  (model builder, float64 patches, own_forward)

GENERATOR = "scripts/make_lora_fixtures.py"
GENERATOR_VERSION = "1"
SEED = mf.SEED
F64 = torch.float64
TRAIN = mf.TRAIN
ALL_LINEAR = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]

SPECS = [
    dict(name="lora_llama", model_type="llama", tie_word_embeddings=False, rope_theta=10000.0,
         rms_norm_eps=1e-5, head_dim=16, attention_bias=False, rope_scaling=None,
         qk_norm_range=None, r=4, lora_alpha=8, target_modules=ALL_LINEAR),
    dict(name="lora_qwen2", model_type="qwen2", tie_word_embeddings=False, rope_theta=1e6,
         rms_norm_eps=1e-6, head_dim=16, attention_bias=False, rope_scaling=None,
         qk_norm_range=None, r=2, lora_alpha=16, target_modules=["q_proj", "v_proj", "down_proj"]),
]


def block(proj):
    return "mlp" if proj in ("gate_proj", "up_proj", "down_proj") else "self_attn"


def module_names(spec):
    """HF module paths of the adapted linears, layer-major then in ALL_LINEAR order."""
    return [f"model.layers.{i}.{block(p)}.{p}" for i in range(mf.DIMS["num_hidden_layers"])
            for p in ALL_LINEAR if p in spec["target_modules"]]


@torch.no_grad()
def random_adapter(model, spec, gen):
    """A (r, in) ~ U(-1/sqrt(in), 1/sqrt(in)) (the bound of PEFT's kaiming_uniform_(a=sqrt(5))
    init), B (out, r) ~ N(0, 0.05^2); every value rounded to bfloat16 (exact in fp32 and bf16).
    Returns {module path + ".lora_A.weight" / ".lora_B.weight": float64 tensor}."""
    mods = dict(model.named_modules())
    out = {}
    for m in module_names(spec):
        lin = mods[m]
        fan_in, fan_out, r = lin.in_features, lin.out_features, spec["r"]
        bound = 1.0 / math.sqrt(fan_in)
        a = bound * (2.0 * torch.rand((r, fan_in), generator=gen, dtype=F64) - 1.0)
        b = 0.05 * torch.randn((fan_out, r), generator=gen, dtype=F64)
        out[m + ".lora_A.weight"] = a.to(torch.bfloat16).to(F64)
        out[m + ".lora_B.weight"] = b.to(torch.bfloat16).to(F64)
    return out


def lora_config(spec):
    return LoraConfig(r=spec["r"], lora_alpha=spec["lora_alpha"],
                      target_modules=list(spec["target_modules"]), lora_dropout=0.0, bias="none",
                      task_type="CAUSAL_LM")


@torch.no_grad()
def peft_wrap(model, spec, adapter, dtype):
    """PEFT's LoRA around `model` (modified in place), its adapter set to `adapter`."""
    pm = get_peft_model(model, lora_config(spec)).to(dtype)
    mods = dict(pm.base_model.model.named_modules())
    for m in module_names(spec):
        mods[m].lora_A["default"].weight.copy_(adapter[m + ".lora_A.weight"])
        mods[m].lora_B["default"].weight.copy_(adapter[m + ".lora_B.weight"])
    return pm


def adapter_params(pm):
    """{HF-style name "model.layers.0.self_attn.q_proj.lora_A.weight": parameter}."""
    out = {}
    for n, p in pm.base_model.model.named_parameters():
        if ".lora_" in n:
            out[n.replace(".default.weight", ".weight")] = p
    return out


def train_adapter(pm, ids, targets):
    """TRAIN["steps"] AdamW steps on the adapter only (every adapter tensor decayed, as its names
    match none of make_fixtures.NO_DECAY), clip_grad_norm_ over the adapter before each step."""
    params = adapter_params(pm)
    opt = torch.optim.AdamW(list(params.values()), lr=TRAIN["lr"],
                            betas=(TRAIN["beta1"], TRAIN["beta2"]), eps=TRAIN["eps"],
                            weight_decay=TRAIN["weight_decay"], foreach=False)
    inner = pm.base_model.model
    losses, norms = [], []
    for _ in range(TRAIN["steps"]):
        opt.zero_grad(set_to_none=True)
        loss, _ = mf.lm_loss(mfa.head_logits(inner, ids), targets)
        loss.backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(list(params.values()),
                                                          TRAIN["max_norm"])))
        opt.step()
        losses.append(loss.item())
    with torch.no_grad():
        final_loss, _ = mf.lm_loss(mfa.head_logits(inner, ids), targets)
    return losses, norms, float(final_loss), {n: p.detach().clone() for n, p in params.items()}


def merged_weights(params, adapter, spec):
    """{module path + ".weight": W + (alpha/r) B A} for every adapted module (float64)."""
    s = spec["lora_alpha"] / spec["r"]
    return {m + ".weight": params[m + ".weight"] + s * adapter[m + ".lora_B.weight"]
            @ adapter[m + ".lora_A.weight"] for m in module_names(spec)}


def generate(spec, out_dir):
    gen = torch.Generator().manual_seed(SEED)
    model32 = mfa.build_model(spec)
    mfa.init_params(model32, spec, gen)
    ids, targets = mf.make_inputs(gen)
    adapter = random_adapter(model32, spec, gen)
    cfg_json = mfa.config_json(spec, model32)
    params = {n: p.detach().clone().to(F64) for n, p in model32.named_parameters()}

    base = mfa.clone_model(model32).to(F64)
    with mfa.f64_patches(), torch.no_grad():
        base_logits = mfa.head_logits(base, ids)
        base_loss, base_lp = mf.lm_loss(base_logits, targets)

    pm = peft_wrap(mfa.clone_model(model32), spec, adapter, F64)
    inner = pm.base_model.model
    assert all(not p.requires_grad for n, p in inner.named_parameters() if ".lora_" not in n)
    with mfa.f64_patches():
        logits = mfa.head_logits(inner, ids)
        loss, lp = mf.lm_loss(logits, targets)
        loss.backward()
        grads = {n: p.grad.detach().clone() for n, p in adapter_params(pm).items()}
        with pm.disable_adapter(), torch.no_grad():
            ref_logits = mfa.head_logits(inner, ids)
            _, ref_lp = mf.lm_loss(ref_logits, targets)
    assert set(grads) == set(adapter)
    assert (ref_logits - base_logits).abs().max().item() == 0.0, "disable_adapter != base model"
    dev = (logits - base_logits).abs().max().item()
    print(f"  {spec['name']}: max |logits(adapted) - logits(base)| {dev:.3e}, loss "
          f"{loss.item():.6f} (base {base_loss.item():.6f})")
    assert dev > 1e-3, "the adapter barely changes the model: the fixture would not test it"

    # PEFT's own merge agrees with W + s B A.
    merged = merged_weights(params, adapter, spec)
    with torch.no_grad():
        pm_merge = peft_wrap(mfa.clone_model(model32), spec, adapter, F64).merge_and_unload()
        mm = dict(pm_merge.named_parameters())
        em = max((mm[n] - w).abs().max().item() for n, w in merged.items())
    print(f"  PEFT merge_and_unload vs W + s·B·A: max |dW| {em:.1e}")
    assert em < 1e-15

    with mfa.f64_patches():
        tr_pm = peft_wrap(mfa.clone_model(model32), spec, adapter, F64)
        losses, norms, final_loss, final = train_adapter(tr_pm, ids, targets)

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
        a["h5py_version"] = str(h5py.__version__)
        a["seed"] = np.int64(SEED)
        a["config"] = json.dumps(cfg_json)
        a["head"] = "lm"
        a["rope_style"] = "rotate_half"
        a["reference"] = ("peft.get_peft_model(LoraConfig) around transformers "
                          f"{model32.__class__.__name__} in float64 (RMSNorm, RoPE and softmax "
                          "kept in float64), eager attention, no attention_mask (plain causal "
                          "over all T), position ids 0..T-1")
        a["loss_definition"] = "lm: loss = -sum(lp) / count(targets >= 0) (token-level mean)"
        mf.put(f, "input_ids", ids.numpy().astype(np.int32))
        mf.put(f, "targets", targets.numpy().astype(np.int32))
        mf.put(f, "logits", mf.f32(base_logits))
        mf.put(f, "lp", mf.f32(base_lp))
        mf.put(f, "loss", np.float32(base_loss.item()))
        gp = mf.group(f, "params")
        for n, p in params.items():
            mf.put(gp, n, mf.f32(p))
        g = mf.group(f, "lora")
        g.attrs["r"] = np.int64(spec["r"])
        g.attrs["lora_alpha"] = np.float64(spec["lora_alpha"])
        g.attrs["scaling"] = np.float64(spec["lora_alpha"] / spec["r"])
        g.attrs["target_modules"] = ",".join(spec["target_modules"])
        g.attrs["lora_dropout"] = np.float64(0.0)
        g.attrs["init"] = ("A (r,in) U(-1/sqrt(in), 1/sqrt(in)), B (out,r) N(0, 0.05^2), both "
                           "rounded to bfloat16 (B != 0 on purpose)")
        ga, gg, gm = mf.group(g, "adapter"), mf.group(g, "grads"), mf.group(g, "merged")
        for n in sorted(adapter):
            mf.put(ga, n, mf.f32(adapter[n]))
            mf.put(gg, n, mf.f32(grads[n]))
        for n in sorted(merged):
            mf.put(gm, n, mf.f32(merged[n]))
        mf.put(g, "logits", mf.f32(logits))
        mf.put(g, "lp", mf.f32(lp))
        mf.put(g, "loss", np.float32(loss.item()))
        g["loss"].attrs["float64_value"] = np.float64(loss.item())
        mf.put(g, "ref_lp", mf.f32(ref_lp))
        gt = mf.group(g, "train")
        gt.attrs["optimizer"] = ("torch.optim.AdamW(foreach=False) over the adapter tensors only "
                                 "(all with weight_decay); the base frozen")
        gt.attrs["clip"] = "torch.nn.utils.clip_grad_norm_(adapter, max_norm) before each step"
        gt.attrs["dtype"] = "float64 (model, gradients, optimizer state); stored as float32"
        gt.attrs["schedule"] = "constant lr"
        for k, v in TRAIN.items():
            gt.attrs[k] = v
        mf.put(gt, "losses", np.asarray(losses, dtype=np.float32))
        gt["losses"].attrs["float64_values"] = np.asarray(losses, dtype=np.float64)
        mf.put(gt, "grad_norms", np.asarray(norms, dtype=np.float32))
        mf.put(gt, "final_loss", np.float32(final_loss))
        gf = mf.group(gt, "final")
        for n in sorted(final):
            mf.put(gf, n, mf.f32(final[n]))
    os.replace(tmp, path)
    print(f"  wrote {path} ({os.path.getsize(path) / 1024:.0f} KiB)")

    # The same adapter as PEFT saves it (float32; every value is exact in fp32).
    adir = os.path.join(out_dir, spec["name"] + "_peft")
    if os.path.isdir(adir):
        shutil.rmtree(adir)
    pm32 = peft_wrap(mfa.clone_model(model32), spec, adapter, torch.float32)
    pm32.save_pretrained(adir)
    os.remove(os.path.join(adir, "README.md"))  # PEFT's model-card template, not ours
    cpath = os.path.join(adir, "adapter_config.json")  # target_modules is a set: sort it
    with open(cpath) as fh:
        acfg = json.load(fh)
    acfg["target_modules"] = sorted(acfg["target_modules"])
    with open(cpath, "w") as fh:
        json.dump(acfg, fh, indent=2, sort_keys=True)
        fh.write("\n")
    print(f"  wrote {adir}/ ({', '.join(sorted(os.listdir(adir)))})")


# ---------------------------------------------------------------------------------------------
# Independent check: own float64 model on merged weights, own AdamW

def own_adapted_logits(P, adapter, cfg, spec, ids):
    """own_forward on W + s·B·A; differentiable in the adapter tensors."""
    s = spec["lora_alpha"] / spec["r"]
    Q = dict(P)
    for m in module_names(spec):
        Q[m + ".weight"] = P[m + ".weight"] + s * adapter[m + ".lora_B.weight"] @ \
            adapter[m + ".lora_A.weight"]
    return mfa.own_forward(Q, cfg, ids, F64)


def own_train_adapter(P, adapter, cfg, spec, ids, targets):
    """Own AdamW (PyTorch's form: decoupled decay, bias-corrected moments) and own clip."""
    A = {n: t.clone().requires_grad_(True) for n, t in adapter.items()}
    m = {n: torch.zeros_like(t) for n, t in A.items()}
    v = {n: torch.zeros_like(t) for n, t in A.items()}
    lr, b1, b2, eps = TRAIN["lr"], TRAIN["beta1"], TRAIN["beta2"], TRAIN["eps"]
    losses, norms = [], []
    for step in range(1, TRAIN["steps"] + 1):
        for t in A.values():
            t.grad = None
        loss, _ = mf.lm_loss(own_adapted_logits(P, A, cfg, spec, ids), targets)
        loss.backward()
        with torch.no_grad():
            total = math.sqrt(sum(float((t.grad ** 2).sum()) for t in A.values()))
            coef = min(TRAIN["max_norm"] / (total + 1e-6), 1.0)
            for n, p in A.items():
                gr = p.grad * coef
                p.mul_(1 - lr * TRAIN["weight_decay"])
                m[n] = b1 * m[n] + (1 - b1) * gr
                v[n] = b2 * v[n] + (1 - b2) * gr * gr
                denom = v[n].sqrt() / math.sqrt(1 - b2 ** step) + eps
                p.sub_(lr / (1 - b1 ** step) * m[n] / denom)
        losses.append(loss.item())
        norms.append(total)
    with torch.no_grad():
        final_loss, _ = mf.lm_loss(own_adapted_logits(P, A, cfg, spec, ids), targets)
    return losses, norms, float(final_loss), {n: t.detach() for n, t in A.items()}


def check(spec, out_dir):
    path = os.path.join(out_dir, spec["name"] + ".h5")
    with h5py.File(path, "r") as f:
        cfg = json.loads(f.attrs["config"])
        ids = torch.from_numpy(f["input_ids"][...].astype(np.int64))
        targets = torch.from_numpy(f["targets"][...].astype(np.int64))
        P = {n: torch.from_numpy(f["params/" + n][...]).to(F64) for n in f["params"]}
        g = f["lora"]
        assert int(g.attrs["r"]) == spec["r"] and g.attrs["target_modules"] == ",".join(
            spec["target_modules"])
        ad = {n: torch.from_numpy(g["adapter/" + n][...]).to(F64) for n in g["adapter"]}
        G = {n: torch.from_numpy(g["grads/" + n][...]) for n in g["grads"]}
        M = {n: torch.from_numpy(g["merged/" + n][...]) for n in g["merged"]}
        st = {k: torch.from_numpy(np.asarray(g[k][...])) for k in ("logits", "lp", "loss",
                                                                   "ref_lp")}
        base_lp = torch.from_numpy(f["lp"][...])
        tr = dict(losses=[float(x) for x in g["train/losses"][...]],
                  norms=[float(x) for x in g["train/grad_norms"][...]],
                  final_loss=float(g["train/final_loss"][...]),
                  final={n: torch.from_numpy(g["train/final/" + n][...])
                         for n in g["train/final"]})
    A = {n: t.clone().requires_grad_(True) for n, t in ad.items()}
    out = own_adapted_logits(P, A, cfg, spec, ids)
    loss, lp = mf.lm_loss(out, targets)
    loss.backward()
    with torch.no_grad():
        _, own_base_lp = mf.lm_loss(mfa.own_forward(P, cfg, ids, F64), targets)
    worst = {"logits": mf.rel_max(out.detach(), st["logits"]),
             "lp": mf.rel_max(lp.detach(), st["lp"]),
             "loss": mf.rel_max(loss.detach(), st["loss"]),
             "grads": max(mf.rel_max(A[n].grad, G[n]) for n in G),
             "ref_lp": mf.rel_max(own_base_lp, st["ref_lp"]),
             "base_lp": mf.rel_max(own_base_lp, base_lp),
             "merged": max(mf.rel_max(P[n] + (spec["lora_alpha"] / spec["r"])
                                      * ad[n[:-7] + ".lora_B.weight"]
                                      @ ad[n[:-7] + ".lora_A.weight"], M[n]) for n in M)}
    for k, e in worst.items():
        assert e < 1e-6, f"{path}: {k} disagrees with the independent re-derivation ({e:.2e})"
    print(f"  check {os.path.basename(path)}: own fp64 model vs file (rel max): "
          + ", ".join(f"{k} {e:.1e}" for k, e in worst.items()))
    losses, norms, final_loss, final = own_train_adapter(P, ad, cfg, spec, ids, targets)
    dl = max(abs(a - b) for a, b in zip(losses + [final_loss],
                                        list(tr["losses"]) + [tr["final_loss"]]))
    dn = max(abs(a - b) / b for a, b in zip(norms, tr["norms"]))
    dw = max((final[n] - tr["final"][n].to(F64)).abs().max().item() for n in final)
    print(f"  own AdamW x{TRAIN['steps']} on the adapter vs file: max |dloss| {dl:.1e}, "
          f"grad-norm rel {dn:.1e}, max |dw| {dw:.1e}")
    assert dl < 1e-6 and dn < 1e-6 and dw < 1e-5, f"{path}: training trajectory differs"

    # The PEFT directory holds the same adapter under PEFT's key names.
    adir = os.path.join(out_dir, spec["name"] + "_peft")
    with open(os.path.join(adir, "adapter_config.json")) as fh:
        acfg = json.load(fh)
    assert acfg["r"] == spec["r"] and acfg["lora_alpha"] == spec["lora_alpha"]
    assert sorted(acfg["target_modules"]) == sorted(spec["target_modules"])
    st_tensors = load_file(os.path.join(adir, "adapter_model.safetensors"))
    assert set(st_tensors) == {"base_model.model." + n for n in ad}, sorted(st_tensors)[:4]
    for n, t in ad.items():
        assert torch.equal(st_tensors["base_model.model." + n].to(F64), t), n
    print(f"  check {os.path.basename(adir)}/: {len(st_tensors)} tensors, PEFT key names, "
          "values equal to /lora/adapter")


README = """# tests/fixtures/lora — PEFT reference for LoRA adapters

Written by `scripts/make_lora_fixtures.py` (generator_version {gv}); regenerate in a virtual
environment outside the repository:

```
python3 -m venv /work/venvs/lora
/work/venvs/lora/bin/pip install torch 'transformers<5' peft h5py numpy safetensors
/work/venvs/lora/bin/python scripts/make_lora_fixtures.py               # writes and re-checks
/work/venvs/lora/bin/python scripts/make_lora_fixtures.py --check-only  # only re-checks
```

Generated with torch {tv}, transformers {trv}, peft {pv}, h5py {hv}, seed {seed}.

## Files
| file | model | adapted modules | r | lora_alpha | scaling |
|---|---|---|---|---|---|
{rows}

`NAME.h5` holds the base model and the adapted model's reference; `NAME_peft/` the same adapter as
PEFT's `save_pretrained` writes it (`adapter_config.json`, `adapter_model.safetensors` with keys
`base_model.model.model.layers.{{i}}.self_attn.q_proj.lora_A.weight` (r, in) and `...lora_B.weight`
(out, r), float32).

## Layout of NAME.h5
Root (as the files of `scripts/make_fixtures.py`): attributes `config` (HF config JSON), `head`,
`rope_style`; `/input_ids` (B, T) int32, `/targets` (B, T) int32 (−1 = no target), `/params/<HF
name>` float32 base weights, `/logits`, `/lp`, `/loss` of the **base** model.

`/lora` (attributes `r`, `lora_alpha`, `scaling` = alpha / r, `target_modules` comma-separated,
`lora_dropout` = 0):
- `/lora/adapter/<module>.lora_A.weight` (r, in), `<module>.lora_B.weight` (out, r): the adapter
  (module = `model.layers.<i>.self_attn.q_proj` etc.); values rounded to bfloat16, B ≠ 0.
- `/lora/logits` (B, T, V), `/lora/lp` (B, T), `/lora/loss`: the adapted model,
  h = W x (+ b) + scaling · B A x (Hu et al. 2021, eq. 3).
- `/lora/grads/<same names as adapter>`: d loss / d A and d loss / d B (the base gets none).
- `/lora/ref_lp` (B, T): log-probs with the adapter disabled (`disable_adapter()`), equal to the
  base model's `/lp` — the reference model of an RL step.
- `/lora/merged/<module>.weight`: W + scaling · B A (what `merge_and_unload()` gives).
- `/lora/train`: {steps} AdamW steps on the adapter only (lr {lr}, betas ({b1}, {b2}), eps {eps},
  weight_decay {wd} on every adapter tensor, clip_grad_norm_ {mn} over the adapter before each
  step): `losses`, `grad_norms`, `final_loss`, `final/<adapter names>`.

The loss is lm: −Σ lp / count(targets ≥ 0). Reference in float64 (PEFT layers around transformers,
RMSNorm/RoPE/softmax kept in float64); stored float32. Checked after writing by an independent
float64 model on merged weights (autograd through the merge) and an own AdamW: agreement within
1e-6 relative (logits, lp, loss, grads, ref_lp, merged) and 1e-5 absolute (trained weights).

## Checking an adapter with PEFT: `scripts/check_peft_adapter.py`
```
/work/venvs/lora/bin/python scripts/check_peft_adapter.py --adapter DIR --fixture tests/fixtures/lora/lora_llama.h5
```
loads DIR with `peft.PeftModel.from_pretrained` onto the fixture's base model and compares its
float64 logits with `/lora/logits` (or `--reference-npy FILE`): exit 0 within `--tol` (1e-5 of the
largest logit), 1 on a mismatch or a folder PEFT cannot load, 2 on a usage error. Both committed
adapter folders pass at 4.7e-8.
"""


def write_readme(out_dir):
    rows = "\n".join(
        f"| `{s['name']}.h5`, `{s['name']}_peft/` | {s['model_type']} (2 layers, hidden 64) | "
        f"{', '.join(s['target_modules'])} | {s['r']} | {s['lora_alpha']} | "
        f"{s['lora_alpha'] / s['r']:g} |" for s in SPECS)
    text = README.format(gv=GENERATOR_VERSION, tv=torch.__version__,
                         trv=transformers.__version__, pv=peft.__version__, hv=h5py.__version__,
                         seed=SEED, rows=rows, steps=TRAIN["steps"], lr=TRAIN["lr"],
                         b1=TRAIN["beta1"], b2=TRAIN["beta2"], eps=TRAIN["eps"],
                         wd=TRAIN["weight_decay"], mn=TRAIN["max_norm"])
    with open(os.path.join(out_dir, "README.md"), "w") as fh:
        fh.write(text)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "tests",
                                                  "fixtures", "lora"))
    ap.add_argument("--check-only", action="store_true", help="only re-check existing files")
    args = ap.parse_args()
    torch.set_num_threads(1)
    for spec in SPECS:
        print(spec["name"])
        if not args.check_only:
            generate(spec, args.out)
        check(spec, args.out)
    if not args.check_only:
        write_readme(args.out)


if __name__ == "__main__":
    main()
