#!/usr/bin/python3
"""PyTorch / Hugging Face reference fixtures for the whole model (llm.c's test_gpt2 idea, in HDF5).

Writes tests/fixtures/<name>.h5 for four tiny Llama-family configurations: the inputs, the initial
weights under their Hugging Face names, the logits (or per-token values), per-token log-probs, the
loss, d loss / d every parameter, and (LM heads) a 5-step AdamW training trajectory. The C++ test
reads these files and compares our forward, backward and optimizer against them.

The reference model is Hugging Face transformers' own LlamaForCausalLM / Qwen2ForCausalLM /
LlamaForSequenceClassification, run in float64. transformers forces a few computations into float32
even in a float64 model (RMSNorm, the RoPE tables, the attention softmax, `logits.float()`); this
script patches exactly those (same formulas, dtype kept) so the reference is not limited by fp32
round-off, and it checks that the patched float64 model agrees with the unpatched float32 one.
Every file is then read back and re-derived by an independent, plainly written float64 Llama
(`own_forward` below, including our own AdamW and gradient clipping) as a consistency check of
the stored conventions (interleaved RoPE in particular).

Usage (see tests/fixtures/README.md):
    /usr/bin/python3 scripts/make_fixtures.py [--out tests/fixtures] [--check-only]
Needs torch, transformers (tested 4.44.2 with torch 1.13), h5py, numpy.
"""

import argparse
import contextlib
import copy
import json
import math
import os
import sys

import h5py
import numpy as np
import torch

import transformers
from transformers import (LlamaConfig, LlamaForCausalLM, LlamaForSequenceClassification,
                          Qwen2Config, Qwen2ForCausalLM)
from transformers.models.llama import modeling_llama
from transformers.models.qwen2 import modeling_qwen2

GENERATOR = "scripts/make_fixtures.py"
GENERATOR_VERSION = "1"
SEED = 20240527

# Shared tiny dimensions (docs/design.md, "Conventions: tests").
DIMS = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
            intermediate_size=176, vocab_size=256, max_position_embeddings=64, rms_norm_eps=1e-5)
B, T = 3, 16
PAD_ROW, PAD_LEN = 2, 11  # row PAD_ROW has PAD_LEN real tokens, then right padding
PAD_ID = 0

# Training trajectory (LM heads): torch.optim.AdamW, OpenRLHF's betas and no-decay list.
TRAIN = dict(steps=5, lr=1e-2, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1, max_norm=1.0)
NO_DECAY = ("bias", "layer_norm.weight", "layernorm.weight", "norm.weight", "ln_f.weight")

SPECS = [
    dict(file="llama_rotate_half_untied.h5", model_type="llama", rope_style="rotate_half",
         tie_word_embeddings=False, head="lm", rope_theta=10000.0, attention_bias=False),
    dict(file="llama_interleaved_tied.h5", model_type="llama", rope_style="interleaved",
         tie_word_embeddings=True, head="lm", rope_theta=10000.0, attention_bias=False),
    dict(file="qwen2_bias.h5", model_type="qwen2", rope_style="rotate_half",
         tie_word_embeddings=False, head="lm", rope_theta=1e6, attention_bias=False),
    dict(file="value_head.h5", model_type="llama", rope_style="rotate_half",
         tie_word_embeddings=False, head="value", rope_theta=10000.0, attention_bias=False),
]

F64 = torch.float64


# ---------------------------------------------------------------------------------------------
# float64 purity patches for transformers 4.44 (same formulas, the input dtype is kept)

def _rmsnorm_forward_keep_dtype(self, hidden_states):
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    return self.weight * (hidden_states * torch.rsqrt(variance + self.variance_epsilon))


def _llama_rope_forward_f64(self, x, position_ids):
    # inv_freq[i] = theta^(-2i/D) and the angles computed in float64 (HF: float32).
    dim = self.inv_freq.shape[0] * 2
    inv_freq = 1.0 / (self.config.rope_theta ** (torch.arange(0, dim, 2, dtype=F64) / dim))
    freqs = position_ids[:, :, None].to(F64) * inv_freq[None, None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(x.dtype), emb.sin().to(x.dtype)


def _qwen2_set_cos_sin_cache_f64(self, seq_len, device, dtype):
    del dtype  # cached in float64; forward casts to the input's dtype
    self.max_seq_len_cached = seq_len
    inv_freq = 1.0 / (self.base ** (torch.arange(0, self.dim, 2, dtype=F64) / self.dim))
    freqs = torch.outer(torch.arange(seq_len, dtype=F64), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    self.register_buffer("cos_cached", emb.cos().to(device), persistent=False)
    self.register_buffer("sin_cached", emb.sin().to(device), persistent=False)


_orig_softmax = torch.nn.functional.softmax


def _softmax_keep_f64(input, dim=None, _stacklevel=3, dtype=None):
    if dtype == torch.float32 and input.dtype == F64:
        dtype = F64
    return _orig_softmax(input, dim=dim, _stacklevel=_stacklevel, dtype=dtype)


@contextlib.contextmanager
def f64_patches(enabled=True):
    """Within the block, transformers' forced-float32 spots keep float64 (no-op for float32)."""
    if not enabled:
        yield
        return
    saved = [(modeling_llama.LlamaRMSNorm, "forward"), (modeling_qwen2.Qwen2RMSNorm, "forward"),
             (modeling_llama.LlamaRotaryEmbedding, "forward"),
             (modeling_qwen2.Qwen2RotaryEmbedding, "_set_cos_sin_cache")]
    originals = [getattr(c, n) for c, n in saved]
    modeling_llama.LlamaRMSNorm.forward = _rmsnorm_forward_keep_dtype
    modeling_qwen2.Qwen2RMSNorm.forward = _rmsnorm_forward_keep_dtype
    modeling_llama.LlamaRotaryEmbedding.forward = _llama_rope_forward_f64
    modeling_qwen2.Qwen2RotaryEmbedding._set_cos_sin_cache = _qwen2_set_cos_sin_cache_f64
    torch.nn.functional.softmax = _softmax_keep_f64
    try:
        yield
    finally:
        for (c, n), f in zip(saved, originals):
            setattr(c, n, f)
        torch.nn.functional.softmax = _orig_softmax


# ---------------------------------------------------------------------------------------------
# Config, model, inputs

def config_json(spec):
    """The HF config.json-style object stored in the file's "config" attribute."""
    arch = {"lm": "LlamaForCausalLM" if spec["model_type"] == "llama" else "Qwen2ForCausalLM",
            "value": "LlamaForSequenceClassification"}[spec["head"]]
    j = dict(architectures=[arch], model_type=spec["model_type"], hidden_act="silu")
    j.update(DIMS)
    j.update(rope_theta=spec["rope_theta"], tie_word_embeddings=spec["tie_word_embeddings"],
             attention_bias=spec["attention_bias"], rope_style=spec["rope_style"],
             head=spec["head"])
    return j


def build_model(spec):
    """A float32 HF model with HF's default init (overwritten by init_params)."""
    common = dict(DIMS, rope_theta=spec["rope_theta"],
                  tie_word_embeddings=spec["tie_word_embeddings"], hidden_act="silu",
                  attn_implementation="eager", pad_token_id=None, rope_scaling=None,
                  attention_dropout=0.0)
    if spec["model_type"] == "qwen2":
        cfg = Qwen2Config(use_sliding_window=False, **common)
        model = Qwen2ForCausalLM(cfg)
    else:
        cfg = LlamaConfig(attention_bias=spec["attention_bias"], mlp_bias=False, **common)
        if spec["head"] == "value":
            cfg.num_labels = 1
            model = LlamaForSequenceClassification(cfg)
        else:
            model = LlamaForCausalLM(cfg)
    model.eval()  # no dropout (all rates are 0 anyway)
    return model


def is_no_decay(name):
    """OpenRLHF's get_optimizer_grouped_parameters: substring match against its no-decay list."""
    return any(nd in name for nd in NO_DECAY)


@torch.no_grad()
def init_params(model, gen):
    """Weights N(0, 0.02); norm weights U(0.9, 1.1); biases N(0, 0.05). Every value is rounded to
    bfloat16 (so it is exact in fp32 and in bf16), in named_parameters order from one generator."""
    for name, p in model.named_parameters():
        if name.endswith("norm.weight"):
            v = 1.0 + 0.1 * (2.0 * torch.rand(p.shape, generator=gen, dtype=F64) - 1.0)
        elif name.endswith("bias"):
            v = 0.05 * torch.randn(p.shape, generator=gen, dtype=F64)
        else:
            v = 0.02 * torch.randn(p.shape, generator=gen, dtype=F64)
        p.copy_(v.to(torch.bfloat16).to(p.dtype))


def make_inputs(gen):
    """input_ids (B,T) in [1, V); row PAD_ROW right-padded with PAD_ID after PAD_LEN tokens.
    targets[b,t] = input_ids[b,t+1], −1 at t = T−1 and at the padded tail of PAD_ROW."""
    V = DIMS["vocab_size"]
    ids = torch.randint(1, V, (B, T), generator=gen, dtype=torch.int64)
    ids[PAD_ROW, PAD_LEN:] = PAD_ID
    targets = torch.full((B, T), -1, dtype=torch.int64)
    targets[:, :-1] = ids[:, 1:]
    targets[PAD_ROW, PAD_LEN - 1:] = -1
    return ids, targets


def hf_head_output(model, spec, ids):
    """LM: logits (B,T,V) = lm_head(final-normed hidden); value: score(hidden)[..., 0] (B,T).
    No attention_mask: plain causal attention over all T positions, positions 0..T−1."""
    hidden = model.model(input_ids=ids, use_cache=False).last_hidden_state
    if spec["head"] == "lm":
        return model.lm_head(hidden)  # not model(...).logits, which casts to float32
    return model.score(hidden)[..., 0]


def token_logprobs(logits, targets):
    """lp[b,t] = log softmax(logits[b,t])[targets[b,t]], 0 where targets = −1."""
    mask = targets >= 0
    lsm = torch.log_softmax(logits, dim=-1)
    lp = lsm.gather(-1, targets.clamp(min=0)[..., None])[..., 0]
    return lp * mask


def lm_loss(logits, targets):
    mask = targets >= 0
    lp = token_logprobs(logits, targets)
    return -(lp.sum()) / mask.sum(), lp


# ---------------------------------------------------------------------------------------------
# Interleaved convention: HF rotate-half rows (i, i+D/2) <-> interleaved rows (2i, 2i+1)

def to_interleaved(name, t, spec):
    """Permutes q_proj/k_proj rows (weights, biases, their grads) from HF's rotate-half order to
    the interleaved order: per head, new row 2i = old row i, new row 2i+1 = old row i + D/2."""
    if spec["rope_style"] != "interleaved":
        return t
    if not (".self_attn.q_proj." in name or ".self_attn.k_proj." in name):
        return t
    D = DIMS["hidden_size"] // DIMS["num_attention_heads"]
    heads = t.shape[0] // D
    rest = t.shape[1:]
    return t.reshape(heads, 2, D // 2, *rest).transpose(1, 2).reshape(t.shape).contiguous()


# ---------------------------------------------------------------------------------------------
# Generation

def clone_model(model):
    m = copy.deepcopy(model)
    if m.config.tie_word_embeddings and hasattr(m, "lm_head"):
        m.tie_weights()
    return m


def train(model, spec, ids, targets):
    """K AdamW steps (two param groups), clip_grad_norm_ before each; returns losses, grad norms,
    the final loss and the final weights. Runs in the model's dtype (float64 here)."""
    named = list(model.named_parameters())
    decay = [p for n, p in named if not is_no_decay(n)]
    no_decay = [p for n, p in named if is_no_decay(n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": TRAIN["weight_decay"]},
                             {"params": no_decay, "weight_decay": 0.0}], lr=TRAIN["lr"],
                            betas=(TRAIN["beta1"], TRAIN["beta2"]), eps=TRAIN["eps"],
                            foreach=False)
    losses, norms = [], []
    for _ in range(TRAIN["steps"]):
        opt.zero_grad(set_to_none=True)
        loss, _ = lm_loss(hf_head_output(model, spec, ids), targets)
        loss.backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(),
                                                          TRAIN["max_norm"])))
        opt.step()
        losses.append(float(loss))
    with torch.no_grad():
        final_loss, _ = lm_loss(hf_head_output(model, spec, ids), targets)
    final = {n: p.detach().clone() for n, p in model.named_parameters()}
    return losses, norms, float(final_loss), final


def f32(t):
    return t.detach().to(torch.float32).numpy()


# Writing: byte-reproducible files (no object timestamps), compact v1.10 metadata (readable by
# HDF5 >= 1.10), big tensors deflate-compressed.

def create_h5(path):
    fapl = h5py.h5p.create(h5py.h5p.FILE_ACCESS)
    fapl.set_libver_bounds(h5py.h5f.LIBVER_V110, h5py.h5f.LIBVER_V110)
    fcpl = h5py.h5p.create(h5py.h5p.FILE_CREATE)
    fcpl.set_obj_track_times(False)
    return h5py.File(h5py.h5f.create(path.encode(), h5py.h5f.ACC_TRUNC, fcpl=fcpl, fapl=fapl))


def group(parent, name):
    gcpl = h5py.h5p.create(h5py.h5p.GROUP_CREATE)
    gcpl.set_obj_track_times(False)
    return h5py.Group(h5py.h5g.create(parent.id, name.encode(), gcpl=gcpl))


def put(parent, name, data):
    """Arrays of 1024+ elements: one chunk, shuffle + deflate level 9 (both built into libhdf5);
    smaller ones contiguous; scalars as 0-d datasets."""
    data = np.asarray(data)
    kw = dict(compression="gzip", compression_opts=9, shuffle=True) if data.size >= 1024 else {}
    return parent.create_dataset(name, data=data, track_times=False, **kw)


def generate(spec, out_dir):
    gen = torch.Generator().manual_seed(SEED)
    model32 = build_model(spec)
    init_params(model32, gen)
    ids, targets = make_inputs(gen)
    value_r = torch.randn(B, T, generator=gen, dtype=F64).to(torch.float32).to(F64)

    model = clone_model(model32).to(F64)
    if spec["tie_word_embeddings"]:
        assert model.lm_head.weight is model.model.embed_tokens.weight

    # Reference forward/backward in float64.
    with f64_patches():
        out = hf_head_output(model, spec, ids)
        if spec["head"] == "lm":
            loss, lp = lm_loss(out, targets)
        else:
            loss = (out * value_r).sum() / (B * T)
        model.zero_grad(set_to_none=True)
        loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    params = {n: p.detach().clone() for n, p in model.named_parameters()}

    # The patches only change precision: unpatched float32 HF agrees to fp32 round-off.
    with torch.no_grad():
        if spec["head"] == "lm":
            out32 = model32(input_ids=ids, use_cache=False).logits  # HF's own full forward
        else:  # the class pools at the last token; the per-token scores are score(hidden)
            out32 = model32.score(model32.model(input_ids=ids, use_cache=False).last_hidden_state)[..., 0]
    dev = (out32.to(F64) - out).abs().max().item()
    scale = out.abs().max().item()
    print(f"  unpatched fp32 HF vs patched fp64 HF: max |diff| {dev:.2e} (max |ref| {scale:.2e})")
    assert dev <= 1e-5 * max(scale, 1.0), "float64 patches changed the computation"

    train_out = None
    if spec["head"] == "lm":
        with f64_patches():
            train_out = train(clone_model(model), spec, ids, targets)

    path = os.path.join(out_dir, spec["file"])
    tmp = path + ".tmp"
    with create_h5(tmp) as f:
        a = f.attrs
        a["generator"] = GENERATOR
        a["generator_version"] = GENERATOR_VERSION
        a["torch_version"] = str(torch.__version__)
        a["transformers_version"] = str(transformers.__version__)
        a["h5py_version"] = str(h5py.__version__)
        a["hdf5_version"] = str(h5py.version.hdf5_version)
        a["seed"] = np.int64(SEED)
        a["config"] = json.dumps(config_json(spec))
        a["head"] = spec["head"]
        a["rope_style"] = spec["rope_style"]
        a["reference"] = (f"transformers {model.__class__.__name__} in float64 (RMSNorm, RoPE "
                          "tables and attention softmax kept in float64), eager attention, no "
                          "attention_mask (plain causal over all T), position ids 0..T-1")
        a["reference_dtype"] = "float64 forward/backward; stored results cast to float32"
        a["init"] = ("weights N(0,0.02), norm weights U(0.9,1.1), biases N(0,0.05); every initial "
                     "value rounded to bfloat16 (exact in fp32)")
        a["loss_definition"] = (
            "lm: loss = -sum(lp) / count(targets >= 0) (token-level mean)" if spec["head"] == "lm"
            else "value: loss = sum(values * value_r) / (B*T)")
        put(f, "input_ids", ids.numpy().astype(np.int32))
        if spec["head"] == "lm":
            put(f, "targets", targets.numpy().astype(np.int32))
            put(f, "logits", f32(out))
            put(f, "lp", f32(lp))
        else:
            put(f, "values", f32(out))
            put(f, "value_r", f32(value_r))
        put(f, "loss", np.float32(loss.item()))
        f["loss"].attrs["float64_value"] = np.float64(loss.item())
        gp, gg = group(f, "params"), group(f, "grads")
        for n, p in params.items():
            d = put(gp, n, f32(to_interleaved(n, p, spec)))
            d.attrs["weight_decay"] = np.int8(0 if is_no_decay(n) else 1)
        for n, g in grads.items():
            put(gg, n, f32(to_interleaved(n, g, spec)))
        if train_out is not None:
            losses, norms, final_loss, final = train_out
            gt = group(f, "train")
            gt.attrs["optimizer"] = ("torch.optim.AdamW(foreach=False), two param groups: "
                                     "weight_decay on every tensor whose name contains none of "
                                     + ", ".join(NO_DECAY) + "; the others 0")
            gt.attrs["clip"] = "torch.nn.utils.clip_grad_norm_(all params, max_norm) before each step"
            gt.attrs["dtype"] = "float64 (model, gradients, optimizer state); stored as float32"
            gt.attrs["schedule"] = "constant lr"
            for k, v in TRAIN.items():
                gt.attrs[k] = v
            put(gt, "losses", np.asarray(losses, dtype=np.float32))
            gt["losses"].attrs["float64_values"] = np.asarray(losses, dtype=np.float64)
            put(gt, "grad_norms", np.asarray(norms, dtype=np.float32))
            put(gt, "final_loss", np.float32(final_loss))
            gf = group(gt, "final")
            for n, p in final.items():
                put(gf, n, f32(to_interleaved(n, p, spec)))
    os.replace(tmp, path)
    print(f"  wrote {path} ({os.path.getsize(path) / 1024:.0f} KiB)")


# ---------------------------------------------------------------------------------------------
# Independent check: a plainly written Llama reading the file in the file's own conventions

def own_forward(P, cfg, ids, dtype):
    """P: HF name -> tensor (file convention). Returns the head output: logits (B,T,V) or
    values (B,T). RoPE pairs (i, i+D/2) for rotate_half, (2i, 2i+1) for interleaved, both with
    angle pos * theta^(-2i/D). Query head h reads KV head h // (H/Hkv)."""
    C, H, Hkv = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    D, eps, L = C // H, cfg["rms_norm_eps"], cfg["num_hidden_layers"]
    Bn, Tn = ids.shape
    qkv_bias = cfg["model_type"] == "qwen2" or cfg["attention_bias"]
    o_bias = cfg["attention_bias"] and cfg["model_type"] != "qwen2"

    def rms(x, w):
        return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps) * w

    def lin(x, name, bias):
        y = x @ P[name + ".weight"].T
        return y + P[name + ".bias"] if bias else y

    i = torch.arange(D // 2, dtype=F64)
    ang = torch.arange(Tn, dtype=F64)[:, None] * cfg["rope_theta"] ** (-2.0 * i / D)[None, :]
    cos, sin = ang.cos().to(dtype), ang.sin().to(dtype)  # (T, D/2)

    def rope(x):  # (B, T, heads, D)
        c, s = cos[None, :, None, :], sin[None, :, None, :]
        if cfg["rope_style"] == "rotate_half":
            a, b = x[..., : D // 2], x[..., D // 2:]
            return torch.cat((a * c - b * s, b * c + a * s), dim=-1)
        a, b = x[..., 0::2], x[..., 1::2]
        return torch.stack((a * c - b * s, b * c + a * s), dim=-1).reshape(x.shape)

    causal = torch.ones(Tn, Tn, dtype=torch.bool).tril()
    x = P["model.embed_tokens.weight"][ids]
    for layer in range(L):
        pre = f"model.layers.{layer}."
        h = rms(x, P[pre + "input_layernorm.weight"])
        q = rope(lin(h, pre + "self_attn.q_proj", qkv_bias).reshape(Bn, Tn, H, D))
        k = rope(lin(h, pre + "self_attn.k_proj", qkv_bias).reshape(Bn, Tn, Hkv, D))
        v = lin(h, pre + "self_attn.v_proj", qkv_bias).reshape(Bn, Tn, Hkv, D)
        heads = []
        for hh in range(H):
            kv = hh // (H // Hkv)
            s = q[:, :, hh] @ k[:, :, kv].transpose(1, 2) / math.sqrt(D)  # (B, T, T)
            s = s.masked_fill(~causal, float("-inf"))
            heads.append(torch.softmax(s, dim=-1) @ v[:, :, kv])
        x = x + lin(torch.stack(heads, dim=2).reshape(Bn, Tn, H * D), pre + "self_attn.o_proj",
                    o_bias)
        h = rms(x, P[pre + "post_attention_layernorm.weight"])
        g, u = lin(h, pre + "mlp.gate_proj", False), lin(h, pre + "mlp.up_proj", False)
        x = x + lin(g * torch.sigmoid(g) * u, pre + "mlp.down_proj", False)
    x = rms(x, P["model.norm.weight"])
    if cfg["head"] == "value":
        return (x @ P["score.weight"].T)[..., 0]
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
        loss, _ = lm_loss(own_forward(P, cfg, ids, dtype), targets)
        loss.backward()
        with torch.no_grad():
            total = math.sqrt(sum(float((t.grad.to(F64) ** 2).sum()) for t in P.values()))
            coef = min(TRAIN["max_norm"] / (total + 1e-6), 1.0)
            for n, p in P.items():
                g = p.grad * coef
                wd = 0.0 if is_no_decay(n) else TRAIN["weight_decay"]
                p.mul_(1 - lr * wd)
                m[n] = b1 * m[n] + (1 - b1) * g
                v[n] = b2 * v[n] + (1 - b2) * g * g
                denom = v[n].sqrt() / math.sqrt(1 - b2 ** step) + eps
                p.sub_(lr / (1 - b1 ** step) * m[n] / denom)
        losses.append(float(loss))
        norms.append(total)
    with torch.no_grad():
        final_loss, _ = lm_loss(own_forward(P, cfg, ids, dtype), targets)
    return losses, norms, float(final_loss), {n: t.detach() for n, t in P.items()}


def rel_max(a, b):
    """max |a − b| / max |b| (per tensor)."""
    return (a.to(F64) - b.to(F64)).abs().max().item() / max(b.to(F64).abs().max().item(), 1e-30)


def check(path):
    """Re-derives everything in the file with own_forward / own_train; raises on disagreement."""
    with h5py.File(path, "r") as f:
        cfg = json.loads(f.attrs["config"])
        ids = torch.from_numpy(f["input_ids"][...].astype(np.int64))
        P = {n: torch.from_numpy(f["params/" + n][...]).to(F64) for n in f["params"]}
        G = {n: torch.from_numpy(f["grads/" + n][...]) for n in f["grads"]}
        stored = {k: torch.from_numpy(np.asarray(f[k][...]))
                  for k in ("logits", "lp", "targets", "values", "value_r", "loss") if k in f}
        tr = None
        if "train" in f:
            tr = dict(losses=f["train/losses"][...], norms=f["train/grad_norms"][...],
                      final_loss=float(f["train/final_loss"][...]),
                      final={n: torch.from_numpy(f["train/final/" + n][...])
                             for n in f["train/final"]})
    assert set(G) == set(P)
    Pg = {n: t.clone().requires_grad_(True) for n, t in P.items()}
    out = own_forward(Pg, cfg, ids, F64)
    worst = {}
    if cfg["head"] == "lm":
        targets = stored["targets"].to(torch.int64)
        loss, lp = lm_loss(out, targets)
        worst["logits"] = rel_max(out.detach(), stored["logits"])
        worst["lp"] = rel_max(lp.detach(), stored["lp"])
    else:
        loss = (out * stored["value_r"].to(F64)).sum() / out.numel()
        worst["values"] = rel_max(out.detach(), stored["values"])
    worst["loss"] = rel_max(loss.detach(), stored["loss"])
    loss.backward()
    worst["grads"] = max(rel_max(Pg[n].grad, G[n]) for n in G)
    for k, e in worst.items():
        assert e < 1e-6, f"{path}: {k} disagrees with the independent re-derivation ({e:.2e})"
    msg = ", ".join(f"{k} {e:.1e}" for k, e in worst.items())
    print(f"  check {os.path.basename(path)}: own fp64 Llama vs file (rel max): {msg}")
    if tr is None:
        return
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
              f"{nbad}/{nall} weights off by > 1e-4")
        # Near-zero gradients (|g| ~ eps, e.g. k_proj.bias on slowly rotating RoPE pairs) make
        # Adam's update sensitive at ~lr/eps per unit of gradient, so even two float64 runs differ
        # there by ~1e-6; a wrong formula gives differences of order lr.
        if dtype == F64:
            assert dl < 1e-6 and dn < 1e-6 and dw < 1e-5, f"{path}: training trajectory differs"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "tests",
                                                  "fixtures"))
    ap.add_argument("--check-only", action="store_true", help="only re-check existing files")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)  # reproducible reductions
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, "
          f"h5py {h5py.__version__}, seed {SEED}")
    for spec in SPECS:
        print(spec["file"])
        if not args.check_only:
            generate(spec, args.out)
        check(os.path.join(args.out, spec["file"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
