#!/usr/bin/env python3
"""Checks README.md and docs/*.md against the binary (run by tests/e2e/readme.sh; standard library
only):

  * every `--flag` they name is a flag of some `rlhf <command> --help` (an OpenRLHF name listed
    under a flag as "also --x.y" counts), a peer's name from app/openrlhf_names.cpp or
    app/trl_names.cpp (the migration tables), or a flag of another tool the docs show (mpirun,
    srun, cmake, pip, ...: EXTERNAL below) or of the project's scripts (scripts/*.py, argparse);
  * every relative link resolves: the file exists and, for `file.md#anchor`, the anchor is a
    heading of that file (GitHub's anchor rules).

Usage: scripts/check_docs.py RLHF_BINARY SOURCE_DIR
Exit status 1 with one line per problem.
"""
import glob
import os
import re
import subprocess
import sys

COMMANDS = ["sft", "rm", "grpo", "ppo", "generate", "eval", "score", "export", "import", "bench"]

# Flags of other programs the docs show, by program.
EXTERNAL = {
    "mpirun": ["oversubscribe", "bind-to", "allow-run-as-root", "map-by", "np", "mca"],
    "srun/sbatch": ["mpi", "gpus-per-task", "ntasks-per-node", "cpus-per-task", "signal", "nodes",
                    "cpu-bind", "requeue", "time", "output", "open-mode", "job-name", "ntasks"],
    "pip": ["quiet", "break-system-packages", "no-deps"],
    "huggingface-cli": ["local-dir"],
    "tensorboard": ["logdir"],
    "rlhf/CLI11": ["help", "version", "config"],
    "ctest/cmake": ["output-on-failure", "timeout", "target", "build"],
    "gpu tools": ["gpus"],
}

FLAG = re.compile(r"(?<![\w\-/'])--([A-Za-z][\w.\-]*)")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def rlhf_flags(binary):
    flags = set()
    texts = [subprocess.run([binary, "--help"], capture_output=True, text=True).stdout]
    for c in COMMANDS:
        texts.append(subprocess.run([binary, c, "--help"], capture_output=True, text=True).stdout)
    for t in texts:
        flags.update(re.findall(r"--([A-Za-z][\w.\-]*)", t))
    return flags


def peer_names(src):
    names = set()
    orl = open(os.path.join(src, "app/openrlhf_names.cpp")).read()
    names.update(re.findall(r'^\s+[A-Z_]+\("([a-z_0-9.]+)"', orl, re.M))
    # the rlhf flags the table maps to (some come with other parts of the build)
    names.update(re.findall(r'^\s+ALIAS\w*\("[a-z_0-9.]+", "([a-z_0-9]+)"', orl, re.M))
    trl = open(os.path.join(src, "app/trl_names.cpp")).read()
    names.update(re.findall(r'^\s+\{"([a-z_0-9]+)",', trl, re.M))
    return names


def script_flags(src):
    """The argparse flags of the project's own scripts (scripts/*.py)."""
    names = set()
    for path in glob.glob(os.path.join(src, "scripts", "*.py")):
        names.update(re.findall(r'add_argument\(\s*"--([\w\-]+)"', open(path).read()))
    return names


def anchors(path):
    """GitHub's heading anchors: lower case, punctuation but '-' and '_' dropped, spaces to '-'."""
    out, seen, fence = set(), {}, False
    for line in open(path, encoding="utf-8"):
        if line.startswith("```"):
            fence = not fence
        if fence or not line.startswith("#"):
            continue
        text = line.lstrip("#").strip().lower()
        a = re.sub(r"[^\w\- ]", "", text).replace(" ", "-")
        n = seen.get(a, 0)
        seen[a] = n + 1
        out.add(a if n == 0 else f"{a}-{n}")
    return out


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    binary, src = sys.argv[1], sys.argv[2]
    known = rlhf_flags(binary) | peer_names(src) | script_flags(src)
    for flags in EXTERNAL.values():
        known.update(flags)
    files = [os.path.join(src, "README.md")] + sorted(glob.glob(os.path.join(src, "docs", "*.md")))
    problems = []
    for path in files:
        rel = os.path.relpath(path, src)
        for n, line in enumerate(open(path, encoding="utf-8"), 1):
            for f in FLAG.findall(line):
                f = f.rstrip(".-")
                if f not in known:
                    problems.append(f"{rel}:{n}: --{f} is not a flag of any rlhf command")
            for target in LINK.findall(line):
                if re.match(r"^[a-z]+:", target):  # http:, https:, mailto:
                    continue
                file_part, _, anchor = target.partition("#")
                dest = path if file_part == "" else os.path.normpath(
                    os.path.join(os.path.dirname(path), file_part))
                if not os.path.exists(dest):
                    problems.append(f"{rel}:{n}: link {target}: no such file")
                elif anchor and dest.endswith(".md") and anchor not in anchors(dest):
                    problems.append(f"{rel}:{n}: link {target}: no heading #{anchor} there")
    for p in problems:
        print(p)
    print(f"check_docs: {len(files)} files, {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
