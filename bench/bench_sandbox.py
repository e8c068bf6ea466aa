"""The code tool's launcher against bubblewrap (issue 29 item 4): start-up time per run, and which of a few probes
each one holds, measured on this node. Prints figures; asserts nothing.

  rlkit     rlkit.agent.code_tool.run_python (supervisor, guard, runner: namespaces, read-only mounts, hidden
            paths, a tmpfs scratch directory, rlimits, the seccomp filter), isolation required
  bwrap     `bwrap --unshare-all --die-with-parent --new-session --ro-bind / / --proc /proc --dev /dev --tmpfs
            SCRATCH --chdir SCRATCH --clearenv` around the same interpreter: what bubblewrap gives without a
            seccomp program of its own (one would be compiled and passed with --seccomp FD, as flatpak does)
The probes (each prints a line saying whether the step was refused): a socket, a memfd, io_uring, a file written
outside the scratch directory, a fork.

Run: `PYTHONPATH=. python bench/bench_sandbox.py [--runs 10]` (needs /usr/bin/bwrap: `apt-get install bubblewrap`).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from rlkit.agent.code_tool import CodeLimits, run_python  # noqa: E402

PYTHON = "/usr/bin/python3"
PROBES = {
    "a socket": "import socket\nsocket.socket()",
    "a memfd": "import os\nos.memfd_create('m')",
    "io_uring": "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\nfd = libc.syscall(425, 8, bytes(120))\n"
                "raise SystemExit(0 if fd >= 0 else 1)",
    "a write outside the scratch directory": "open('/var/tmp/rlkit-bench-sandbox', 'w').write('x')",
    "a fork": "import os\npid = os.fork()\nif pid == 0:\n    os._exit(0)\nos.waitpid(pid, 0)",
}


def with_rlkit(code: str, scratch_root: Path) -> tuple[bool, float]:
    """(the code ran to a zero exit, seconds)."""
    started = time.perf_counter()
    result = run_python(code, limits=CodeLimits(), scratch_root=scratch_root, isolation="required")
    return result.ok, time.perf_counter() - started


def with_bwrap(code: str, scratch: Path) -> tuple[bool, float]:
    argv = ["bwrap", "--unshare-all", "--die-with-parent", "--new-session", "--ro-bind", "/", "/", "--proc", "/proc",
            "--dev", "/dev", "--tmpfs", str(scratch), "--chdir", str(scratch), "--clearenv", PYTHON, "-I", "-c", code]
    started = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=60)
    return done.returncode == 0, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args()
    if shutil.which("bwrap") is None:
        raise SystemExit("bwrap is not installed here: apt-get install bubblewrap")
    scratch_root = Path(tempfile.mkdtemp(prefix="bench-sandbox-"))
    scratch_root.chmod(0o711)
    launchers = {"rlkit": lambda code: with_rlkit(code, scratch_root),
                 "bwrap": lambda code: with_bwrap(code, scratch_root)}
    for name, launch in launchers.items():
        seconds = [launch("pass")[1] for _ in range(args.runs)]
        print(f"{name:6} start-up: median {statistics.median(seconds) * 1000:.0f} ms over {args.runs} runs of `pass`")
    for probe, code in PROBES.items():
        held = {name: "refused" if not launch(code)[0] else "ALLOWED" for name, launch in launchers.items()}
        print(f"{probe:40} rlkit {held['rlkit']:8} bwrap {held['bwrap']}")
    Path("/var/tmp/rlkit-bench-sandbox").unlink(missing_ok=True)
    shutil.rmtree(scratch_root, ignore_errors=True)
    print(f"(as uid {os.geteuid()}; rlkit runs the code as nobody under root, bwrap as this user)")


if __name__ == "__main__":
    main()
