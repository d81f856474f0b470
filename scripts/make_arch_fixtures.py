#!/usr/bin/env python3
"""PyTorch / Hugging Face reference fixtures for newer architecture features (Qwen2 tied, Qwen3
q_norm/k_norm with an explicit head_dim, Llama 3 RoPE scaling), plus greedy decoding.

Writes tests/fixtures/{qwen2_tied,qwen3_qk_norm,llama3_rope}.h5 in the format of
scripts/make_fixtures.py (same root attributes, /input_ids, /targets, /logits, /lp, /loss, /params,
/grads and the 5-step AdamW /train group), and adds a /greedy group: a random BOS-free prompt and
the tokens that transformers' `generate(do_sample=False)` produces from it, with the logits of each
step. make_fixtures.py pins transformers 4.44 on torch 1.13; these models need transformers >= 4.51
(Qwen3), so this script runs in its own virtual environment and reuses the shared pieces of
make_fixtures.py (dimensions, inputs, loss, AdamW trajectory, HDF5 writing).

The reference is transformers' own LlamaForCausalLM / Qwen2ForCausalLM / Qwen3ForCausalLM run in
float64. transformers 4.57 forces float32 in three places even in a float64 model: RMSNorm
(including Qwen3's q_norm / k_norm), the RoPE tables (inv_freq built in float32, llama3 scaling
included, and the angles in float32) and the attention softmax; `f64_patches` keeps float64 there
(same formulas; the llama3 scaling is transformers' own function fed a float64 inv_freq) and the
script asserts that the patched float64 model agrees with the unpatched float32 one. Every file is
then read back and re-derived by an independent, plainly written float64 model (`own_forward`,
`own_train`, `own_greedy` below).

Usage (see tests/fixtures/README.md):
    /work/venvs/fixtures/bin/python scripts/make_arch_fixtures.py [--out tests/fixtures] [--check-only]
Needs torch (tested 2.15.0), transformers (tested 4.57.6), h5py, numpy.
"""

import argparse
import contextlib
import copy
import json
import math
import os
import sys
import warnings

import h5py
import numpy as np
import torch

import transformers
from transformers import (LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM,
                          Qwen3Config, Qwen3ForCausalLM)
from transformers import modeling_rope_utils
from transformers.models.llama import modeling_llama
from transformers.models.qwen2 import modeling_qwen2
from transformers.models.qwen3 import modeling_qwen3

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_fixtures as mf  # noqa: E402  (shared dimensions, inputs, loss, training, HDF5 writing)

GENERATOR = "scripts/make_arch_fixtures.py"
GENERATOR_VERSION = "1"
SEED = mf.SEED
B, T = mf.B, mf.T
TRAIN = mf.TRAIN
F64 = torch.float64

# Shared tiny dimensions (as make_fixtures.py); rms_norm_eps and head_dim are per file.
DIMS = {k: v for k, v in mf.DIMS.items() if k != "rms_norm_eps"}

# Greedy decoding group: prompt length, generated tokens, required top-1 minus top-2 margin.
GREEDY_P, GREEDY_G, GREEDY_MIN_MARGIN = 5, 12, 1e-3
GREEDY_SEED = SEED + 1  # prompts are drawn from their own generator, tried in order

LLAMA3_SCALING = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                  "high_freq_factor": 4.0, "original_max_position_embeddings": 16}

SPECS = [
    dict(file="qwen2_tied.h5", model_type="qwen2", tie_word_embeddings=True, rope_theta=1e6,
         rms_norm_eps=1e-6, head_dim=16, attention_bias=False, rope_scaling=None,
         qk_norm_range=None),
    dict(file="qwen3_qk_norm.h5", model_type="qwen3", tie_word_embeddings=False, rope_theta=1e6,
         rms_norm_eps=1e-6, head_dim=32, attention_bias=False, rope_scaling=None,
         qk_norm_range=(0.5, 1.5)),
    dict(file="llama3_rope.h5", model_type="llama", tie_word_embeddings=False,
         rope_theta=500000.0, rms_norm_eps=1e-5, head_dim=16, attention_bias=False,
         rope_scaling=LLAMA3_SCALING, qk_norm_range=None),
]
ARCH = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}


# ---------------------------------------------------------------------------------------------
# float64 purity patches for transformers 4.57 (same formulas, the input dtype is kept)

def _rmsnorm_forward_keep_dtype(self, hidden_states):
    # HF: hidden_states.to(torch.float32) first. Used by every RMSNorm, Qwen3's q_norm/k_norm too.
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    return self.weight * (hidden_states * torch.rsqrt(variance + self.variance_epsilon))


def _default_rope_parameters_f64(config=None, device=None, seq_len=None):
    """transformers' _compute_default_rope_parameters with dtype=float64 (HF: torch.float)."""
    del seq_len
    base = config.rope_theta
    partial_rotary_factor = getattr(config, "partial_rotary_factor", 1.0)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    dim = int(head_dim * partial_rotary_factor)
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).to(device=device,
                                                                             dtype=F64) / dim))
    return inv_freq, 1.0


def _rope_forward_f64(self, x, position_ids):
    # inv_freq rebuilt in float64 by transformers' own init function for this rope_type (the
    # llama3 one calls the patched default one and keeps its dtype), angles in float64.
    inv_freq, scaling = modeling_rope_utils.ROPE_INIT_FUNCTIONS[self.rope_type](self.config,
                                                                                 x.device)
    assert inv_freq.dtype == F64
    freqs = position_ids[:, :, None].to(F64) * inv_freq[None, None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return (emb.cos() * scaling).to(x.dtype), (emb.sin() * scaling).to(x.dtype)


_orig_softmax = torch.nn.functional.softmax


def _softmax_keep_f64(input, *args, **kwargs):
    if kwargs.get("dtype") == torch.float32 and input.dtype == F64:
        kwargs["dtype"] = F64
    return _orig_softmax(input, *args, **kwargs)


@contextlib.contextmanager
def f64_patches(enabled=True):
    """Within the block, transformers' forced-float32 spots keep float64 (no-op for float32)."""
    if not enabled:
        yield
        return
    saved = [(m, n) for m in (modeling_llama.LlamaRMSNorm, modeling_qwen2.Qwen2RMSNorm,
                              modeling_qwen3.Qwen3RMSNorm) for n in ("forward",)]
    saved += [(m, "forward") for m in (modeling_llama.LlamaRotaryEmbedding,
                                       modeling_qwen2.Qwen2RotaryEmbedding,
                                       modeling_qwen3.Qwen3RotaryEmbedding)]
    originals = [getattr(c, n) for c, n in saved]
    orig_default = modeling_rope_utils._compute_default_rope_parameters
    orig_table = modeling_rope_utils.ROPE_INIT_FUNCTIONS["default"]
    for c, n in saved:
        setattr(c, n, _rope_forward_f64 if "Rotary" in c.__name__ else _rmsnorm_forward_keep_dtype)
    modeling_rope_utils._compute_default_rope_parameters = _default_rope_parameters_f64
    modeling_rope_utils.ROPE_INIT_FUNCTIONS["default"] = _default_rope_parameters_f64
    torch.nn.functional.softmax = _softmax_keep_f64
    try:
        yield
    finally:
        for (c, n), f in zip(saved, originals):
            setattr(c, n, f)
        modeling_rope_utils._compute_default_rope_parameters = orig_default
        modeling_rope_utils.ROPE_INIT_FUNCTIONS["default"] = orig_table
        torch.nn.functional.softmax = _orig_softmax


# ---------------------------------------------------------------------------------------------
# Config, model, init

def build_model(spec):
    """A float32 HF model with HF's default init (overwritten by init_params). No BOS/EOS/pad ids:
    generate() then never stops early."""
    common = dict(DIMS, rms_norm_eps=spec["rms_norm_eps"], rope_theta=spec["rope_theta"],
                  head_dim=spec["head_dim"], tie_word_embeddings=spec["tie_word_embeddings"],
                  hidden_act="silu", attn_implementation="eager", pad_token_id=None,
                  bos_token_id=None, eos_token_id=None,
                  rope_scaling=copy.deepcopy(spec["rope_scaling"]), attention_dropout=0.0)
    if spec["model_type"] == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(use_sliding_window=False, **common))
    elif spec["model_type"] == "qwen3":
        model = Qwen3ForCausalLM(Qwen3Config(use_sliding_window=False,
                                             attention_bias=spec["attention_bias"], **common))
    else:
        model = LlamaForCausalLM(LlamaConfig(attention_bias=spec["attention_bias"],
                                             mlp_bias=False, **common))
    assert model.config._attn_implementation == "eager"
    assert model.model.layers[0].self_attn.head_dim == spec["head_dim"]
    model.eval()
    return model


def config_json(spec, model):
    """The HF config.json-style object stored in the file's "config" attribute (the keys of
    make_fixtures.py, plus head_dim and rope_scaling as transformers writes it)."""
    hf = model.config.to_dict()
    j = dict(architectures=[ARCH[spec["model_type"]]], model_type=spec["model_type"],
             hidden_act="silu")
    j.update(DIMS)
    j.update(rms_norm_eps=spec["rms_norm_eps"], head_dim=hf["head_dim"],
             rope_theta=hf["rope_theta"], rope_scaling=hf["rope_scaling"],
             tie_word_embeddings=hf["tie_word_embeddings"],
             attention_bias=spec["attention_bias"], rope_style="rotate_half", head="lm")
    assert j["rope_scaling"] == spec["rope_scaling"] and j["head_dim"] == spec["head_dim"]
    return j


@torch.no_grad()
def init_params(model, spec, gen):
    """Weights N(0, 0.02); layer norm weights U(0.9, 1.1); q_norm/k_norm weights U(lo, hi);
    biases N(0, 0.05). Every value rounded to bfloat16, in named_parameters order from one
    generator."""
    for name, p in model.named_parameters():
        if name.endswith(("q_norm.weight", "k_norm.weight")):
            lo, hi = spec["qk_norm_range"]
            v = lo + (hi - lo) * torch.rand(p.shape, generator=gen, dtype=F64)
        elif name.endswith("norm.weight"):
            v = 1.0 + 0.1 * (2.0 * torch.rand(p.shape, generator=gen, dtype=F64) - 1.0)
        elif name.endswith("bias"):
            v = 0.05 * torch.randn(p.shape, generator=gen, dtype=F64)
        else:
            v = 0.02 * torch.randn(p.shape, generator=gen, dtype=F64)
        p.copy_(v.to(torch.bfloat16).to(p.dtype))


def clone_model(model):
    m = copy.deepcopy(model)
    if m.config.tie_word_embeddings:
        m.tie_weights()
        assert m.lm_head.weight is m.model.embed_tokens.weight
    return m


def head_logits(model, ids):
    """Full-sequence logits (B,T,V), no attention_mask, positions 0..T-1."""
    return mf.hf_head_output(model, {"head": "lm"}, ids)


# ---------------------------------------------------------------------------------------------
# Greedy decoding

def margins(logits):
    """top-1 minus top-2 logit per row."""
    top = logits.topk(2, dim=-1).values
    return top[..., 0] - top[..., 1]


def hf_greedy(model, prompt, patched):
    """transformers' generate(do_sample=False, max_new_tokens=G) from one prompt (no EOS)."""
    with f64_patches(patched), torch.no_grad():
        out = model.generate(prompt[None], do_sample=False, max_new_tokens=GREEDY_G,
                             min_new_tokens=GREEDY_G, eos_token_id=None, pad_token_id=None,
                             bos_token_id=None, output_logits=True, return_dict_in_generate=True,
                             num_beams=1, top_k=None, top_p=None, temperature=None)
    toks = out.sequences[0, prompt.numel():]
    assert toks.numel() == GREEDY_G
    return toks, torch.stack([lg[0] for lg in out.logits])  # (G,), (G, V) float32 (generate casts)


def pick_greedy(model, model32):
    """Tries prompts from GREEDY_SEED in order until every generated step has a top-1 minus
    top-2 margin >= GREEDY_MIN_MARGIN. Returns prompt, tokens, float64 per-step logits, the min
    margin and the 0-based index of the accepted prompt."""
    gen = torch.Generator().manual_seed(GREEDY_SEED)
    V = DIMS["vocab_size"]
    for attempt in range(1000):
        prompt = torch.randint(1, V, (GREEDY_P,), generator=gen, dtype=torch.int64)
        toks, gen_logits = hf_greedy(model, prompt, True)
        # The per-step distributions again, by a full-sequence float64 forward (no KV cache).
        seq = torch.cat((prompt, toks))[None]
        with f64_patches(), torch.no_grad():
            logits = head_logits(model, seq[:, :-1])[0, GREEDY_P - 1:]
        assert torch.equal(logits.argmax(-1), toks), "generate() is not the argmax"
        m = float(margins(logits).min())
        if m < GREEDY_MIN_MARGIN:
            print(f"  greedy prompt {attempt}: min margin {m:.1e} < {GREEDY_MIN_MARGIN}, next")
            continue
        dev = (gen_logits.to(F64) - logits).abs().max().item()
        assert dev <= 1e-5 * max(logits.abs().max().item(), 1.0), dev
        toks32, logits32 = hf_greedy(model32, prompt, False)
        assert torch.equal(toks32, toks), "unpatched float32 generate() differs"
        dev32 = (logits32.to(F64) - logits).abs().max().item()
        print(f"  greedy prompt {attempt} {prompt.tolist()} -> {toks.tolist()}: min margin "
              f"{m:.2e}; generate() logits vs fp64 full forward {dev:.1e}, unpatched fp32 "
              f"generate() same tokens, logits {dev32:.1e}")
        return prompt, toks, logits, m, attempt
    raise RuntimeError("no prompt with a robust greedy continuation")


# ---------------------------------------------------------------------------------------------
# Generation

def print_rope_frequencies(spec, model):
    """Default vs scaled inv_freq (float64), and which pairs the scaling changed."""
    cfg = model.config
    with f64_patches():
        base, _ = modeling_rope_utils.ROPE_INIT_FUNCTIONS["default"](cfg, None)
        scaled, _ = modeling_rope_utils.ROPE_INIT_FUNCTIONS[
            model.model.rotary_emb.rope_type](cfg, None)
    own = own_inv_freq(json.loads(json.dumps(config_json(spec, model))))
    assert (own - scaled).abs().max().item() <= 1e-15 * scaled.abs().max().item()
    hf32 = model.model.rotary_emb.inv_freq.to(F64)  # HF's own float32 table
    assert (hf32 - scaled).abs().max().item() <= 1e-6 * scaled.abs().max().item()
    changed = [i for i in range(base.numel()) if abs(base[i] - scaled[i]) > 1e-12 * base[i]]
    if spec["rope_scaling"] is not None:
        rs = spec["rope_scaling"]
        for i in range(base.numel()):
            wl = 2 * math.pi / float(base[i])
            kind = ("unchanged" if wl < rs["original_max_position_embeddings"] / rs["high_freq_factor"]
                    else "divided by factor" if wl > rs["original_max_position_embeddings"] /
                    rs["low_freq_factor"] else "smoothed")
            print(f"    pair {i}: inv_freq {float(base[i]):.6e} -> {float(scaled[i]):.6e} "
                  f"(wavelength {wl:.2f}, {kind})")
        print(f"  llama3 scaling changes pairs {changed} of {base.numel()}")
        assert len(changed) >= 3
    return changed


def generate(spec, out_dir):
    gen = torch.Generator().manual_seed(SEED)
    model32 = build_model(spec)
    init_params(model32, spec, gen)
    ids, targets = mf.make_inputs(gen)
    cfg_json = config_json(spec, model32)
    changed = print_rope_frequencies(spec, model32)

    model = clone_model(model32).to(F64)
    with f64_patches():
        logits = head_logits(model, ids)
        loss, lp = mf.lm_loss(logits, targets)
        model.zero_grad(set_to_none=True)
        loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    params = {n: p.detach().clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    if spec["model_type"] == "qwen3":
        assert all(n in grads for n in ("model.layers.0.self_attn.q_norm.weight",
                                        "model.layers.1.self_attn.k_norm.weight"))

    # The patches only change precision: unpatched float32 HF agrees to fp32 round-off.
    scale = logits.abs().max().item()
    with torch.no_grad():
        out32 = model32(input_ids=ids, use_cache=False).logits  # HF's own full forward
        out64u = model(input_ids=ids, use_cache=False).logits  # float64 without the patches
    dev = (out32.to(F64) - logits).abs().max().item()
    devu = (out64u - logits).abs().max().item()
    print(f"  unpatched fp32 HF vs patched fp64 HF: max |dlogits| {dev:.2e} (max |ref| "
          f"{scale:.2e}); unpatched fp64 vs patched fp64: {devu:.2e}")
    assert dev <= 1e-5 * max(scale, 1.0), "float64 patches changed the computation"

    with f64_patches():
        losses, norms, final_loss, final = mf.train(clone_model(model), {"head": "lm"}, ids,
                                                    targets)
    g_prompt, g_toks, g_logits, g_margin, g_attempt = pick_greedy(model, model32)

    path = os.path.join(out_dir, spec["file"])
    tmp = path + ".tmp"
    with mf.create_h5(tmp) as f:
        a = f.attrs
        a["generator"] = GENERATOR
        a["generator_version"] = GENERATOR_VERSION
        a["torch_version"] = str(torch.__version__)
        a["transformers_version"] = str(transformers.__version__)
        a["h5py_version"] = str(h5py.__version__)
        a["hdf5_version"] = str(h5py.version.hdf5_version)
        a["seed"] = np.int64(SEED)
        a["config"] = json.dumps(cfg_json)
        a["head"] = "lm"
        a["rope_style"] = "rotate_half"
        a["reference"] = (f"transformers {model.__class__.__name__} in float64 (RMSNorm incl. "
                          "q_norm/k_norm, RoPE inv_freq incl. scaling and angles, attention "
                          "softmax kept in float64), eager attention, no attention_mask (plain "
                          "causal over all T), position ids 0..T-1")
        a["reference_dtype"] = "float64 forward/backward; stored results cast to float32"
        a["init"] = ("weights N(0,0.02), layer norm weights U(0.9,1.1), "
                     + (f"q_norm/k_norm weights U({spec['qk_norm_range'][0]},"
                        f"{spec['qk_norm_range'][1]}), " if spec["qk_norm_range"] else "")
                     + "biases N(0,0.05); every initial value rounded to bfloat16 (exact in fp32)")
        a["loss_definition"] = "lm: loss = -sum(lp) / count(targets >= 0) (token-level mean)"
        if changed and spec["rope_scaling"] is not None:
            a["rope_scaling_changed_pairs"] = np.asarray(changed, dtype=np.int32)
        mf.put(f, "input_ids", ids.numpy().astype(np.int32))
        mf.put(f, "targets", targets.numpy().astype(np.int32))
        mf.put(f, "logits", mf.f32(logits))
        mf.put(f, "lp", mf.f32(lp))
        mf.put(f, "loss", np.float32(loss.item()))
        f["loss"].attrs["float64_value"] = np.float64(loss.item())
        gp, gg = mf.group(f, "params"), mf.group(f, "grads")
        for n, p in params.items():
            d = mf.put(gp, n, mf.f32(p))
            d.attrs["weight_decay"] = np.int8(0 if mf.is_no_decay(n) else 1)
        for n, g in grads.items():
            mf.put(gg, n, mf.f32(g))
        gt = mf.group(f, "train")
        gt.attrs["optimizer"] = ("torch.optim.AdamW(foreach=False), two param groups: "
                                 "weight_decay on every tensor whose name contains none of "
                                 + ", ".join(mf.NO_DECAY) + "; the others 0")
        gt.attrs["clip"] = "torch.nn.utils.clip_grad_norm_(all params, max_norm) before each step"
        gt.attrs["dtype"] = "float64 (model, gradients, optimizer state); stored as float32"
        gt.attrs["schedule"] = "constant lr"
        for k, v in TRAIN.items():
            gt.attrs[k] = v
        mf.put(gt, "losses", np.asarray(losses, dtype=np.float32))
        gt["losses"].attrs["float64_values"] = np.asarray(losses, dtype=np.float64)
        mf.put(gt, "grad_norms", np.asarray(norms, dtype=np.float32))
        mf.put(gt, "final_loss", np.float32(final_loss))
        gf = mf.group(gt, "final")
        for n, p in final.items():
            mf.put(gf, n, mf.f32(p))
        gr = mf.group(f, "greedy")
        gr.attrs["method"] = (f"transformers generate(do_sample=False, max_new_tokens={GREEDY_G}) "
                              "of the float64 model, no EOS (eos_token_id None), no attention "
                              "mask, positions 0..P+G-1")
        gr.attrs["min_margin"] = np.float64(g_margin)
        gr.attrs["required_margin"] = np.float64(GREEDY_MIN_MARGIN)
        gr.attrs["prompt_attempt"] = np.int64(g_attempt)
        gr.attrs["prompt_seed"] = np.int64(GREEDY_SEED)
        mf.put(gr, "prompt", g_prompt.numpy().astype(np.int32))
        mf.put(gr, "tokens", g_toks.numpy().astype(np.int32))
        mf.put(gr, "logits", mf.f32(g_logits))
    os.replace(tmp, path)
    print(f"  wrote {path} ({os.path.getsize(path) / 1024:.0f} KiB)")


# ---------------------------------------------------------------------------------------------
# Independent check: a plainly written model reading the file's config and params

def own_inv_freq(cfg):
    """inv_freq[i] = theta^(-2i/D), i < D/2, then (rope_scaling llama3, as Llama 3.1's reference
    code): wavelength w = 2 pi / inv_freq; w < orig/high: unchanged; w > orig/low: / factor;
    otherwise s = (orig/w - low) / (high - low), (1 - s) inv_freq / factor + s inv_freq."""
    D = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    f = [cfg["rope_theta"] ** (-2.0 * i / D) for i in range(D // 2)]
    rs = cfg.get("rope_scaling")
    if rs:
        assert rs["rope_type"] == "llama3", rs
        factor, low, high = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"]
        orig = rs["original_max_position_embeddings"]
        out = []
        for x in f:
            w = 2 * math.pi / x
            if w < orig / high:
                out.append(x)
            elif w > orig / low:
                out.append(x / factor)
            else:
                s = (orig / w - low) / (high - low)
                out.append((1 - s) * x / factor + s * x)
        f = out
    return torch.tensor(f, dtype=F64)


def own_forward(P, cfg, ids, dtype):
    """P: HF name -> tensor. Returns logits (B,T,V). RoPE pairs (i, i+D/2) with angle
    pos * inv_freq[i]; Qwen3: per-head RMSNorm of q and k (weights (D,)) before RoPE; D = head_dim.
    Query head h reads KV head h // (H/Hkv)."""
    C, H, Hkv = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    D = cfg.get("head_dim") or C // H
    eps, L = cfg["rms_norm_eps"], cfg["num_hidden_layers"]
    Bn, Tn = ids.shape
    assert cfg["rope_style"] == "rotate_half"
    qkv_bias = cfg["model_type"] == "qwen2" or cfg["attention_bias"]
    o_bias = cfg["attention_bias"] and cfg["model_type"] != "qwen2"
    qk_norm = cfg["model_type"] == "qwen3"

    def rms(x, w):
        return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps) * w

    def lin(x, name, bias):
        y = x @ P[name + ".weight"].T
        return y + P[name + ".bias"] if bias else y

    ang = torch.arange(Tn, dtype=F64)[:, None] * own_inv_freq(cfg)[None, :]
    cos, sin = ang.cos().to(dtype), ang.sin().to(dtype)  # (T, D/2)

    def rope(x):  # (B, T, heads, D)
        c, s = cos[None, :, None, :], sin[None, :, None, :]
        a, b = x[..., : D // 2], x[..., D // 2:]
        return torch.cat((a * c - b * s, b * c + a * s), dim=-1)

    causal = torch.ones(Tn, Tn, dtype=torch.bool).tril()
    x = P["model.embed_tokens.weight"][ids]
    for layer in range(L):
        pre = f"model.layers.{layer}."
        h = rms(x, P[pre + "input_layernorm.weight"])
        q = lin(h, pre + "self_attn.q_proj", qkv_bias).reshape(Bn, Tn, H, D)
        k = lin(h, pre + "self_attn.k_proj", qkv_bias).reshape(Bn, Tn, Hkv, D)
        v = lin(h, pre + "self_attn.v_proj", qkv_bias).reshape(Bn, Tn, Hkv, D)
        if qk_norm:
            q = rms(q, P[pre + "self_attn.q_norm.weight"])
            k = rms(k, P[pre + "self_attn.k_norm.weight"])
        q, k = rope(q), rope(k)
        heads = []
        for hh in range(H):
            kv = hh // (H // Hkv)
            s = q[:, :, hh] @ k[:, :, kv].transpose(1, 2) / math.sqrt(D)  # (B, T, T)
            s = s.masked_fill(~causal[:Tn, :Tn], float("-inf"))
            heads.append(torch.softmax(s, dim=-1) @ v[:, :, kv])
        x = x + lin(torch.stack(heads, dim=2).reshape(Bn, Tn, H * D), pre + "self_attn.o_proj",
                    o_bias)
        h = rms(x, P[pre + "post_attention_layernorm.weight"])
        g, u = lin(h, pre + "mlp.gate_proj", False), lin(h, pre + "mlp.up_proj", False)
        x = x + lin(g * torch.sigmoid(g) * u, pre + "mlp.down_proj", False)
    x = rms(x, P["model.norm.weight"])
    w = P["model.embed_tokens.weight"] if cfg["tie_word_embeddings"] else P["lm_head.weight"]
    return x @ w.T


def own_train(P, cfg, ids, targets, dtype):
    """Own AdamW (Loshchilov & Hutter 2019, Alg. 2, PyTorch's bias-correction form) + own clip."""
    P = {n: t.clone().to(dtype).requires_grad_(True) for n, t in P.items()}
    m = {n: torch.zeros_like(t) for n, t in P.items()}
    v = {n: torch.zeros_like(t) for n, t in P.items()}
    lr, b1, b2, eps = TRAIN["lr"], TRAIN["beta1"], TRAIN["beta2"], TRAIN["eps"]
    losses, norms = [], []
    for step in range(1, TRAIN["steps"] + 1):
        for t in P.values():
            t.grad = None
        loss, _ = mf.lm_loss(own_forward(P, cfg, ids, dtype), targets)
        loss.backward()
        with torch.no_grad():
            total = math.sqrt(sum(float((t.grad.to(F64) ** 2).sum()) for t in P.values()))
            coef = min(TRAIN["max_norm"] / (total + 1e-6), 1.0)
            for n, p in P.items():
                g = p.grad * coef
                wd = 0.0 if mf.is_no_decay(n) else TRAIN["weight_decay"]
                p.mul_(1 - lr * wd)
                m[n] = b1 * m[n] + (1 - b1) * g
                v[n] = b2 * v[n] + (1 - b2) * g * g
                denom = v[n].sqrt() / math.sqrt(1 - b2 ** step) + eps
                p.sub_(lr / (1 - b1 ** step) * m[n] / denom)
        losses.append(float(loss))
        norms.append(total)
    with torch.no_grad():
        final_loss, _ = mf.lm_loss(own_forward(P, cfg, ids, dtype), targets)
    return losses, norms, float(final_loss), {n: t.detach() for n, t in P.items()}


@torch.no_grad()
def own_greedy(P, cfg, prompt, G, dtype):
    """Greedy decoding by repeated full-sequence forwards: tokens (G,), step logits (G, V)."""
    seq, logits = prompt.clone(), []
    for _ in range(G):
        lg = own_forward(P, cfg, seq[None], dtype)[0, -1]
        logits.append(lg)
        seq = torch.cat((seq, lg.argmax()[None]))
    return seq[prompt.numel():], torch.stack(logits)


def check(path):
    """Re-derives everything in the file with own_forward / own_train / own_greedy."""
    with h5py.File(path, "r") as f:
        cfg = json.loads(f.attrs["config"])
        ids = torch.from_numpy(f["input_ids"][...].astype(np.int64))
        P = {n: torch.from_numpy(f["params/" + n][...]).to(F64) for n in f["params"]}
        G = {n: torch.from_numpy(f["grads/" + n][...]) for n in f["grads"]}
        stored = {k: torch.from_numpy(np.asarray(f[k][...]))
                  for k in ("logits", "lp", "targets", "loss")}
        tr = dict(losses=f["train/losses"][...], norms=f["train/grad_norms"][...],
                  final_loss=float(f["train/final_loss"][...]),
                  final={n: torch.from_numpy(f["train/final/" + n][...])
                         for n in f["train/final"]})
        gr = {k: torch.from_numpy(f["greedy/" + k][...]) for k in ("prompt", "tokens", "logits")}
        gr_margin = float(f["greedy"].attrs["min_margin"])
    assert set(G) == set(P)
    Pg = {n: t.clone().requires_grad_(True) for n, t in P.items()}
    out = own_forward(Pg, cfg, ids, F64)
    targets = stored["targets"].to(torch.int64)
    loss, lp = mf.lm_loss(out, targets)
    worst = {"logits": mf.rel_max(out.detach(), stored["logits"]),
             "lp": mf.rel_max(lp.detach(), stored["lp"]),
             "loss": mf.rel_max(loss.detach(), stored["loss"])}
    loss.backward()
    worst["grads"] = max(mf.rel_max(Pg[n].grad, G[n]) for n in G)
    for k, e in worst.items():
        assert e < 1e-6, f"{path}: {k} disagrees with the independent re-derivation ({e:.2e})"
    msg = ", ".join(f"{k} {e:.1e}" for k, e in worst.items())
    print(f"  check {os.path.basename(path)}: own fp64 model vs file (rel max): {msg}")

    for dtype in (F64, torch.float32):
        toks, logits = own_greedy(P, cfg, gr["prompt"].to(torch.int64), gr["tokens"].numel(),
                                  dtype)
        same = torch.equal(toks, gr["tokens"].to(torch.int64))
        e = mf.rel_max(logits, gr["logits"])
        m = float(margins(logits.to(F64)).min())
        print(f"  own {'fp64' if dtype == F64 else 'fp32'} greedy vs file: tokens "
              f"{'identical' if same else 'DIFFER'}, step logits rel {e:.1e}, min margin {m:.2e}")
        assert same, f"{path}: greedy tokens differ ({dtype})"
        if dtype == F64:
            assert e < 1e-6 and abs(m - gr_margin) < 1e-6, f"{path}: greedy logits differ"
        else:
            assert e < 1e-4
    for dtype in (F64, torch.float32):
        losses, norms, final_loss, final = own_train(P, cfg, ids, targets, dtype)
        dl = max(abs(a - b) for a, b in zip(losses + [final_loss],
                                            list(tr["losses"]) + [tr["final_loss"]]))
        dn = max(abs(a - b) / b for a, b in zip(norms, tr["norms"]))
        dw = max((final[n].to(F64) - tr["final"][n].to(F64)).abs().max().item() for n in final)
        nbad = sum(int(((final[n].to(F64) - tr["final"][n].to(F64)).abs() > 1e-4).sum())
                   for n in final)
        nall = sum(t.numel() for t in final.values())
        print(f"  own {'fp64' if dtype == F64 else 'fp32'} AdamW x{TRAIN['steps']} vs file: "
              f"max |dloss| {dl:.1e}, grad-norm rel {dn:.1e}, max |dw| {dw:.1e}, "
              f"{nbad}/{nall} weights off by > 1e-4; grad norms {[round(x, 3) for x in norms]}")
        if dtype == F64:
            assert dl < 1e-6 and dn < 1e-6 and dw < 1e-5, f"{path}: training trajectory differs"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "tests",
                                                  "fixtures"))
    ap.add_argument("--check-only", action="store_true", help="only re-check existing files")
    ap.add_argument("--only", help="one file name of SPECS (e.g. qwen3_qk_norm.h5)")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    # make_fixtures.train() records float(loss) of a graph-carrying scalar; harmless here.
    warnings.filterwarnings("ignore", message="Converting a tensor with requires_grad=True")  # reproducible reductions
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, "
          f"h5py {h5py.__version__} (HDF5 {h5py.version.hdf5_version}), seed {SEED}")
    for spec in SPECS:
        if args.only and spec["file"] != args.only:
            continue
        print(spec["file"])
        if not args.check_only:
            generate(spec, args.out)
        check(os.path.join(args.out, spec["file"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
