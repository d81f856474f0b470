"""What the side-by-side benchmark scripts (bench_transformers.py, bench_trl.py) share: the rlhf
binary's version and the CPU's name for their environment records, the median/min/max summary
of a list of measurements, and how they report (JSON lines out, progress on stderr). Standard
library only."""

import json
import platform
import re
import statistics
import subprocess
import sys


def rlhf_version(path):
    """The first line of `path --version`, or None when it cannot be run."""
    try:
        r = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30)
        return (r.stdout or r.stderr).strip().splitlines()[0] if r.returncode == 0 else None
    except (OSError, subprocess.SubprocessError, IndexError):
        return None


def cpu_name():
    """The CPU's model name from /proc/cpuinfo (platform.processor() where that is absent)."""
    try:
        with open("/proc/cpuinfo") as f:
            m = re.search(r"^model name\s*:\s*(.*)$", f.read(), re.M)
            return m.group(1).strip() if m else platform.processor()
    except OSError:
        return platform.processor()


def spread(xs):
    """{"median", "min", "max"} of a non-empty list."""
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs)}


class Reporter:
    """A benchmark's output: emit(row) prints {"bench": bench, **row} as one JSON line on stdout
    (and appends it to the file `output` when given); log(msg) prints "[prefix] msg" on stderr."""

    def __init__(self, bench, prefix, output=None):
        self.bench, self.prefix = bench, prefix
        self.out = open(output, "a") if output else None

    def emit(self, row):
        line = json.dumps({"bench": self.bench, **row})
        print(line, flush=True)
        if self.out:
            self.out.write(line + "\n")
            self.out.flush()

    def log(self, msg):
        print(f"[{self.prefix}] {msg}", file=sys.stderr, flush=True)
