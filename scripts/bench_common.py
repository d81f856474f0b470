"""What the side-by-side benchmark scripts (bench_transformers.py, bench_trl.py) share: the rlhf
binary's version and the CPU's name for their environment records, and the median/min/max summary
of a list of measurements. Standard library only."""

import platform
import re
import statistics
import subprocess


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
