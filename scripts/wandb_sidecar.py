#!/usr/bin/env python3
"""Weights & Biases sidecar of `rlhf ... --use_wandb` (started by rank 0, one per run).

Follows <save_path>/metrics.jsonl and samples.jsonl as rlhf appends to them and logs every record
through W&B's own client: each number of a metrics record at its "step" (nested objects as
"outer/inner"), each step's logged completions as a table "completions". It runs until its stdin
reaches EOF (rlhf closes the pipe at the end of the run, or dies), then reads the files to their
end, calls wandb.finish() and exits.

Online or offline as W&B decides: WANDB_MODE=offline writes ./wandb/offline-run-* for a later
`wandb sync`; WANDB_API_KEY (or `wandb login`) authenticates online runs.

Usage (rlhf builds this command line):
  wandb_sidecar.py --metrics M --samples S --config C.json --project P [--group G] [--name N]
                   [--entity E] [--job_type sft|rm|grpo|ppo]
"""
import argparse
import json
import os
import select
import sys


class Follower:
    """Reads the complete lines appended to a file since the last call (the file may not exist
    yet; a half-written last line waits for its newline)."""

    def __init__(self, path):
        self.path, self.offset, self.partial = path, 0, b""

    def lines(self):
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
                self.offset = f.tell()
        except FileNotFoundError:
            return []
        data = self.partial + data
        *complete, self.partial = data.split(b"\n")
        out = []
        for line in complete:
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if isinstance(rec, dict):
                out.append(rec)
        return out


def flatten(rec, prefix=""):
    """{"eval": {"accuracy": 0.5}} -> {"eval/accuracy": 0.5}; numbers and booleans only."""
    out = {}
    for k, v in rec.items():
        if isinstance(v, dict):
            out.update(flatten(v, prefix + k + "/"))
        elif isinstance(v, bool):
            out[prefix + k] = int(v)
        elif isinstance(v, (int, float)):
            out[prefix + k] = v
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--metrics", required=True)
    ap.add_argument("--samples", required=True)
    ap.add_argument("--config", default="")
    ap.add_argument("--project", default="rlhf")
    ap.add_argument("--group", default=None)
    ap.add_argument("--name", default=None)
    ap.add_argument("--entity", default=None)
    ap.add_argument("--job_type", default=None)
    ap.add_argument("--poll", type=float, default=1.0, help="seconds between reads")
    args = ap.parse_args()

    import wandb  # rlhf checked that it imports before starting us

    config = {}
    if args.config and os.path.exists(args.config):
        with open(args.config) as f:
            config = json.load(f)
    run = wandb.init(project=args.project, group=args.group, name=args.name, entity=args.entity,
                     job_type=args.job_type, config=config)
    metrics, samples = Follower(args.metrics), Follower(args.samples)
    last_step = -1

    def drain():
        """Logs the records appended since the last call, step by step: each step's metrics and
        its completions (a table) in one call, so neither stream's steps are dropped for W&B's
        ever-growing step."""
        nonlocal last_step
        by_step = {}
        for rec in metrics.lines():
            step = rec.get("step")
            if isinstance(step, int):
                by_step.setdefault(step, [{}, []])[0].update(
                    flatten({k: v for k, v in rec.items() if k != "step"}))
        for rec in samples.lines():
            step = rec.get("step")
            if isinstance(step, int):
                by_step.setdefault(step, [{}, []])[1].append(
                    [rec.get("prompt"), rec.get("completion"), rec.get("score"),
                     rec.get("advantage")])
        for step in sorted(by_step):
            if step < last_step:
                continue  # W&B steps only grow (a resumed run's trimmed steps come again)
            last_step = step
            values, rows = by_step[step]
            if rows:
                values["completions"] = wandb.Table(
                    columns=["prompt", "completion", "score", "advantage"], data=rows)
            if values:
                run.log(values, step=step)

    stdin = sys.stdin.fileno()
    while True:
        ready, _, _ = select.select([stdin], [], [], args.poll)
        if ready and not os.read(stdin, 4096):
            break  # EOF: the run is over
        drain()
    drain()
    run.finish()
    return 0


if __name__ == "__main__":
    sys.exit(main())
