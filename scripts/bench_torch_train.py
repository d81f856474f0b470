#!/usr/bin/env python3
"""Training throughput of rlhf next to PyTorch on the CPU, fp32 and bf16, at one model shape (issue 24).

What it measures: tokens/s of one optimizer step of next-token training (forward, backward, AdamW)
at the shape of --model_config (default examples/models/smollm-135M.toml: SmolLM-135M, 30 layers,
576 hidden, tied 49,152-token embeddings), --seqs sequences of --seq_len tokens a step (default
8 x 256), random token ids, random init, on --threads threads, of:
  * PyTorch fp32: transformers' LlamaForCausalLM built from the same config (float32 weights),
    torch.optim.AdamW;
  * PyTorch bf16 autocast: the same fp32 model and optimizer, the forward and loss under
    torch.autocast("cpu", dtype=torch.bfloat16) (bf16 matmuls, fp32 master weights) -- what
    PyTorch users run for bf16 on a CPU;
  * rlhf: `rlhf bench train --model_config ... --param_dtype bf16`, which runs the fp32 step and
    the bf16 step (oneDNN bf16 GEMMs, fp32 master weights, gradients and AdamW moments) in one
    process and reports each step's tokens/s, the same run's oneDNN bf16 GEMM rate
    (ratio_to_gemm) and the CPU's ISA.

Protocol: every side does --warmup untimed steps, then --steps timed ones; a side's figure is
the median step. Rounds alternate the order (rlhf first in even rounds); the summary gives
medians over rounds and the median of the per-round ratios. Threads: OMP_NUM_THREADS and
torch.set_num_threads for PyTorch, OMP_NUM_THREADS and --threads for rlhf.

Name the CPU and its ISA with the figures (the env row has both): without AVX512-BF16 or AMX,
oneDNN and PyTorch both emulate bf16 arithmetic, and bf16 runs slower than fp32 on both.

Usage (in a virtual environment: pip install torch transformers):
  python3 scripts/bench_torch_train.py --rlhf build/rlhf --threads 2 --rounds 3

Output: one JSON line per run and per summary row on stdout ({"bench": "torch_train_side_by_side",
...}), a table at the end; progress on stderr. Not part of CI; the rlhf binary never needs Python.
"""

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

try:
    import tomllib
except ImportError:  # Python < 3.11
    tomllib = None

from bench_common import Reporter, cpu_name, rlhf_version, spread  # next to this file

HERE = os.path.dirname(os.path.abspath(__file__))


def parse_args():
    p = argparse.ArgumentParser(
        description=__doc__.split("\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rlhf", default="build/rlhf", help="the rlhf binary (default build/rlhf)")
    p.add_argument("--model_config",
                   default=os.path.join(HERE, "..", "examples", "models", "smollm-135M.toml"),
                   help="rlhf model config TOML (default examples/models/smollm-135M.toml)")
    p.add_argument("--seqs", type=int, default=8, help="sequences per step (default 8)")
    p.add_argument("--seq_len", type=int, default=256, help="tokens per sequence (default 256)")
    p.add_argument("--threads", type=int, default=2, help="threads for both (default 2)")
    p.add_argument("--steps", type=int, default=3, help="timed steps per run (default 3)")
    p.add_argument("--warmup", type=int, default=1, help="untimed steps per run (default 1)")
    p.add_argument("--rounds", type=int, default=1, help="interleaved rounds (default 1)")
    p.add_argument("--lr", type=float, default=1e-4, help="AdamW learning rate (default 1e-4)")
    p.add_argument("--seed", type=int, default=42, help="seed (init, tokens)")
    p.add_argument("--skip_rlhf", action="store_true", help="PyTorch only")
    p.add_argument("--output", help="also append the JSON lines to this file")
    return p.parse_args()


ARGS = parse_args()
os.environ["OMP_NUM_THREADS"] = str(ARGS.threads)  # before torch starts its thread pool
import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

REPORT = Reporter("torch_train_side_by_side", "bench_torch_train", ARGS.output)
emit, log = REPORT.emit, REPORT.log


def read_config(path):
    """The rlhf TOML model config as a dict (tomllib; a minimal key = value reader before 3.11)."""
    with open(path, "rb") as f:
        if tomllib is not None:
            return tomllib.load(f)
        out = {}
        for line in f.read().decode().splitlines():
            line = line.split("#", 1)[0].strip()
            if "=" in line:
                k, v = (x.strip() for x in line.split("=", 1))
                out[k] = json.loads(v.lower() if v in ("true", "false") else v)
        return out


def hf_model(cfg, seed):
    if cfg.get("model_type", "llama") != "llama":
        sys.exit(f"bench_torch_train: model_type {cfg.get('model_type')}: only llama configs")
    c = LlamaConfig(vocab_size=cfg["vocab_size"], hidden_size=cfg["hidden_size"],
                    intermediate_size=cfg["intermediate_size"],
                    num_hidden_layers=cfg["num_hidden_layers"],
                    num_attention_heads=cfg["num_attention_heads"],
                    num_key_value_heads=cfg.get("num_key_value_heads",
                                                cfg["num_attention_heads"]),
                    max_position_embeddings=cfg.get("max_position_embeddings", 2048),
                    rms_norm_eps=cfg.get("rms_norm_eps", 1e-5),
                    rope_theta=cfg.get("rope_theta", 10000.0),
                    tie_word_embeddings=cfg.get("tie_word_embeddings", False))
    c._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    return LlamaForCausalLM(c).float().train()


def torch_run(model, autocast, a):
    """Median step seconds of --steps timed training steps (after --warmup)."""
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, 0.95), weight_decay=0.0)
    g = torch.Generator().manual_seed(a.seed)
    vocab = model.config.vocab_size
    times = []
    for s in range(a.warmup + a.steps):
        ids = torch.randint(0, vocab, (a.seqs, a.seq_len), generator=g)
        t0 = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        t = time.perf_counter() - t0
        if s >= a.warmup:
            times.append(t)
    return statistics.median(times)


def rlhf_run(a):
    """rlhf bench train's fp32 and bf16 rows (param_dtype -> row) and its command."""
    cmd = [a.rlhf, "bench", "train", "--model_config", a.model_config,
           "--tokens_per_step", str(a.seqs * a.seq_len), "--seq_len", str(a.seq_len),
           "--steps", str(a.steps), "--warmup", str(a.warmup), "--threads", str(a.threads),
           "--param_dtype", "bf16", "--device", "cpu", "--seed", str(a.seed),
           "--disable_progress", "--log_level", "warn"]
    r = subprocess.run(cmd, env=dict(os.environ, OMP_NUM_THREADS=str(a.threads)),
                       capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"bench_torch_train: {' '.join(cmd)} failed ({r.returncode}):\n"
                 f"{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    rows = {}
    for line in r.stdout.splitlines():
        if line.startswith("{"):
            row = json.loads(line)
            if row.get("bench") == "train":
                rows[row["param_dtype"]] = row
    if set(rows) != {"fp32", "bf16"}:
        sys.exit(f"bench_torch_train: rlhf bench train gave no fp32 and bf16 rows:\n{r.stdout}")
    return rows, cmd


def main():
    a = ARGS
    torch.set_num_threads(a.threads)
    cfg = read_config(a.model_config)
    env = {"python": platform.python_version(), "torch": torch.__version__,
           "transformers": transformers.__version__, "torch_threads": torch.get_num_threads(),
           "threads": a.threads, "cpu": cpu_name(),
           "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
           "rlhf": None if a.skip_rlhf else rlhf_version(a.rlhf),
           "model_config": os.path.basename(a.model_config), "seqs": a.seqs,
           "seq_len": a.seq_len, "steps": a.steps, "warmup": a.warmup, "rounds": a.rounds}
    emit({"row": "env", **env})
    log(f"building the PyTorch model of {env['model_config']}")
    model = hf_model(cfg, a.seed)
    tokens = a.seqs * a.seq_len
    systems = ["torch_fp32", "torch_bf16_autocast"] + ([] if a.skip_rlhf else ["rlhf"])
    res = {k: [] for k in ["torch_fp32", "torch_bf16_autocast", "rlhf_fp32", "rlhf_bf16"]}
    rlhf_cmd, isa = None, None
    for rnd in range(a.rounds):
        order = systems if rnd % 2 == 0 else list(reversed(systems))
        for system in order:
            log(f"round {rnd + 1}/{a.rounds}: {system}")
            if system == "rlhf":
                rows, rlhf_cmd = rlhf_run(a)
                isa = rows["bf16"].get("isa")
                for dt in ("fp32", "bf16"):
                    tps = rows[dt]["tokens_per_s"]
                    res[f"rlhf_{dt}"].append(tps)
                    emit({"row": "run", "system": f"rlhf_{dt}", "round": rnd, "tokens_per_s": tps,
                          **{k: rows[dt][k] for k in ("ratio_to_gemm", "ratio_to_sgemm", "isa",
                                                      "onednn_impl") if k in rows[dt]}})
            else:
                step = torch_run(model, system == "torch_bf16_autocast", a)
                res[system].append(tokens / step)
                emit({"row": "run", "system": system, "round": rnd, "step_s": step,
                      "tokens_per_s": tokens / step})
    summary = {"row": "summary", "cpu": env["cpu"], "isa": isa,
               **{f"{k}_tokens_per_s": spread(v) for k, v in res.items() if v}}
    if res["rlhf_bf16"]:
        for ref in ("torch_bf16_autocast", "torch_fp32"):
            summary[f"rlhf_bf16_vs_{ref}"] = spread(
                [x / y for x, y in zip(res["rlhf_bf16"], res[ref])])
        summary["rlhf_fp32_vs_torch_fp32"] = spread(
            [x / y for x, y in zip(res["rlhf_fp32"], res["torch_fp32"])])
    emit(summary)

    print()
    print(f"{env['model_config']}, {a.seqs} x {a.seq_len} tokens a step, {a.threads} threads, "
          f"{a.rounds} rounds; torch {env['torch']} ({env['torch_cpu_capability']}), "
          f"transformers {env['transformers']}; {env['cpu']}; rlhf ISA {isa}")
    print("tokens/s, median over rounds (min-max)")
    for k, v in res.items():
        if v:
            s = spread(v)
            print(f"  {k:>22}: {s['median']:.1f} ({s['min']:.1f}-{s['max']:.1f})")
    for k in ("rlhf_bf16_vs_torch_bf16_autocast", "rlhf_bf16_vs_torch_fp32",
              "rlhf_fp32_vs_torch_fp32"):
        if k in summary:
            print(f"  {k}: {summary[k]['median']:.2f}")
    if rlhf_cmd:
        print(f"rlhf command: OMP_NUM_THREADS={a.threads} {' '.join(rlhf_cmd)}")


if __name__ == "__main__":
    main()
