#!/usr/bin/python3
"""Independent references for the real-model tests (tests/io/test_pretrained.cpp).

  stories260k     A NumPy float32 port of llama2.c's forward pass (run.c: RMSNorm eps 1e-5,
                  interleaved RoPE computed from pos * 10000^(-2i/D), GQA, SwiGLU, tied classifier)
                  reading ../shared/data/stories260K/stories260K.bin and tok512.bin directly. It
                  decodes greedily from BOS for 200 steps, as `./run stories260K.bin -z tok512.bin
                  -t 0 -n 200` does, and prints the token ids and the text the way run.c prints it
                  (leading space stripped after BOS, <0xXX> pieces as bytes).
  tinystories_nll Hugging Face transformers' LlamaForCausalLM (run in float64 on the bf16 weights
                  of ../shared/data/tinystories-656k/bf16_upstream) and the `tokenizers` library:
                  mean next-token NLL (nats) over the model card story (145 tokens with
                  <|start_story|>, 144 predictions).

Usage:
    /usr/bin/python3 scripts/reference_models.py stories260k [--data ../shared/data]
    /usr/bin/python3 scripts/reference_models.py tinystories_nll [--data ../shared/data]
Needs numpy; tinystories_nll also torch (tested 1.13), transformers (4.44.2), tokenizers (0.19.1).
The numbers the tests use were printed by these commands; see the test file for them.
"""

import argparse
import json
import os
import re
import struct
import sys

import numpy as np


def load_llama2c(path):
    raw = open(path, "rb").read()
    dim, hidden, n_layers, n_heads, n_kv, vocab, seq_len = struct.unpack("7i", raw[:28])
    shared = vocab > 0
    vocab = abs(vocab)
    f = np.frombuffer(raw[28:], dtype=np.float32)
    hs = dim // n_heads
    kv_dim = n_kv * hs
    pos = 0

    def take(*shape):
        nonlocal pos
        n = int(np.prod(shape))
        a = f[pos:pos + n].reshape(shape)
        pos += n
        return a

    w = {}
    w["emb"] = take(vocab, dim)
    w["rms_att"] = take(n_layers, dim)
    w["wq"] = take(n_layers, dim, dim)
    w["wk"] = take(n_layers, kv_dim, dim)
    w["wv"] = take(n_layers, kv_dim, dim)
    w["wo"] = take(n_layers, dim, dim)
    w["rms_ffn"] = take(n_layers, dim)
    w["w1"] = take(n_layers, hidden, dim)
    w["w2"] = take(n_layers, dim, hidden)
    w["w3"] = take(n_layers, hidden, dim)
    w["rms_final"] = take(dim)
    pos += seq_len * hs  # freq_cis_real, freq_cis_imag (unused by run.c)
    w["wcls"] = w["emb"] if shared else take(vocab, dim)
    assert pos == f.size, (pos, f.size)
    cfg = dict(dim=dim, hidden=hidden, n_layers=n_layers, n_heads=n_heads, n_kv=n_kv, vocab=vocab,
               seq_len=seq_len)
    return cfg, w


def load_tok(path, vocab):
    raw = open(path, "rb").read()
    off = 4
    pieces, scores = [], []
    for _ in range(vocab):
        score, n = struct.unpack_from("fi", raw, off)
        off += 8
        pieces.append(raw[off:off + n])
        off += n
        scores.append(score)
    return pieces, scores


def rmsnorm(x, w):
    ss = np.float32(np.mean(x * x, dtype=np.float32)) + np.float32(1e-5)
    return w * (x / np.sqrt(ss, dtype=np.float32))


def stories260k(data):
    d = os.path.join(data, "stories260K")
    c, w = load_llama2c(os.path.join(d, "stories260K.bin"))
    pieces, _ = load_tok(os.path.join(d, "tok512.bin"), c["vocab"])
    dim, hs = c["dim"], c["dim"] // c["n_heads"]
    kv_mul = c["n_heads"] // c["n_kv"]
    kcache = np.zeros((c["n_layers"], c["seq_len"], c["n_kv"] * hs), np.float32)
    vcache = np.zeros_like(kcache)

    def rope(v, pos):
        out = v.copy()
        for i in range(0, v.size, 2):
            freq = np.float32(1.0) / np.float32(10000.0) ** (np.float32(i % hs) / np.float32(hs))
            val = np.float32(pos) * freq
            fcr, fci = np.cos(val, dtype=np.float32), np.sin(val, dtype=np.float32)
            out[i] = v[i] * fcr - v[i + 1] * fci
            out[i + 1] = v[i] * fci + v[i + 1] * fcr
        return out

    def forward(token, pos):
        x = w["emb"][token].copy()
        for l in range(c["n_layers"]):
            xb = rmsnorm(x, w["rms_att"][l])
            q = rope(w["wq"][l] @ xb, pos)
            k = rope(w["wk"][l] @ xb, pos)
            kcache[l, pos] = k
            vcache[l, pos] = w["wv"][l] @ xb
            att_out = np.zeros(dim, np.float32)
            for h in range(c["n_heads"]):
                qh = q[h * hs:(h + 1) * hs]
                kh = kcache[l, :pos + 1, (h // kv_mul) * hs:(h // kv_mul + 1) * hs]
                vh = vcache[l, :pos + 1, (h // kv_mul) * hs:(h // kv_mul + 1) * hs]
                s = (kh @ qh) / np.sqrt(np.float32(hs))
                p = np.exp(s - s.max())
                p /= p.sum()
                att_out[h * hs:(h + 1) * hs] = p @ vh
            x = x + w["wo"][l] @ att_out
            xb = rmsnorm(x, w["rms_ffn"][l])
            h1 = w["w1"][l] @ xb
            h3 = w["w3"][l] @ xb
            x = x + w["w2"][l] @ ((h1 / (np.float32(1) + np.exp(-h1))) * h3)
        return w["wcls"] @ rmsnorm(x, w["rms_final"])

    token, out, ids = 1, b"", []
    for pos in range(200):
        nxt = int(np.argmax(forward(token, pos)))
        if nxt == 1:
            break
        ids.append(nxt)
        piece = pieces[nxt]
        if token == 1 and piece.startswith(b" "):
            piece = piece[1:]
        m = re.fullmatch(rb"<0x([0-9A-Fa-f]{2})>", piece)
        if m:
            b = int(m.group(1), 16)
            piece = bytes([b]) if (32 <= b < 127 or chr(b).isspace()) else b""
        out += piece
        token = nxt
    print("ids:", json.dumps(ids))
    print("text:", json.dumps(out.decode("utf-8", errors="replace")))


def tinystories_nll(data):
    import torch
    from tokenizers import Tokenizer
    from transformers import LlamaForCausalLM

    d = os.path.join(data, "tinystories-656k", "bf16_upstream")
    card = open(os.path.join(d, "README.md"), encoding="utf-8").read()
    story = re.search(r"Generation example:\s*```\n(.*?)\n```", card, re.S).group(1)
    story = story.replace("<|end_story|>", "")
    ids = Tokenizer.from_file(os.path.join(d, "tokenizer.json")).encode(story).ids
    model = LlamaForCausalLM.from_pretrained(d, torch_dtype=torch.float64)
    model.eval()
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0]
    lp = torch.log_softmax(logits[:-1], dim=-1)
    nll = -lp[torch.arange(len(ids) - 1), torch.tensor(ids[1:])]
    print("tokens:", len(ids), "predictions:", len(ids) - 1)
    print("mean NLL (nats/token): %.10f" % nll.mean().item())
    print("first logits (pos 0, ids 0..4):", [round(v, 8) for v in logits[0, :5].tolist()])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=["stories260k", "tinystories_nll"])
    ap.add_argument("--data", default=os.path.join(os.path.dirname(__file__), "..", "..", "shared",
                                                   "data"))
    args = ap.parse_args()
    {"stories260k": stories260k, "tinystories_nll": tinystories_nll}[args.what](args.data)


if __name__ == "__main__":
    main()
