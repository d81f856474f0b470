#!/usr/bin/env python3
"""Plot an rlhf metrics.jsonl as PNG curves: reward, KL, response length and phase times.

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
    rl = "reward_mean" in rows[0]
    panels = ([("reward_mean", "reward (mean)"), ("kl_mean", "KL(policy || ref)"),
               ("response_length_mean", "response length (tokens)"), (None, "phase time (s)")]
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
    fig, axes = plt.subplots(2, 2, figsize=(11, 7))
    for ax, (key, title) in zip(axes.flat, panels):
        if key is None:
            for k in ("gen_s", "reward_s", "logprob_s", "train_s", "sync_s"):
                xs, ys = series(rows, k)
                if xs:
                    ax.plot(xs, ys, label=k[:-2])
            ax.legend(fontsize=8)
        else:
            xs, ys = series(rows, key)
            ax.plot(xs, ys, alpha=0.35, color="tab:blue")
            ax.plot(xs, smooth(ys), color="tab:blue")
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
