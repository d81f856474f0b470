#!/usr/bin/env python3
"""One GRPO step of rlhf next to TRL's GRPOTrainer on the CPU, same real model, same prompts.

What it measures: the wall time of one RL step (generate, score, train, one optimizer step) of
(a) `rlhf grpo --pretrain MODEL` and (b) TRL's GRPOTrainer (transformers `generate` for the
rollout, PyTorch fp32 training, use_cpu; bf16 with --trl_bf16) on the same GGUF file -- e.g.
SmolLM2-135M-Instruct Q4_1 (scripts/get_model.sh smollm2-135m-instruct), which both dequantise to
fp32 -- with the same prompts (the first --steps x --prompts_per_step records of --prompts, e.g.
GSM8K's train.jsonl, rendered with the model's chat template on both sides), and reports
TRL/rlhf per step and per generated token.

The step (defaults: 8 prompts x 8 samples x up to 128 new tokens at temperature 1 = 64 samples):
  * one optimizer step per rollout: TRL num_iterations=1 with per_device_train_batch_size x
    gradient_accumulation_steps = the 64 samples (generation_batch_size = 64); rlhf --max_epochs 1,
    --train_batch_size 64. So neither computes old log-probs (TRL skips them when generation and
    optimizer steps line up; rlhf reports logprob_old_skipped).
  * micro-batches: --micro_batch samples per forward/backward on both (TRL
    per_device_train_batch_size, rlhf --micro_train_batch_size per rank) and per forward-only
    pass of the reference model (TRL uses per_device_train_batch_size there; rlhf
    --micro_rollout_batch_size).
  * the same loss: token-mean over the step (TRL loss_type="dapo", rlhf --loss_agg_mode
    token-mean), group-normalised advantages with the group's std (TRL scale_rewards="group", rlhf
    group_norm), clip 0.2, AdamW at --lr with betas 0.9/0.95 and no weight decay, a constant
    schedule, no warm-up, gradient norm clipped at 1, no gradient checkpointing (TRL's default is
    on; rlhf's is off).
  * KL: --beta 0 (default; TRL's default too) loads no reference model on either side. --beta B
    runs TRL beta=B (k3 estimator, a loss term) and rlhf --init_kl_coef B --use_kl_loss
    --kl_estimator k3 (both then run a frozen reference model's forward over the rollout).
  * the model: rlhf loads the GGUF file itself; for TRL it is written once, before the runs, as
    a Hugging Face folder (the same fp32 weights transformers dequantises with gguf_file=, which
    TRL cannot pass on when it builds a model, or a reference model, from a path).
  * the reward: rlhf's rule `--reward math` against the `answer` key (GSM8K's "#### N"), and for
    TRL a Python port of the same rule (the last number of the completion, or \\boxed{...}, or
    "#### N", equal to the label's number).
  * the same prompts in the same step: rlhf draws its prompts in a seeded order (rl::EpochOrder,
    libstdc++'s std::shuffle over std::mt19937_64, reproduced here); TRL gets its dataset in that
    order with shuffle_dataset=False, so step k of both trains on the same 8 prompts.
  * threads: --threads (default 2) for both: OMP_NUM_THREADS and torch.set_num_threads for TRL,
    OMP_NUM_THREADS and --threads for rlhf. --rlhf_ranks 2 runs rlhf as 2 MPI ranks x threads/2
    threads (mpirun --oversubscribe --bind-to none); a comma list (1,2) runs each placement in
    every round, against the same TRL runs.

bf16 (issue 24): --trl_bf16 runs TRL with bf16=True (the Trainer's CPU autocast: bf16 matmuls
over fp32 master weights; generation in the same autocast) and rlhf with --param_dtype bf16 (bf16
GEMMs through oneDNN with fp32 master weights, gradients and AdamW; a bf16 engine; weight sync in
bf16). Without it both run fp32 (rlhf --param_dtype fp32, so a CPU with AMX does not silently pick
bf16 under auto). --rlhf_param_dtype sets rlhf's side alone: `--trl_bf16 --rlhf_param_dtype auto`
puts TRL bf16=True against what rlhf picks on the CPU at hand. Name the CPU and its ISA with the
figures: without AVX512-BF16 / AMX, bf16 arithmetic is emulated on both sides.

How it is timed:
  * rlhf: <save_path>/metrics.jsonl, one record per step: step_s and the phases gen_s, reward_s,
    logprob_s (reference model), train_s, sync_s (weights into the engine), gen_tokens.
  * TRL: a TrainerCallback takes on_step_begin .. on_step_end (the rollout happens inside, in the
    first micro-batch's training_step); a GRPOTrainer subclass times _generate (tokenising,
    transformers generate, decoding: "gen"), _calculate_rewards ("reward") and the rest of
    _generate_and_score_completions (reference log-probs, advantages: "logprob"); "train" is the
    step less the rollout. Tokens: the lengths of the completions _generate returns (EOS
    included, as rlhf counts it; what TRL logs as completions/mean_length, times the samples).
  * --steps per run (default 4); the first is a warm-up and left out; a run's figure is the mean
    over the rest. tokens/s = generated tokens / step time. Because EOS ends samples at different
    lengths on the two sides, the summary gives both the step-time ratio and the per-token ratio
    (seconds per generated token).
  * peak RSS: os.wait4's ru_maxrss of each run's process tree, which is its largest process (the
    rlhf process, one rank of several -- not their sum --, or the TRL process, which also
    reports its own getrusage(RUSAGE_SELF)); rlhf's per-step peak_rss_bytes (VmHWM, max over
    ranks) is in the JSON lines too.
  * interleaved: each round runs rlhf (every --rlhf_ranks placement) and TRL, in alternating order
    (rlhf first in even rounds), each run a fresh process; medians over rounds with min-max, and
    the median of the per-round ratios. Every run holds an exclusive flock on --lock (default
    /tmp/bench.lock) so that other benchmarks taking the same lock do not share the cores with it.

Usage (in a virtual environment: pip install torch transformers trl datasets gguf accelerate):
  python3 scripts/bench_trl.py --rlhf build/rlhf \\
      --gguf "$(scripts/get_model.sh smollm2-135m-instruct)" --prompts gsm8k/train.jsonl

Output: one JSON line per run and per summary row on stdout ({"bench": "trl_side_by_side", ...}),
a table at the end; progress on stderr. Not part of CI; the rlhf binary never needs Python.
"""

import argparse
import contextlib
import fcntl
import hashlib
import json
import math
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from importlib.metadata import PackageNotFoundError, version

from bench_common import Reporter, cpu_name, rlhf_version, spread  # next to this file
from libstdcxx_random import MASK64, MT19937_64, uniform_below  # next to this file

HERE = os.path.dirname(os.path.abspath(__file__))
BENCH = "trl_side_by_side"


def rlhf_param_dtype(a):
    """rlhf's --param_dtype: --rlhf_param_dtype, else TRL's precision (bf16 or fp32)."""
    return a.rlhf_param_dtype or ("bf16" if a.trl_bf16 else "fp32")


def parse_args():
    p = argparse.ArgumentParser(
        description=__doc__.split("\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rlhf", default="build/rlhf", help="the rlhf binary (default build/rlhf)")
    p.add_argument("--gguf", help="the GGUF model file (default: the path "
                                  "scripts/get_model.sh smollm2-135m-instruct prints)")
    p.add_argument("--prompts", required=True,
                   help="JSONL prompts with --input_key (a question) and --label_key (its answer, "
                        "e.g. GSM8K's train.jsonl)")
    p.add_argument("--input_key", default="question", help="prompt key (default question)")
    p.add_argument("--label_key", default="answer",
                   help="reference answer key, scored by the math rule (default answer)")
    p.add_argument("--steps", type=int, default=4,
                   help="RL steps per run, the first a warm-up left out (default 4)")
    p.add_argument("--rounds", type=int, default=2, help="interleaved rounds (default 2)")
    p.add_argument("--prompts_per_step", type=int, default=8, help="prompts per step (default 8)")
    p.add_argument("--samples", type=int, default=8, help="samples per prompt (default 8)")
    p.add_argument("--max_new_tokens", type=int, default=128,
                   help="most new tokens per sample, EOS ends it earlier (default 128)")
    p.add_argument("--micro_batch", type=int, default=8,
                   help="samples per forward/backward (and per reference forward) on both; the "
                        "step's samples / this = TRL's gradient_accumulation_steps (default 8)")
    p.add_argument("--lr", type=float, default=1e-6, help="learning rate (default 1e-6)")
    p.add_argument("--beta", type=float, default=0.0,
                   help="KL coefficient: 0 (default) = no reference model; > 0 = TRL beta, rlhf "
                        "--init_kl_coef with --use_kl_loss and k3")
    p.add_argument("--trl_bf16", action="store_true",
                   help="TRL bf16=True and rlhf --param_dtype bf16 (default: fp32 on both)")
    p.add_argument("--rlhf_param_dtype", choices=["auto", "bf16", "fp32"],
                   help="rlhf's --param_dtype (default: bf16 with --trl_bf16, else fp32); auto "
                        "= what rlhf picks on this CPU (bf16 only with AMX / AVX512-BF16), e.g. "
                        "against TRL bf16=True on a CPU without them")
    p.add_argument("--threads", type=int, default=2,
                   help="threads for each system (default 2); rlhf ranks share them")
    p.add_argument("--rlhf_ranks", default="1",
                   help="comma list of rlhf MPI rank counts, each run in every round with "
                        "threads/ranks threads per rank (default 1)")
    p.add_argument("--kv_cache_dtype", default="auto", choices=["auto", "fp16", "fp32"],
                   help="rlhf --kv_cache_dtype (default auto = rlhf's CPU default, fp16; TRL's "
                        "cache is fp32)")
    p.add_argument("--seed", type=int, default=42, help="seed of both (prompt order, sampling)")
    p.add_argument("--mpirun", default="mpirun", help="MPI launcher for --rlhf_ranks > 1")
    p.add_argument("--lock", default="/tmp/bench.lock",
                   help="file flock'ed (exclusive) around every run (default /tmp/bench.lock)")
    p.add_argument("--workdir", help="where the runs write (default: a temporary folder, removed "
                                     "at the end)")
    p.add_argument("--output", help="also append the JSON lines to this file")
    p.add_argument("--trl_worker", metavar="PROMPTS_JSONL",
                   help="run only TRL, once, in this process, on this prompt file (first record = "
                        "first prompt drawn) and the model --hf_model, and print its result as one "
                        "JSON line: what the benchmark runs (as a subprocess) for each TRL run")
    p.add_argument("--hf_model", metavar="DIR",
                   help="with --trl_worker: the model as a Hugging Face folder (the benchmark "
                        "writes the GGUF dequantised to fp32 there once, before the runs)")
    a = p.parse_args()
    try:
        a.ranks = [int(r) for r in a.rlhf_ranks.split(",") if r.strip()]
    except ValueError:
        p.error("--rlhf_ranks: a comma list of integers")
    if not a.ranks or min(a.ranks) < 1 or any(a.threads % r for r in a.ranks):
        p.error("--rlhf_ranks: counts >= 1 that divide --threads")
    if min(a.steps, a.rounds, a.prompts_per_step, a.max_new_tokens, a.micro_batch, a.threads) < 1:
        p.error("--steps, --rounds, --prompts_per_step, --max_new_tokens, --micro_batch and "
                "--threads must be >= 1")
    if a.steps < 2:
        p.error("--steps >= 2 (the first step is a warm-up)")
    if a.samples < 2:
        p.error("--samples >= 2 (group-normalised advantages)")
    a.rollout = a.prompts_per_step * a.samples
    if any(a.rollout % (a.micro_batch * r) for r in a.ranks):
        p.error(f"--micro_batch x ranks must divide the {a.rollout} samples of a step")
    if a.beta < 0:
        p.error("--beta >= 0")
    if a.trl_worker and not a.hf_model:
        p.error("--trl_worker needs --hf_model")
    return a


ARGS = parse_args()
# Thread counts before torch is imported (by the TRL worker, and here for the model export).
for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ[var] = str(ARGS.threads)
REPORT = Reporter(BENCH, "bench_trl", ARGS.output if not ARGS.trl_worker else None)
emit, log = REPORT.emit, REPORT.log


# --- rlhf's prompt order: rl::EpochOrder = std::shuffle(std::mt19937_64) of libstdc++ ---------

def rlhf_prompt_order(n, seed):
    """The first episode of rl::EpochOrder(n, seed): libstdc++'s std::shuffle of [0, n) with
    std::mt19937_64(seed * 1000003), which draws two swap positions from one number (its path
    for n*n <= 2^64 - 1)."""
    if n * n > MASK64:
        raise ValueError(f"{n} prompts: more than this port of std::shuffle handles")
    gen = MT19937_64((seed * 1000003) & MASK64)
    order = list(range(n))
    i = 1
    if n % 2 == 0 and n > 0:
        j = uniform_below(gen, 2)
        order[i], order[j] = order[j], order[i]
        i += 1
    while i < n:
        r = i + 1  # swap positions [0, r) for element i, [0, r + 1) for element i + 1
        x = uniform_below(gen, r * (r + 1))
        for j in (x // (r + 1), x % (r + 1)):
            order[i], order[j] = order[j], order[i]
            i += 1
    return order


# --- the math rule reward, as rl/rewards.cpp -------------------------------------------------

SPACE = " \t\n\v\f\r"
PLAIN = re.compile(r"[+-]?(?=\.?\d)\d*\.?\d*(?:[eE][+-]?\d+)?")


def _matching_brace(s, open_at):
    depth = 0
    for i in range(open_at, len(s)):
        if s[i] == "{":
            depth += 1
        if s[i] == "}":
            depth -= 1
            if depth == 0:
                return i
    return None


def _parse_plain(s):
    t = s.replace(",", "").replace(" ", "")
    if not t or len(t) > 64 or not PLAIN.fullmatch(t):
        return None
    v = float(t)
    return v if math.isfinite(v) else None


def parse_math_number(s):
    s = s.strip(SPACE)
    if not s or len(s) > 64:
        return None
    for f in ("\\dfrac", "\\tfrac", "\\frac"):
        if s.startswith(f):
            a0 = len(f)
            if a0 >= len(s) or s[a0] != "{":
                return None
            a1 = _matching_brace(s, a0)
            if a1 is None or a1 + 1 >= len(s) or s[a1 + 1] != "{":
                return None
            b1 = _matching_brace(s, a1 + 1)
            if b1 is None or b1 + 1 != len(s):
                return None
            num, den = _parse_plain(s[a0 + 1:a1]), _parse_plain(s[a1 + 2:b1])
            return num / den if num is not None and den else None
    if s[0] == "-" and len(s) > 1 and s[1] == "\\":
        v = parse_math_number(s[1:])
        return -v if v is not None else None
    if s[0] == "$":
        s = s[1:]
    s = s.rstrip(".%$")
    if "/" in s:
        num, _, den = s.partition("/")
        num, den = _parse_plain(num), _parse_plain(den)
        return num / den if num is not None and den else None
    return _parse_plain(s)


def _last_number(s):
    end = len(s)
    while end > 0:
        i = end
        while i > 0 and not s[i - 1].isdigit():
            i -= 1
        if i == 0:
            return None
        j = i
        while j > 0 and (s[j - 1].isdigit() or s[j - 1] == "." or
                         (s[j - 1] == "," and j >= 2 and s[j - 2].isdigit())):
            j -= 1
        if j > 0 and s[j - 1] == "-":
            j -= 1
        v = parse_math_number(s[j:i])
        if v is not None:
            return v
        end = j
    return None


def extract_math_answer(c):
    b = c.rfind("\\boxed{")
    if b >= 0:
        close = _matching_brace(c, b + 6)
        if close is not None:
            inner = c[b + 7:close]
            v = parse_math_number(inner)
            return v if v is not None else _last_number(inner)
    h = c.rfind("####")
    if h >= 0:
        rest = c[h + 4:].strip(SPACE)
        v = parse_math_number(re.split(r"\s", rest, maxsplit=1)[0])
        if v is not None:
            return v
    return _last_number(c)


def math_reward(completion, label):
    if "####" in label or "\\boxed{" in label:
        ref = extract_math_answer(label)
    else:
        ref = parse_math_number(label)
    if ref is None:
        raise ValueError(f"math reward: label {label[:80]!r} has no number")
    got = extract_math_answer(completion)
    return 1.0 if got is not None and abs(got - ref) <= 1e-6 * max(1.0, abs(ref)) else 0.0


# --- TRL: the model export, one TRL run (the --trl_worker process) --------------------------

def export_hf(gguf, out):
    """The GGUF file dequantised to fp32 as a Hugging Face folder: TRL builds its policy (and its
    reference model) from a path, and transformers reads a GGUF's config only with gguf_file=."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    transformers.logging.set_verbosity_error()
    d, name = os.path.split(gguf)
    loaded = AutoModelForCausalLM.from_pretrained(d, gguf_file=name, dtype=torch.float32)
    config = loaded.config
    del config.quantization_config  # the weights are plain fp32 now; a GGUF-"quantized" model
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)  # cannot be saved
    model.load_state_dict(loaded.state_dict())
    tmp = out + ".tmp"
    model.save_pretrained(tmp)
    AutoTokenizer.from_pretrained(d, gguf_file=name).save_pretrained(tmp)
    os.rename(tmp, out)


LOGGED = ("reward", "kl", "completions/mean_length", "completions/clipped_ratio", "loss",
          "grad_norm")  # TRL's per-step logs kept in the JSON lines


def trl_worker(a):
    import resource

    import torch
    import transformers
    from datasets import Dataset
    from transformers import AutoTokenizer, PrinterCallback, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    torch.set_num_threads(a.threads)
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()

    t_load = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(a.hf_model)
    with open(a.trl_worker) as f:
        records = [json.loads(line) for line in f if line.strip()]
    dataset = Dataset.from_list(
        [{"prompt": [{"role": "user", "content": r[a.input_key]}], "label": r[a.label_key]}
         for r in records])

    def math_rule(completions, label, **_):
        return [math_reward(c[0]["content"], y) for c, y in zip(completions, label)]

    phases = {}

    def timed(name, fn, *args, **kw):
        t0 = time.perf_counter()
        out = fn(*args, **kw)
        phases[name] = phases.get(name, 0.0) + time.perf_counter() - t0
        return out

    class TimedGRPOTrainer(GRPOTrainer):
        def _generate(self, prompts):
            out = timed("gen_s", super()._generate, prompts)
            phases["gen_tokens"] = phases.get("gen_tokens", 0) + sum(len(c) for c in out[1])
            phases.setdefault("prompts", [])
            for p in prompts:  # each prompt num_generations times, in a row
                if p[-1]["content"] not in phases["prompts"]:
                    phases["prompts"].append(p[-1]["content"])
            return out

        def _calculate_rewards(self, *args, **kw):
            return timed("reward_s", super()._calculate_rewards, *args, **kw)

        def _generate_and_score_completions(self, inputs):
            return timed("rollout_s", super()._generate_and_score_completions, inputs)

    steps, logged = [], {}

    class StepClock(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            phases.clear()
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            step_s = time.perf_counter() - self.t0
            rollout = phases.get("rollout_s", 0.0)
            gen, reward = phases.get("gen_s", 0.0), phases.get("reward_s", 0.0)
            steps.append({"step": state.global_step, "step_s": step_s, "gen_s": gen,
                          "reward_s": reward, "logprob_s": rollout - gen - reward,
                          "train_s": step_s - rollout,
                          "gen_tokens": phases.get("gen_tokens", 0),
                          "prompts": phases.get("prompts", [])})

        def on_log(self, args, state, control, logs=None, **kw):
            logged.setdefault(state.global_step, {}).update(
                {k: logs[k] for k in LOGGED if k in (logs or {})})

    config = GRPOConfig(
        output_dir=os.path.join(os.path.dirname(a.trl_worker), "trl_out"),
        model_init_kwargs={"dtype": torch.float32},
        use_cpu=True, bf16=a.trl_bf16, fp16=False, seed=a.seed, max_steps=a.steps,
        per_device_train_batch_size=a.micro_batch,
        gradient_accumulation_steps=a.rollout // a.micro_batch,
        num_generations=a.samples, max_completion_length=a.max_new_tokens,
        temperature=1.0, top_p=1.0, top_k=0, num_iterations=1, beta=a.beta, epsilon=0.2,
        loss_type="dapo", scale_rewards="group", learning_rate=a.lr,
        lr_scheduler_type="constant", warmup_steps=0, adam_beta1=0.9, adam_beta2=0.95,
        weight_decay=0.0, max_grad_norm=1.0, activation_checkpointing=False,
        shuffle_dataset=False, logging_steps=1, report_to="none", save_strategy="no",
        disable_tqdm=True, dataloader_num_workers=0)
    trainer = TimedGRPOTrainer(model=a.hf_model, reward_funcs=math_rule, args=config,
                               train_dataset=dataset, processing_class=tokenizer,
                               callbacks=[StepClock()])
    trainer.remove_callback(PrinterCallback)  # stdout carries only the result line
    load_s = time.perf_counter() - t_load
    log(f"TRL: model loaded in {load_s:.1f} s, {a.steps} steps")
    t0 = time.perf_counter()
    trainer.train()
    train_wall_s = time.perf_counter() - t0
    for s in steps:
        s.update(logged.get(s["step"], {}))
    print(json.dumps({"steps": steps, "load_s": load_s, "train_wall_s": train_wall_s,
                      "torch_threads": torch.get_num_threads(),
                      "ref_model": trainer.ref_model is not None,
                      "self_peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
                      * 1024}), flush=True)


# --- the benchmark driver --------------------------------------------------------------------

def busy_cpu_s():
    """CPU seconds the whole machine has spent busy (/proc/stat: all but idle and iowait)."""
    with open("/proc/stat") as f:
        user, nice, system, _idle, _iowait, irq, softirq, steal = map(int, f.readline().split()[1:9])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


@contextlib.contextmanager
def bench_lock(path):
    """Holds an exclusive flock on `path` (as `flock PATH cmd` does); yields the seconds waited."""
    with open(path, "a") as lk:
        t0 = time.perf_counter()
        fcntl.flock(lk, fcntl.LOCK_EX)
        try:
            yield time.perf_counter() - t0
        finally:
            fcntl.flock(lk, fcntl.LOCK_UN)


def locked_run(cmd, env, stdout, stderr, lock):
    """Runs cmd holding the lock. Returns the exit code and {wall_s, lock_wait_s, peak_rss_bytes
    (ru_maxrss of the process tree), other_cpu_s (CPU seconds the machine spent on other
    processes meanwhile: contention that the lock did not keep out)}."""
    with bench_lock(lock) as waited:
        t0, busy0 = time.perf_counter(), busy_cpu_s()
        proc = subprocess.Popen(cmd, env=env, stdout=stdout, stderr=stderr)
        _, status, usage = os.wait4(proc.pid, 0)
        wall, busy = time.perf_counter() - t0, busy_cpu_s() - busy0
    return os.waitstatus_to_exitcode(status), {
        "wall_s": wall, "lock_wait_s": waited, "peak_rss_bytes": usage.ru_maxrss * 1024,
        "other_cpu_s": max(0.0, busy - usage.ru_utime - usage.ru_stime)}


def rlhf_cmd(a, ranks, prompts, save):
    threads = a.threads // ranks
    cmd = [a.rlhf, "grpo", "--pretrain", a.gguf, "--prompt_data", prompts,
           "--input_key", a.input_key, "--label_key", a.label_key, "--apply_chat_template",
           "--reward", "math", "--n_samples_per_prompt", str(a.samples),
           "--rollout_batch_size", str(a.prompts_per_step), "--train_batch_size", str(a.rollout),
           "--micro_train_batch_size", str(a.micro_batch),
           "--micro_rollout_batch_size", str(a.micro_batch), "--max_epochs", "1",
           "--max_steps", str(a.steps), "--generate_max_len", str(a.max_new_tokens),
           "--temperature", "1", "--top_p", "1", "--top_k", "-1",
           "--actor_learning_rate", repr(a.lr), "--lr_scheduler", "constant",
           "--lr_warmup_ratio", "0", "--adam_betas", "0.9", "0.95", "--l2", "0",
           "--max_norm", "1", "--eps_clip", "0.2", "--loss_agg_mode", "token-mean",
           "--advantage_estimator", "group_norm", "--init_kl_coef", repr(a.beta),
           "--use_kl_loss", "--kl_estimator", "k3", "--kv_cache_dtype", a.kv_cache_dtype,
           "--threads", str(threads), "--device", "cpu", "--seed", str(a.seed),
           "--save_path", save, "--ckpt_path", os.path.join(save, "ckpt"),
           "--log_completions", "1", "--disable_progress",
           "--param_dtype", rlhf_param_dtype(a)]
    if ranks > 1:
        launcher = [a.mpirun, "--oversubscribe", "--bind-to", "none", "-np", str(ranks)]
        if os.geteuid() == 0:
            launcher.insert(1, "--allow-run-as-root")
        cmd = launcher + cmd
    return cmd, dict(os.environ, OMP_NUM_THREADS=str(threads))


def run_rlhf(a, ranks, prompts, expected_prompts, work, tag):
    save = os.path.join(work, tag)
    shutil.rmtree(save, ignore_errors=True)
    os.makedirs(save)
    cmd, env = rlhf_cmd(a, ranks, prompts, save)
    log_path = os.path.join(work, f"{tag}.log")
    with open(log_path, "w") as lf:
        rc, run = locked_run(cmd, env, lf, subprocess.STDOUT, a.lock)
    if rc != 0:
        with open(log_path) as lf:
            tail = lf.read()[-4000:]
        sys.exit(f"bench_trl: rlhf failed ({rc}): {' '.join(cmd)}\n{tail}")
    with open(os.path.join(save, "metrics.jsonl")) as f:
        steps = [json.loads(line) for line in f if line.strip()]
    with open(os.path.join(save, "samples.jsonl")) as f:
        drawn = {}
        for line in f:
            row = json.loads(line)
            drawn.setdefault(row["step"], []).append(row["prompt"])
    for k, want in enumerate(expected_prompts, 1):  # the order TRL was given, checked
        got = drawn.get(k, [])
        if [p for p in want if not any(p in g for g in got)]:
            sys.exit(f"bench_trl: rlhf step {k} trained on other prompts than TRL's step {k}; "
                     f"the port of rlhf's prompt order does not match this binary")
    keep = ("step", "step_s", "gen_s", "reward_s", "logprob_s", "train_s", "sync_s",
            "gen_tokens", "response_length_mean", "reward_mean", "kl_mean", "peak_rss_bytes",
            "logprob_old_skipped")
    steps = [{k: s[k] for k in keep if k in s} for s in steps]
    return cmd, env["OMP_NUM_THREADS"], {"steps": steps, **run}


def run_trl(a, prompts, expected_prompts, hf_model, work, tag):
    cmd = [sys.executable, os.path.abspath(__file__), "--trl_worker", prompts,
           "--hf_model", hf_model, "--prompts", a.prompts, "--input_key", a.input_key,
           "--label_key", a.label_key, "--steps", str(a.steps),
           "--prompts_per_step", str(a.prompts_per_step), "--samples", str(a.samples),
           "--max_new_tokens", str(a.max_new_tokens), "--micro_batch", str(a.micro_batch),
           "--lr", repr(a.lr), "--beta", repr(a.beta), "--threads", str(a.threads),
           "--seed", str(a.seed)] + (["--trl_bf16"] if a.trl_bf16 else [])
    out_path = os.path.join(work, f"{tag}.json")
    with open(out_path, "w") as out:
        rc, run = locked_run(cmd, dict(os.environ), out, None, a.lock)
    with open(out_path) as f:
        lines = [line for line in f.read().splitlines() if line.startswith("{")]
    if rc != 0 or not lines:
        sys.exit(f"bench_trl: the TRL run failed ({rc}): {' '.join(cmd)}")
    res = json.loads(lines[-1])
    if len(res["steps"]) != a.steps:
        sys.exit(f"bench_trl: TRL ran {len(res['steps'])} steps, not {a.steps}")
    for k, (s, want) in enumerate(zip(res["steps"], expected_prompts), 1):
        if s.pop("prompts") != want:
            sys.exit(f"bench_trl: TRL step {k} trained on other prompts than rlhf's step {k}")
    return cmd, {**res, **run}


def per_run(res):
    """A run's figures over its timed steps (all but the first)."""
    timed = res["steps"][1:]
    n = len(timed)
    step_s = sum(s["step_s"] for s in timed)
    tokens = sum(s["gen_tokens"] for s in timed)
    row = {"step_s": step_s / n, "gen_tokens": tokens / n, "tokens_per_s": tokens / step_s,
           "ms_per_token": 1e3 * step_s / tokens}
    for ph in ("gen_s", "reward_s", "logprob_s", "train_s", "sync_s"):
        if ph in timed[0]:
            row[ph] = sum(s[ph] for s in timed) / n
    # the step outside generation, log-probs and training: reward, weight sync (rlhf), the rest
    row["rest_s"] = row["step_s"] - row["gen_s"] - row["logprob_s"] - row["train_s"]
    row["peak_rss_mib"] = res["peak_rss_bytes"] / 2**20
    row["other_cpu_s"] = res["other_cpu_s"]
    return row


def fmt(s, f="{:.1f}"):
    return f"{f.format(s['median'])} ({f.format(s['min'])}-{f.format(s['max'])})"


def pkg_version(name):
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def prepare_prompts(a, work):
    """The first steps x prompts_per_step records, in file order for rlhf (which shuffles them
    with its seed) and in rlhf's draw order for TRL; also the prompts of each step."""
    n = a.steps * a.prompts_per_step
    records = []
    with open(a.prompts) as f:
        for line in f:
            if line.strip():
                r = json.loads(line)
                if not isinstance(r.get(a.input_key), str) or a.label_key not in r:
                    sys.exit(f"bench_trl: {a.prompts}: record {len(records) + 1} has no string "
                             f"'{a.input_key}' or no '{a.label_key}'")
                records.append({a.input_key: r[a.input_key], a.label_key: r[a.label_key]})
                if len(records) == n:
                    break
    if len(records) < n:
        sys.exit(f"bench_trl: {a.prompts} has {len(records)} records, {n} needed")
    order = [records[i] for i in rlhf_prompt_order(n, a.seed)]
    paths = {}
    for name, recs in (("rlhf", records), ("trl", order)):
        paths[name] = os.path.join(work, f"prompts_{name}.jsonl")
        with open(paths[name], "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in recs)
    per_step = [[r[a.input_key] for r in order[k:k + a.prompts_per_step]]
                for k in range(0, n, a.prompts_per_step)]
    return paths, per_step


def main():
    a = ARGS
    if a.trl_worker:
        trl_worker(a)
        return
    if a.gguf is None:
        a.gguf = subprocess.run(["bash", os.path.join(HERE, "get_model.sh"),
                                 "smollm2-135m-instruct"], check=True, capture_output=True,
                                text=True).stdout.strip()
    a.gguf = os.path.abspath(a.gguf)
    work = a.workdir or tempfile.mkdtemp(prefix="bench_trl.")
    os.makedirs(work, exist_ok=True)
    # Every run uses one copy of the binary, so a rebuild during the benchmark cannot mix two.
    binary = {"path": os.path.abspath(a.rlhf), "sha256": sha256_file(a.rlhf),
              "mtime": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(os.path.getmtime(a.rlhf)))}
    a.rlhf = os.path.join(work, "rlhf")
    shutil.copy2(binary["path"], a.rlhf)
    if sha256_file(a.rlhf) != binary["sha256"]:
        sys.exit(f"bench_trl: {binary['path']} changed while it was copied (a rebuild?); rerun")
    env = {"python": platform.python_version(), "torch": pkg_version("torch"),
           "transformers": pkg_version("transformers"), "trl": pkg_version("trl"),
           "accelerate": pkg_version("accelerate"), "datasets": pkg_version("datasets"),
           "gguf": pkg_version("gguf"), "rlhf": rlhf_version(a.rlhf),
           "rlhf_binary": binary, "cpu": cpu_name(),
           "cores": os.cpu_count(), "threads": a.threads, "rlhf_ranks": a.ranks,
           "model": os.path.basename(a.gguf), "prompts": os.path.basename(a.prompts),
           "steps": a.steps, "rounds": a.rounds, "prompts_per_step": a.prompts_per_step,
           "samples": a.samples, "max_new_tokens": a.max_new_tokens,
           "micro_batch": a.micro_batch, "lr": a.lr, "beta": a.beta,
           "kv_cache_dtype": a.kv_cache_dtype, "seed": a.seed,
           "precision": "bf16" if a.trl_bf16 else "fp32", "rlhf_param_dtype": rlhf_param_dtype(a)}
    emit({"row": "env", **env})
    paths, per_step = prepare_prompts(a, work)
    hf_model = os.path.join(work, "hf_model")
    if not os.path.isdir(hf_model):
        log(f"writing {os.path.basename(a.gguf)} as a Hugging Face folder (fp32) for TRL")
        with bench_lock(a.lock):
            export_hf(a.gguf, hf_model)

    systems = [f"rlhf {r}x{a.threads // r}" for r in a.ranks] + ["trl"]
    runs = {s: [] for s in systems}
    cmds = {}
    for rnd in range(a.rounds):
        order = systems if rnd % 2 == 0 else systems[::-1]
        for system in order:
            tag = f"r{rnd}_{system.replace(' ', '_')}"
            log(f"round {rnd + 1}/{a.rounds}: {system} ({a.steps} steps)")
            if system == "trl":
                cmd, res = run_trl(a, paths["trl"], per_step, hf_model, work, tag)
                cmds[system] = " ".join(cmd)
            else:
                ranks = int(system.split()[1].split("x")[0])
                cmd, omp, res = run_rlhf(a, ranks, paths["rlhf"], per_step, work, tag)
                cmds[system] = f"OMP_NUM_THREADS={omp} " + " ".join(cmd)
            row = per_run(res)
            runs[system].append(row)
            log(f"  {system}: {row['step_s']:.1f} s a step, {row['gen_tokens']:.0f} tokens, "
                f"wall {res['wall_s']:.0f} s, waited {res['lock_wait_s']:.0f} s for the lock, "
                f"other processes used {res['other_cpu_s']:.0f} CPU s meanwhile")
            emit({"row": "run", "system": system, "round": rnd, **row,
                  **{k: res[k] for k in ("wall_s", "lock_wait_s")},
                  "steps": res["steps"],
                  **{k: res[k] for k in ("load_s", "train_wall_s", "torch_threads", "ref_model",
                                         "self_peak_rss_bytes") if k in res}})

    summary = []
    for system in systems:
        rs = runs[system]
        row = {"row": "summary", "system": system, "rounds": a.rounds,
               **{k: spread([r[k] for r in rs]) for k in rs[0]}}
        if system != "trl":
            trl = runs["trl"]
            row["trl_over_rlhf_step"] = spread([t["step_s"] / r["step_s"]
                                                for r, t in zip(rs, trl)])
            row["trl_over_rlhf_per_token"] = spread([t["ms_per_token"] / r["ms_per_token"]
                                                     for r, t in zip(rs, trl)])
        emit(row)
        summary.append(row)

    print()
    kl = f"beta {a.beta} (reference model)" if a.beta > 0 else "beta 0 (no reference model)"
    print(f"GRPO step on {env['model']}: {a.prompts_per_step} prompts x {a.samples} samples x <= "
          f"{a.max_new_tokens} new tokens, micro-batch {a.micro_batch}, {kl}; {a.threads} threads;"
          f" {a.steps - 1} timed steps per run (1 warm-up), {a.rounds} rounds")
    print(f"torch {env['torch']}, transformers {env['transformers']}, trl {env['trl']}; "
          f"{env['rlhf']} ({binary['path']}, {binary['mtime']}, sha256 {binary['sha256'][:12]});"
          f" {env['cpu']}")
    print("median over rounds (min-max) of each run's mean over its timed steps; phases in s")
    print("(rest: reward, weight sync, anything else; foreign CPU s: CPU time other processes "
          "took during a run, max over rounds: contention the lock did not keep out)")
    hdr = (f"{'system':<10} | {'step s':>18} | {'tokens/step':>16} | {'tokens/s':>16} | "
           f"{'gen':>6} | {'logprob':>7} | {'train':>6} | {'rest':>5} | {'peak RSS MiB':>12} | "
           f"{'foreign CPU s':>13}")
    print(hdr)
    print("-" * len(hdr))
    for row in summary:
        med = {k: v["median"] for k, v in row.items() if isinstance(v, dict)}
        print(f"{row['system']:<10} | {fmt(row['step_s']):>18} | "
              f"{fmt(row['gen_tokens'], '{:.0f}'):>16} | {fmt(row['tokens_per_s']):>16} | "
              f"{med['gen_s']:>6.1f} | {med['logprob_s']:>7.2f} | {med['train_s']:>6.1f} | "
              f"{med['rest_s']:>5.2f} | {med['peak_rss_mib']:>12.0f} | "
              f"{row['other_cpu_s']['max']:>13.0f}")
    print()
    print("TRL / rlhf, median of the per-round ratios (min-max): step time | time per generated "
          "token")
    for row in summary:
        if row["system"] != "trl":
            print(f"  {row['system']:<10} {fmt(row['trl_over_rlhf_step'], '{:.2f}')} | "
                  f"{fmt(row['trl_over_rlhf_per_token'], '{:.2f}')}")
    for system, cmd in cmds.items():
        print(f"{system} command: {cmd}")
    print(f"every run held flock {a.lock}" + (f"; the runs' files are in {work}" if a.workdir
                                                else ""))
    if not a.workdir:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
