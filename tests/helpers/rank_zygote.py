"""A zygote for the tests' gloo ranks: one process imports torch, transformers, peft and the trainer once, then forks
one child per rank asked for. A rank started with `python -c` spends ~9 CPU-s importing those before its first line
(measured on the 2-core dev machine; about 70 ranks per suite run), which the fork shares instead.

What the rank runs is unchanged: the same `-c` source and arguments, its own environment (cleared and set from the
request, so RANK, WORLD_SIZE and fault-injection variables are the rank's), working directory, stdin from /dev/null
and stdout+stderr into a pipe of the test process. Only the interpreter start differs; the cluster trials start
their trainers with srun as users do. The zygote is single-threaded (a fork from a process with other threads can
inherit a held lock) and never initialises torch's thread pools or torch.distributed before forking.

`ForkedRank` is the test side: the subset of `subprocess.Popen` that tests/helpers/gloo_ranks.py uses (pid, poll,
communicate, kill, returncode); the exit code arrives from the zygote, which reaps the child (-9: killed by SIGKILL).
"""

from __future__ import annotations

import atexit
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

PRELOAD = ("torch", "torch.distributed.fsdp", "torch.distributed.tensor", "transformers",
           "transformers.models.qwen2.modeling_qwen2", "peft", "safetensors.torch", "rlkit.trainer.engine")
START_TIMEOUT = 180.0

ZYGOTE = r'''
import atexit, builtins, importlib, io, json, os, selectors, signal, socket, sys, threading, traceback

listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
listener.bind(sys.argv[1])
listener.listen(64)
for name in sys.argv[2].split(","):
    importlib.import_module(name)
wake_r, wake_w = os.pipe()
os.set_blocking(wake_w, False)
signal.set_wakeup_fd(wake_w)
signal.signal(signal.SIGCHLD, lambda *_: None)
print("ready", flush=True)


def run_child(request, out_fd, conns):
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    for sock in (listener, *conns):
        sock.close()
    os.close(wake_r), os.close(wake_w)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0), os.dup2(out_fd, 1), os.dup2(out_fd, 2)
    os.close(null), os.close(out_fd)
    sys.stdin = io.TextIOWrapper(io.BufferedReader(io.FileIO(0, "r", closefd=False)))
    sys.stdout = io.TextIOWrapper(io.BufferedWriter(io.FileIO(1, "w", closefd=False)), errors="strict")
    sys.stderr = io.TextIOWrapper(io.BufferedWriter(io.FileIO(2, "w", closefd=False)), errors="backslashreplace",
                                  line_buffering=True)
    sys.__stdin__, sys.__stdout__, sys.__stderr__ = sys.stdin, sys.stdout, sys.stderr
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    sys.argv = ["-c", *request["args"]]
    code = 0
    try:
        import torch
        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS") or 1))
        exec(compile(request["source"], "<string>", "exec"), {"__name__": "__main__", "__builtins__": builtins})
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            code = exc.code or 0
        else:
            print(exc.code, file=sys.stderr)
            code = 1
    except BaseException:
        traceback.print_exc()
        code = 1
    try:
        threading._shutdown()  # join non-daemon threads, as the interpreter's exit does
        atexit._run_exitfuncs()
        sys.stdout.flush(), sys.stderr.flush()
    finally:
        os._exit(code)


selector = selectors.DefaultSelector()
selector.register(listener, selectors.EVENT_READ)
selector.register(wake_r, selectors.EVENT_READ)
waiting = {}  # child pid -> the connection that asked for it
while True:
    for key, _ in selector.select():
        if key.fileobj is listener:
            conn, _ = listener.accept()
            data, fds, _, _ = socket.recv_fds(conn, 1 << 22, 1)
            pid = os.fork()
            if pid == 0:
                run_child(json.loads(data), fds[0], list(waiting.values()) + [conn])
            os.close(fds[0])
            conn.send(str(pid).encode())
            waiting[pid] = conn
        else:
            os.read(wake_r, 4096)
    while waiting:
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid == 0:
            break
        conn = waiting.pop(pid, None)
        if conn is not None:
            try:
                conn.send(str(os.waitstatus_to_exitcode(status)).encode())
            except OSError:
                pass
            conn.close()
'''


class _Zygote:
    """The session's zygote process, started at the first rank and ended by PID when the session's process exits."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._process: subprocess.Popen[str] | None = None
        self._dir = ""

    def path(self) -> str:
        with self._lock:
            if self._process is None or self._process.poll() is not None:
                self._start()
            return str(Path(self._dir) / "zygote.sock")

    def _start(self) -> None:
        self._dir = tempfile.mkdtemp(prefix="rlkit-zygote-")
        env = {**os.environ, "OMP_NUM_THREADS": "1"}  # libgomp reads it once, at torch's import
        log = Path(self._dir) / "zygote.log"  # the imports' warnings; stdout carries only "ready"
        with log.open("w") as log_file:
            process = subprocess.Popen([sys.executable, "-c", ZYGOTE, str(Path(self._dir) / "zygote.sock"),
                                        ",".join(PRELOAD)], env=env, stdin=subprocess.DEVNULL,
                                       stdout=subprocess.PIPE, stderr=log_file, text=True)
        self._process = process
        atexit.register(self._stop, process)
        selector = selectors.DefaultSelector()
        assert process.stdout is not None
        selector.register(process.stdout, selectors.EVENT_READ)
        deadline = time.monotonic() + START_TIMEOUT
        line = "-"
        while line and line.strip() != "ready":  # a library may print to stdout while it is imported
            left = deadline - time.monotonic()
            line = process.stdout.readline() if left > 0 and selector.select(left) else ""
        if not line:
            process.kill()
            process.wait()
            raise RuntimeError(f"the rank zygote did not start:\n{log.read_text()[-3000:]}")

    def _stop(self, process: subprocess.Popen[str]) -> None:
        if process.poll() is None:
            process.kill()
            process.wait()


ZYGOTE_PROCESS = _Zygote()


class ForkedRank:
    """One rank forked by the zygote, read like a `subprocess.Popen` with stdout=PIPE, stderr=STDOUT, text=True."""

    def __init__(self, source: str, args: list[str], env: dict[str, str]) -> None:
        read_end, write_end = os.pipe()
        self._out = read_end
        self._chunks: list[bytes] = []
        self._eof = False
        self.returncode: int | None = None
        self._conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self._conn.connect(ZYGOTE_PROCESS.path())
            request = {"source": source, "args": args, "env": env, "cwd": os.getcwd()}
            socket.send_fds(self._conn, [json.dumps(request).encode()], [write_end])
            self.pid = int(self._conn.recv(64))
        finally:
            os.close(write_end)

    def poll(self) -> int | None:
        if self.returncode is None:
            self._conn.setblocking(False)
            try:
                self._exited(self._conn.recv(64))
            except BlockingIOError:
                pass
            finally:
                self._conn.setblocking(True)
        return self.returncode

    def kill(self) -> None:
        if self.returncode is None:
            os.kill(self.pid, signal.SIGKILL)

    def communicate(self, timeout: float | None = None) -> tuple[str, None]:
        """Everything the rank wrote, once it has exited; subprocess.TimeoutExpired (output kept) past `timeout`."""
        deadline = None if timeout is None else time.monotonic() + timeout
        selector = selectors.DefaultSelector()
        if not self._eof:
            selector.register(self._out, selectors.EVENT_READ)
        while not self._eof:
            left = None if deadline is None else deadline - time.monotonic()
            if (left is not None and left <= 0) or not selector.select(left):
                raise subprocess.TimeoutExpired(["-c", "<rank>"], timeout or 0.0)
            chunk = os.read(self._out, 1 << 16)
            self._chunks.append(chunk)
            self._eof = not chunk
        os.close(self._out) if self._out >= 0 else None
        self._out = -1
        if self.returncode is None:
            self._conn.settimeout(None if deadline is None else max(deadline - time.monotonic(), 0.001))
            try:
                self._exited(self._conn.recv(64))
            except TimeoutError:
                raise subprocess.TimeoutExpired(["-c", "<rank>"], timeout or 0.0) from None
        return b"".join(self._chunks).decode(errors="replace"), None

    def _exited(self, message: bytes) -> None:
        if not message:
            raise RuntimeError(f"the rank zygote ended before reporting rank pid {self.pid}'s exit")
        self.returncode = int(message)
        self._conn.close()
