#!/usr/bin/env python3
"""Reads the TensorBoard event files of `rlhf ... --use_tensorboard DIR` with TensorBoard's own
reader (tensorboard.backend.event_processing.event_accumulator.EventAccumulator) and prints every
scalar tag with its number of events and last value, and every text tag.

Usage: scripts/check_tensorboard.py DIR [--expect TAG ...] [--expect-text TAG ...] [--steps N]
Exit status 1 when an expected tag is missing or has fewer than N events (--steps).
Needs `pip install tensorboard` (a virtual environment is enough).
"""
import argparse
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dir")
    ap.add_argument("--expect", nargs="*", default=[], help="scalar tags that must be there")
    ap.add_argument("--expect-text", nargs="*", default=[], help="text tags that must be there")
    ap.add_argument("--steps", type=int, default=1, help="events each expected tag must have")
    args = ap.parse_args()
    from tensorboard.backend.event_processing import event_accumulator as ea

    acc = ea.EventAccumulator(args.dir, size_guidance={ea.SCALARS: 0, ea.TENSORS: 0})
    acc.Reload()
    tags = acc.Tags()
    scalars, tensors = tags.get("scalars", []), tags.get("tensors", [])
    for t in sorted(scalars):
        ev = acc.Scalars(t)
        print(f"scalar {t}: {len(ev)} events, last step {ev[-1].step} value {ev[-1].value:.6g}")
    for t in sorted(tensors):
        ev = acc.Tensors(t)
        text = ev[-1].tensor_proto.string_val[0].decode("utf-8", "replace") if ev else ""
        plugin = acc.SummaryMetadata(t).plugin_data.plugin_name
        print(f"{plugin} {t}: {len(ev)} events, last step {ev[-1].step}: {text[:60]!r}")
    bad = []
    for t in args.expect:
        if t not in scalars or len(acc.Scalars(t)) < args.steps:
            bad.append(t)
    for t in args.expect_text:
        if t not in tensors or acc.SummaryMetadata(t).plugin_data.plugin_name != "text":
            bad.append(t)
    if bad:
        print(f"FAIL: missing or short: {' '.join(bad)}")
        return 1
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
