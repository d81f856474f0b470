#!/usr/bin/env python3
"""Plot an rlhf metrics.jsonl as PNG curves.

RL runs (grpo, ppo): reward (training, and evaluation's reward, accuracy and pass@k when
--eval_dataset is set), KL, response length, phase times, gradient norms (actor, critic) and the
engine/trainer mismatch (every metric whose name contains "mismatch", starts with "is_" or
"tis_": the log-probability gap between the generation engines and the trainer and its
importance-sampling correction), staleness (rollout_staleness and, with --partial_rollout, the
age of the trained samples in weight versions and the share of their tokens from older weights)
and the partial-rollout sample counts (carried, interrupted, dropped as stale, continued on
kept KV or prefilled again). SFT/RM runs: loss, learning rate, grad norm, tokens/s.

Usage: scripts/plot_metrics.py METRICS_JSONL [OUT_PNG]
Needs matplotlib (pip install matplotlib); prints a short text summary either way.
"""
import json
import sys


def load(path):
    rows = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line:
                rows.append(json.loads(line))
    if not rows:
        sys.exit(f"{path}: no records")
    return rows


def series(rows, key):
    xs, ys = [], []
    for r in rows:
        if key in r and r[key] is not None:
            xs.append(r.get("step", len(xs) + 1))
            ys.append(r[key])
    return xs, ys


def smooth(ys, k=5):
    out = []
    for i in range(len(ys)):
        lo = max(0, i - k + 1)
        out.append(sum(ys[lo:i + 1]) / (i + 1 - lo))
    return out


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    path = sys.argv[1]
    out = sys.argv[2] if len(sys.argv) > 2 else path.rsplit(".", 1)[0] + ".png"
    rows = load(path)
    rl = any("reward_mean" in r for r in rows)
    panels = ([("reward_mean", "reward (mean)"), ("kl_mean", "KL(policy || ref)"),
               ("response_length_mean", "response length (tokens)"), ("phases", "phase time (s)"),
               ("grad_norms", "gradient norm"), ("mismatch", "engine / trainer mismatch"),
               ("staleness", "staleness (weight versions)"),
               ("partial", "partial rollouts (samples)")]
              if rl else [("loss", "loss"), ("lr", "learning rate"), ("grad_norm", "grad norm"),
                          ("tokens_per_s", "tokens/s")])
    first = [v for v in series(rows, panels[0][0])[1]]
    n = max(1, len(first) // 5)
    print(f"{path}: {len(rows)} steps; {panels[0][1]}: first {n} steps {sum(first[:n]) / n:.3f}, "
          f"last {n} steps {sum(first[-n:]) / n:.3f}")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no PNG (pip install matplotlib)")
        return 0
    fig, axes = plt.subplots(len(panels) // 2, 2, figsize=(11, 3.5 * (len(panels) // 2)))
    names = sorted({k for r in rows for k, v in r.items() if isinstance(v, (int, float))})
    groups = {
        "phases": ["gen_s", "reward_s", "logprob_s", "train_s", "sync_s"],
        "grad_norms": ["actor_grad_norm", "critic_grad_norm"],
        "mismatch": [k for k in names
                     if "mismatch" in k or k.startswith("is_") or k.startswith("tis_")],
        "staleness": ["rollout_staleness", "partial_age_mean", "partial_age_max",
                      "partial_old_token_fraction"],
        "partial": ["partial_carried_samples", "partial_interrupted_samples",
                    "partial_dropped_samples", "partial_trained_carried_samples",
                    "partial_kv_resumed_samples", "partial_reprefilled_samples"],
    }
    for ax, (key, title) in zip(axes.flat, panels):
        if key in groups:
            for k in groups[key]:
                xs, ys = series(rows, k)
                if xs:
                    ax.plot(xs, ys, label=k)
            if ax.lines:
                ax.legend(fontsize=8)
            else:
                ax.text(0.5, 0.5, "not in this run", ha="center", va="center",
                        transform=ax.transAxes)
        else:
            xs, ys = series(rows, key)
            ax.plot(xs, ys, alpha=0.35, color="tab:blue")
            ax.plot(xs, smooth(ys), color="tab:blue", label=key)
            if key == "reward_mean":  # evaluation on held-out prompts, where the run has it
                for k in [n for n in names if n.startswith("eval_") and not n.endswith("_s")
                          and "length" not in n]:
                    exs, eys = series(rows, k)
                    if exs:
                        ax.plot(exs, eys, marker="o", markersize=3, label=k)
                ax.legend(fontsize=8)
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    fig.suptitle(path)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    print(f"plot: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
