#!/usr/bin/env python3
"""Decode throughput of rlhf next to Hugging Face transformers on the same real model (issue 15).

What it measures: tokens/s of (a) transformers `generate` on the CPU (PyTorch, fp32) and (b)
`rlhf bench generate --pretrain MODEL` (the rollout engine, fp32 weights, fp16 KV cache) on the
same GGUF file -- e.g. SmolLM2-135M-Instruct Q4_1 (scripts/get_model.sh smollm2-135m-instruct),
which both dequantise to fp32 -- with the same prompts (the B x prompt_len random token ids that
rlhf's bench draws: std::mt19937_64(seed) + libstdc++'s uniform_int_distribution, reproduced
here), the same number of new tokens (EOS ignored on both sides) and the same thread count, and
prints rlhf/transformers per batch size.

How:
  * decode only: rlhf reports decode tokens/s (tokens of the decode steps over their time; the
    first token comes out of the prefill). For transformers a logits processor timestamps every
    step; the first call follows the prefill forward, so decode tokens/s = B*(N-1) / (t_N - t_1),
    the same definition. Whole-call tokens/s (prefill included) is printed for both too.
  * the same protocol on both sides: rlhf's bench does one untimed warm-up and keeps the fastest
    of 3 timed runs per batch; transformers gets one untimed warm-up per batch (once, the model
    stays loaded) and the fastest of --hf_inner (default 3) timed runs per batch in every round.
  * interleaved: each round runs one rlhf process (all batch sizes) and the transformers runs, in
    alternating order (rlhf first in even rounds, transformers first in odd ones), so drift of a
    shared machine hits both; the summary gives medians over rounds with min-max, and the median
    of the per-round ratios.
  * threads: --threads (default: every core this process may run on) for both: OMP_NUM_THREADS,
    MKL_NUM_THREADS and torch.set_num_threads for transformers, OMP_NUM_THREADS and --threads for
    rlhf.
  * sampling: rlhf's bench samples at temperature 1; transformers decodes greedily (the cost of
    the token choice is negligible next to the forward), or samples at temperature 1 with no
    top-k/top-p under --hf_sample.

bf16 (issue 24): --param_dtype bf16 runs transformers with the model cast to bfloat16
(`model.to(torch.bfloat16)`: bf16 weights and activations, PyTorch's bf16 CPU kernels) and rlhf
`bench generate --param_dtype bf16` (its bf16 engine: bf16 weights, oneDNN prefill, the bf16
packed decode kernel), whose "fixed_bf16" rows are compared. Name the CPU and its ISA with the
figures: where the CPU has no AVX512-BF16 / AMX, both sides emulate bf16 arithmetic.

--model_config TOML (in place of --gguf) runs both sides at a model's shape with random weights: rlhf
`bench generate --model_config TOML`, transformers a LlamaForCausalLM built from the same keys (rlhf's
TOML uses Hugging Face's config names; weights drawn with torch.manual_seed(--seed)). Decode cost
does not depend on the weights' values (EOS is ignored on both sides), so this measures a machine
that has PyTorch but not the model file (the GPU machine's CPU, scripts/gpu_check.sh amx).

rlhf bench generate has a fixed 64-token prompt and 128 new tokens; --prompt_len / --new_tokens
must match what it reports (the script stops if they do not).

Usage (in a virtual environment: pip install torch transformers gguf accelerate):
  python3 scripts/bench_transformers.py --rlhf build/rlhf \\
      --gguf "$(scripts/get_model.sh smollm2-135m-instruct)" --batches 1,16 --rounds 5

Output: one JSON line per run and per summary row on stdout ({"bench": "transformers_side_by_side",
...}), a table at the end; progress on stderr. Not part of CI; the rlhf binary never needs Python.
"""

import argparse
import json
import os
import platform
import subprocess
import sys
import time

from bench_common import Reporter, cpu_name, rlhf_version, spread  # next to this file
from libstdcxx_random import MT19937_64, uniform_below  # next to this file


def parse_args():
    p = argparse.ArgumentParser(
        description=__doc__.split("\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rlhf", default="build/rlhf", help="the rlhf binary (default build/rlhf)")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--gguf", help="the GGUF model file (both systems load it)")
    src.add_argument("--model_config",
                     help="an rlhf model TOML (Hugging Face config names): both systems at that "
                          "shape with random weights")
    p.add_argument("--batches", default="1,16", help="comma list of batch sizes (default 1,16)")
    p.add_argument("--prompt_len", type=int, default=64,
                   help="prompt tokens per sequence (default 64, rlhf bench's fixed length)")
    p.add_argument("--new_tokens", type=int, default=128,
                   help="new tokens per sequence (default 128, rlhf bench's fixed count)")
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 1
    p.add_argument("--threads", type=int, default=cores,
                   help=f"threads for both systems (default all cores here: {cores})")
    p.add_argument("--rounds", type=int, default=5,
                   help="interleaved rounds (one rlhf process + the transformers runs each)")
    p.add_argument("--hf_inner", type=int, default=3,
                   help="timed transformers runs per batch per round, fastest kept (default 3, "
                        "as rlhf's bench)")
    p.add_argument("--seed", type=int, default=42, help="rlhf --seed (prompts, sampling)")
    p.add_argument("--param_dtype", default="fp32", choices=["fp32", "bf16"],
                   help="both sides in fp32 (default) or bf16 (transformers: the model cast to "
                        "bfloat16; rlhf: --param_dtype bf16, its bf16 engine)")
    p.add_argument("--hf_sample", action="store_true",
                   help="transformers samples (temperature 1, no top-k/top-p) instead of greedy")
    p.add_argument("--output", help="also append the JSON lines to this file")
    a = p.parse_args()
    a.batch_list = [int(b) for b in a.batches.split(",") if b.strip()]
    if not a.batch_list or min(a.batch_list) < 1:
        p.error("--batches: sizes >= 1")
    if a.threads < 1 or a.rounds < 1 or a.hf_inner < 1 or a.new_tokens < 2 or a.prompt_len < 1:
        p.error("--threads, --rounds, --hf_inner, --prompt_len >= 1 and --new_tokens >= 2")
    return a


ARGS = parse_args()
# Thread counts before torch is imported (its OpenMP pool reads them at start-up).
for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ[var] = str(ARGS.threads)

import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import AutoModelForCausalLM, LogitsProcessor, LogitsProcessorList  # noqa: E402

transformers.logging.set_verbosity_error()
transformers.utils.logging.disable_progress_bar()
REPORT = Reporter("transformers_side_by_side", "bench_transformers", ARGS.output)
emit, log = REPORT.emit, REPORT.log


# --- rlhf's prompts: std::mt19937_64 and libstdc++'s uniform_int_distribution ----------------

def rlhf_prompts(seed, vocab, prompt_len, batches):
    """The prompts of rlhf bench generate's fixed runs: one generator, batch sizes in order,
    request after request, prompt_len tokens each."""
    gen = MT19937_64(seed)
    return {b: [[uniform_below(gen, vocab) for _ in range(prompt_len)] for _ in range(b)]
            for b in batches}


# --- transformers ---------------------------------------------------------------------------

class StepClock(LogitsProcessor):
    """Called once per generated token, after that step's forward: timestamps."""

    def __init__(self):
        self.t = []

    def __call__(self, input_ids, scores):
        self.t.append(time.perf_counter())
        return scores


def load_hf(gguf, bf16=False):
    d, name = os.path.split(os.path.abspath(gguf))
    kw = {"gguf_file": name}
    try:
        model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32, **kw)
    except TypeError:
        model = AutoModelForCausalLM.from_pretrained(d, torch_dtype=torch.float32, **kw)
    if bf16:
        model = model.to(torch.bfloat16)  # the dequantised fp32 weights rounded to bf16
    model.eval()
    return model


def load_hf_config(toml_path, seed, bf16=False):
    """A LlamaForCausalLM at the shape of rlhf's model TOML, random weights (torch seed `seed`)."""
    import tomllib
    from transformers import LlamaConfig, LlamaForCausalLM
    with open(toml_path, "rb") as f:
        c = tomllib.load(f)
    if c.get("model_type", "llama") != "llama":
        sys.exit(f"bench_transformers: {toml_path}: model_type {c['model_type']!r}: only llama")
    keys = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
            "num_attention_heads", "num_key_value_heads", "max_position_embeddings",
            "rms_norm_eps", "rope_theta", "tie_word_embeddings", "bos_token_id", "eos_token_id",
            "pad_token_id")
    torch.manual_seed(seed)
    model = LlamaForCausalLM(LlamaConfig(**{k: c[k] for k in keys if k in c}))
    if bf16:
        model = model.to(torch.bfloat16)
    model.eval()
    return model


def hf_generate(model, ids, new_tokens, sample):
    clock = StepClock()
    kw = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens,  # EOS cannot end it early
              logits_processor=LogitsProcessorList([clock]),
              pad_token_id=model.config.eos_token_id if model.config.eos_token_id is not None
              else 0)
    if sample:
        kw.update(do_sample=True, temperature=1.0, top_k=0, top_p=1.0)
    else:
        kw.update(do_sample=False)
    mask = torch.ones_like(ids)
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=mask, **kw)
    t1 = time.perf_counter()
    B = ids.shape[0]
    assert out.shape == (B, ids.shape[1] + new_tokens), out.shape
    assert len(clock.t) == new_tokens, len(clock.t)
    decode_s = clock.t[-1] - clock.t[0]
    return {"tokens_per_s": B * new_tokens / (t1 - t0),
            "decode_tokens_per_s": B * (new_tokens - 1) / decode_s,
            "step_ms": decode_s / (new_tokens - 1) * 1e3,
            "prefill_s": clock.t[0] - t0, "decode_s": decode_s, "total_s": t1 - t0}


# --- rlhf -----------------------------------------------------------------------------------

def run_rlhf(args):
    source = ["--pretrain", args.gguf] if args.gguf else ["--model_config", args.model_config]
    cmd = [args.rlhf, "bench", "generate", *source, "--gen_batches",
           ",".join(str(b) for b in args.batch_list), "--gen_long_requests", "0",
           "--gen_long_fixed_batch", "0", "--threads", str(args.threads), "--seed", str(args.seed),
           "--disable_progress", "--device", "cpu", "--param_dtype", args.param_dtype]
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"bench_transformers: {' '.join(cmd)} failed ({r.returncode}):\n"
                 f"{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    rows = {}
    for line in r.stdout.splitlines():
        if not line.startswith("{"):
            continue
        row = json.loads(line)
        # bf16: the bench also runs fp32 ("fixed"); its bf16 engine's rows are "fixed_bf16".
        want = "fixed_bf16" if args.param_dtype == "bf16" else "fixed"
        if row.get("bench") == "generate" and row.get("run") == want:
            rows[int(row["batch"])] = row
    missing = [b for b in args.batch_list if b not in rows]
    if missing:
        sys.exit(f"bench_transformers: no rlhf generate rows for batch {missing}:\n{r.stdout}")
    for b, row in rows.items():
        if (row["prompt_len"], row["new_tokens"]) != (args.prompt_len, args.new_tokens):
            sys.exit(f"bench_transformers: rlhf bench generate ran {row['prompt_len']}-token "
                     f"prompts and {row['new_tokens']} new tokens (its lengths are fixed); pass "
                     f"--prompt_len {row['prompt_len']} --new_tokens {row['new_tokens']}")
        if row.get("threads") != args.threads:
            sys.exit(f"bench_transformers: rlhf ran {row.get('threads')} threads, not "
                     f"{args.threads}")
    return cmd, rows


def main():
    a = ARGS
    torch.set_num_threads(a.threads)
    try:
        import gguf
        gguf_version = getattr(gguf, "__version__", None)
        if gguf_version is None:
            from importlib.metadata import version
            gguf_version = version("gguf")
    except ImportError:
        gguf_version = None
    env = {"python": platform.python_version(), "torch": torch.__version__,
           "transformers": transformers.__version__, "gguf": gguf_version,
           "torch_threads": torch.get_num_threads(), "threads": a.threads, "cpu": cpu_name(),
           "rlhf": rlhf_version(a.rlhf),
           "model": os.path.basename(a.gguf or a.model_config) +
           ("" if a.gguf else " (random weights)"),
           "batches": a.batch_list, "prompt_len": a.prompt_len, "new_tokens": a.new_tokens,
           "rounds": a.rounds, "hf_inner": a.hf_inner, "param_dtype": a.param_dtype,
           "hf_decoding": "sample t=1" if a.hf_sample else "greedy"}
    emit({"row": "env", **env})

    if a.gguf:
        log(f"loading {a.gguf} in transformers (dequantised to fp32, run in {a.param_dtype})")
        model = load_hf(a.gguf, a.param_dtype == "bf16")
    else:
        log(f"building {a.model_config} in transformers (random weights, {a.param_dtype})")
        model = load_hf_config(a.model_config, a.seed, a.param_dtype == "bf16")
    vocab = model.config.vocab_size
    prompts = {b: torch.tensor(p, dtype=torch.long)
               for b, p in rlhf_prompts(a.seed, vocab, a.prompt_len, a.batch_list).items()}
    for b in a.batch_list:  # untimed warm-up, as rlhf's bench does per batch
        log(f"transformers warm-up, batch {b}")
        hf_generate(model, prompts[b], a.new_tokens, a.hf_sample)

    results = {"rlhf": {b: [] for b in a.batch_list}, "transformers": {b: [] for b in a.batch_list}}
    rlhf_cmd = None
    for rnd in range(a.rounds):
        order = ["rlhf", "transformers"] if rnd % 2 == 0 else ["transformers", "rlhf"]
        for system in order:
            if system == "rlhf":
                log(f"round {rnd + 1}/{a.rounds}: rlhf")
                rlhf_cmd, rows = run_rlhf(a)
                for b in a.batch_list:
                    row = rows[b]
                    res = {k: row[k] for k in ("tokens_per_s", "decode_tokens_per_s", "step_ms",
                                               "prefill_s", "decode_s", "total_s")}
                    results["rlhf"][b].append(res)
                    emit({"row": "run", "system": "rlhf", "round": rnd, "batch": b, **res})
            else:
                for b in a.batch_list:
                    log(f"round {rnd + 1}/{a.rounds}: transformers batch {b}")
                    runs = [hf_generate(model, prompts[b], a.new_tokens, a.hf_sample)
                            for _ in range(a.hf_inner)]
                    res = min(runs, key=lambda r: r["total_s"])  # the fastest, as rlhf's bench
                    results["transformers"][b].append(res)
                    emit({"row": "run", "system": "transformers", "round": rnd, "batch": b, **res})

    lines = []
    for b in a.batch_list:
        r = [x["decode_tokens_per_s"] for x in results["rlhf"][b]]
        h = [x["decode_tokens_per_s"] for x in results["transformers"][b]]
        rt = [x["tokens_per_s"] for x in results["rlhf"][b]]
        ht = [x["tokens_per_s"] for x in results["transformers"][b]]
        ratios = [x / y for x, y in zip(r, h)]
        row = {"row": "summary", "batch": b, "rounds": a.rounds,
               "rlhf_decode_tokens_per_s": spread(r), "transformers_decode_tokens_per_s": spread(h),
               "ratio": spread(ratios),
               "rlhf_tokens_per_s": spread(rt), "transformers_tokens_per_s": spread(ht),
               "ratio_whole_call": spread([x / y for x, y in zip(rt, ht)])}
        emit(row)
        lines.append(row)

    def fmt(s, f="{:.1f}"):
        return f"{f.format(s['median'])} ({f.format(s['min'])}-{f.format(s['max'])})"

    print()
    print(f"model {env['model']}, {a.param_dtype}, {a.threads} threads, prompt {a.prompt_len}, "
          f"{a.new_tokens} new tokens, {a.rounds} rounds; torch {env['torch']}, transformers "
          f"{env['transformers']}, gguf {env['gguf']}; {env['cpu']}")
    print("decode tokens/s, median over rounds (min-max); ratio = median of per-round "
          "rlhf/transformers")
    hdr = f"{'batch':>5} | {'rlhf':>22} | {'transformers':>22} | {'ratio':>18} | {'ratio whole call':>18}"
    print(hdr)
    print("-" * len(hdr))
    for row in lines:
        print(f"{row['batch']:>5} | {fmt(row['rlhf_decode_tokens_per_s']):>22} | "
              f"{fmt(row['transformers_decode_tokens_per_s']):>22} | "
              f"{fmt(row['ratio'], '{:.2f}'):>18} | {fmt(row['ratio_whole_call'], '{:.2f}'):>18}")
    print(f"rlhf command: OMP_NUM_THREADS={a.threads} {' '.join(rlhf_cmd)}")


if __name__ == "__main__":
    main()
