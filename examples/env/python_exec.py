#!/usr/bin/env python3
"""A Python interpreter tool: an `rlhf --env_command` environment that runs model-written code in a
sandbox.

The protocol (README, "Multi-turn rollouts"): rlhf writes one JSON object per line on stdin,
    {"id": "17-3", "turn": 0, "prompt": "...", "text": "<completion so far>",
     "action": "<text of the turn that just ended>", "label": <the --label_key value>, "eos": false}
and reads one JSON object per line on stdout, in order:
    {"id": "17-3", "observation": "<text to append>", "done": false, "reward": 1.0}

This tool:
  * a turn that ends with a program `<python>CODE</python>` (run with --stop_strings '</python>')
    gets the observation `<output>...</output>`: what the program printed (stdout and stderr,
    capped), then a line `[exit status N]` or why it was stopped (`[stopped: CPU time limit of 5 s]`,
    `[stopped: wall-clock deadline of 10 s]`, `[stopped: output over 4096 bytes]`, ...);
  * a turn without a program (or one that ended with EOS) is the final answer: done, with reward
    1.0 when the last number of the turn equals the label's (a number, or "... #### 72"), else 0.

Every program runs in a sandbox of its own:
  * a fresh folder (its working directory, HOME and TMPDIR), deleted afterwards;
  * rlimits: CPU seconds (RLIMIT_CPU), address space (RLIMIT_AS), size of any file it writes
    (RLIMIT_FSIZE), open files (RLIMIT_NOFILE), processes (RLIMIT_NPROC: a fork bomb gets EAGAIN),
    no core files;
  * no network: a new network namespace (only a loopback device, down). As root the namespace is
    made directly and the program then runs as an unprivileged user of its own (uid
    --sandbox-uid-base + a per-run number: it can write nowhere but its folder and world-writable
    places, its process count is its own, and every process of that uid is killed at the end, even
    ones that left the process group). Otherwise a user namespace holds the network namespace, and
    the program's process group is killed at the end. Where neither can be made (a container
    without the permission), the tool refuses to start and says why, instead of running code with
    the network open;
  * a wall-clock deadline and a cap on the output it may print, after which it is killed.
A program that breaks a limit is contained and reported in the observation; the episode and the
job continue.

Options: python3 python_exec.py [--python /usr/bin/python3] [--cpu-seconds 5] [--wall-seconds 10] [--memory-mb 512]
    [--file-mb 16] [--open-files 64] [--procs 32] [--output-bytes 4096]
Queries of one batch run one after another: give rlhf an --env_timeout of at least the batch
size times --wall-seconds. Standard library only (Linux); logs go to stderr.

Try it by hand:
    echo '{"id":"0-0","turn":0,"prompt":"","text":"","action":"<python>print(6*7)</python>","label":"42","eos":false}' | python3 examples/env/python_exec.py
"""
import argparse
import ctypes
import json
import os
import re
import resource
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time

CALL = re.compile(r"<python>(.*?)</python>\s*$", re.S)
NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")
CLONE_NEWNET = 0x40000000
CLONE_NEWUSER = 0x10000000
LIBC = ctypes.CDLL(None, use_errno=True)


def log(msg):
    print(f"[python_exec] {msg}", file=sys.stderr, flush=True)


def unshare(flags):
    """unshare(2); OSError on failure."""
    if LIBC.unshare(flags) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def isolation_flags():
    """The unshare flags that give a child no network: CLONE_NEWNET as root, else a user namespace
    with it."""
    return CLONE_NEWNET if os.geteuid() == 0 else CLONE_NEWUSER | CLONE_NEWNET


def probe_isolation():
    """None when a child can get a network namespace of its own here, else the reason."""
    try:
        r = subprocess.run(
            [sys.executable, "-c", "import socket; socket.create_connection(('127.0.0.1', 9), 1)"],
            preexec_fn=lambda: unshare(isolation_flags()),
            capture_output=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as e:
        return f"cannot make a network namespace ({e})"
    text = r.stderr.decode(errors="replace")
    if "Exception occurred in preexec_fn" in text or "preexec_fn" in text:
        return f"cannot make a network namespace: {text.strip().splitlines()[-1]}"
    if "Network is unreachable" not in text:
        return f"a network namespace was made but the network still answers ({text.strip()[-200:]})"
    return None


def final_answer(text):
    """The last number of a text (after the last '####' when there is one), or None."""
    if "####" in text:
        text = text.rsplit("####", 1)[1]
    found = NUMBER.findall(text)
    return float(found[-1].replace(",", "")) if found else None


def label_value(label):
    if isinstance(label, (int, float)):
        return float(label)
    return final_answer(label) if isinstance(label, str) else None


class Sandbox:
    """Runs one program at a time under the limits of `args`."""

    def __init__(self, args):
        self.args = args
        self.root = os.geteuid() == 0
        self.runs = 0

    def _child(self, uid):
        """In the child between fork and exec: limits, namespaces, then the unprivileged user."""
        a = self.args
        os.setsid()
        unshare(isolation_flags())
        mb = 1 << 20
        resource.setrlimit(resource.RLIMIT_CPU, (a.cpu_seconds, a.cpu_seconds + 1))
        resource.setrlimit(resource.RLIMIT_AS, (a.memory_mb * mb, a.memory_mb * mb))
        resource.setrlimit(resource.RLIMIT_FSIZE, (a.file_mb * mb, a.file_mb * mb))
        resource.setrlimit(resource.RLIMIT_NOFILE, (a.open_files, a.open_files))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        if uid is not None:
            resource.setrlimit(resource.RLIMIT_NPROC, (a.procs, a.procs))
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
        else:
            # Non-root: RLIMIT_NPROC counts every process of this user; leave room for the ones
            # that already run.
            mine = sum(1 for p in os.listdir("/proc") if p.isdigit() and owner(p) == os.getuid())
            resource.setrlimit(resource.RLIMIT_NPROC, (mine + a.procs, mine + a.procs))

    def run(self, code):
        """(output text, status line) of running `code`."""
        a = self.args
        self.runs += 1
        uid = a.sandbox_uid_base + (os.getpid() * 1000 + self.runs) % 100000 if self.root else None
        folder = tempfile.mkdtemp(prefix="python_exec-")
        try:
            with open(os.path.join(folder, "main.py"), "w") as f:
                f.write(code)
            if uid is not None:
                os.chown(folder, uid, uid)
                os.chown(os.path.join(folder, "main.py"), uid, uid)
            env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": folder, "TMPDIR": folder,
                   "PYTHONDONTWRITEBYTECODE": "1", "LANG": "C.UTF-8"}
            t0 = time.monotonic()
            proc = subprocess.Popen([a.python, "-I", "main.py"], cwd=folder, env=env,
                                    stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, preexec_fn=lambda: self._child(uid))
            out, why = bytearray(), None
            fd = proc.stdout.fileno()
            while True:
                left = a.wall_seconds - (time.monotonic() - t0)
                if left <= 0:
                    why = f"wall-clock deadline of {a.wall_seconds:g} s"
                    break
                ready, _, _ = select.select([fd], [], [], min(left, 0.5))
                if not ready:
                    continue
                chunk = os.read(fd, 65536)
                if not chunk:
                    break
                out += chunk
                if len(out) > a.output_bytes:
                    why = f"output over {a.output_bytes} bytes"
                    break
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # its group, before reaping it
            except OSError:
                pass
            status = proc.wait()
            self._kill_uid(uid)
            proc.stdout.close()
            if why is None and status == -signal.SIGXCPU:
                why = f"CPU time limit of {a.cpu_seconds} s"
            elif why is None and status == -signal.SIGXFSZ:
                why = f"file size limit of {a.file_mb} MiB"
            text = out[:a.output_bytes].decode(errors="replace")
            if why is not None:
                return text, f"[stopped: {why}]"
            if status < 0:
                return text, f"[killed by signal {signal.Signals(-status).name}]"
            return text, f"[exit status {status}]"
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    def _kill_uid(self, uid):
        """As root: kills every process of the run's uid (ones that left the group too)."""
        if uid is None:
            return
        for _ in range(100):  # a fork bomb may still be forking: until none is left
            left = [int(p) for p in os.listdir("/proc") if p.isdigit() and owner(p) == uid]
            if not left:
                return
            for pid in left:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            time.sleep(0.01)
        log(f"processes of uid {uid} survive the cleanup")


def owner(pid):
    """The real uid of a live process, or None if it is gone or a zombie (which holds nothing)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            fields = dict(line.split(":", 1) for line in f if ":" in line)
    except OSError:
        return None
    if fields.get("State", "").split()[:1] in (["Z"], ["X"]):
        return None
    return int(fields["Uid"].split()[0]) if "Uid" in fields else None


def answer(request, sandbox):
    call = None if request.get("eos") else CALL.search(request.get("action", ""))
    if call:
        try:
            text, status = sandbox.run(call.group(1))
        except OSError as e:  # the sandbox could not start it: the episode goes on
            text, status = "", f"[could not run the program: {e}]"
        if text and not text.endswith("\n"):
            text += "\n"
        return {"observation": f"<output>\n{text}{status}\n</output>", "done": False}
    got, want = final_answer(request.get("action", "")), label_value(request.get("label"))
    correct = got is not None and want is not None and abs(got - want) <= 1e-6 * max(1, abs(want))
    return {"observation": "", "done": True, "reward": 1.0 if correct else 0.0}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--cpu-seconds", type=int, default=5)
    p.add_argument("--wall-seconds", type=float, default=10)
    p.add_argument("--memory-mb", type=int, default=512)
    p.add_argument("--file-mb", type=int, default=16)
    p.add_argument("--open-files", type=int, default=64)
    p.add_argument("--procs", type=int, default=32)
    p.add_argument("--output-bytes", type=int, default=4096)
    p.add_argument("--sandbox-uid-base", type=int, default=200000)
    # An interpreter the sandbox user can read (a per-user one under /root cannot be).
    p.add_argument("--python", default="/usr/bin/python3" if os.path.exists("/usr/bin/python3")
                   else sys.executable)
    args = p.parse_args()
    reason = probe_isolation()
    if reason is not None:
        log(f"refusing to run model-written code with the network open: {reason}\n"
            "hint: run where unshare(CLONE_NEWNET) is permitted (root, or unprivileged user "
            "namespaces: sysctl kernel.unprivileged_userns_clone=1; in Docker, --cap-add SYS_ADMIN "
            "or a seccomp profile that allows unshare)")
        sys.exit(2)
    sandbox = Sandbox(args)
    for line in sys.stdin:
        if not line.strip():
            continue
        request = json.loads(line)
        print(json.dumps({"id": request.get("id"), **answer(request, sandbox)}), flush=True)


if __name__ == "__main__":
    main()
