"""The fork server behind the tests' rank zygote (rank_zygote.py) and CLI zygote (cli_zygote.py): one process imports
a list of modules once, then forks one child per request, so each child starts with those imports done.

A child runs what a fresh interpreter would: a `-c` source or a `-m` module, with its own argv, environment (cleared
and set from the request), working directory, stdin from /dev/null, and stdout and stderr into pipes of the test
process (one pipe for both, or one each). Its exit code is the interpreter's (SystemExit's code; 1 and the traceback
on stderr for an uncaught exception), after atexit handlers and flushing; the zygote reaps the child and sends the
code back (-9: killed by SIGKILL). The zygote is single-threaded: a fork from a process with other threads can
inherit a lock held by one of them.

`ForkedProcess` is the test side: the subset of `subprocess.Popen` the helpers use (pid, poll, communicate, kill,
returncode).
"""

from __future__ import annotations

import atexit
import json
import os
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from pathlib import Path

START_TIMEOUT = 180.0

ZYGOTE = r'''
import atexit, builtins, gc, importlib, io, json, os, runpy, selectors, signal, socket, sys, threading, types

listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
listener.bind(sys.argv[1])
listener.listen(64)
for name in filter(None, sys.argv[2].split(",")):
    importlib.import_module(name)
gc.freeze()  # the imports' objects stay out of the children's collections, which would touch (copy) their pages
wake_r, wake_w = os.pipe()
os.set_blocking(wake_w, False)
signal.set_wakeup_fd(wake_w)
signal.signal(signal.SIGCHLD, lambda *_: None)
print("ready", flush=True)


def run_child(request, out_fds, conns):
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    for sock in (listener, *conns):
        sock.close()
    os.close(wake_r), os.close(wake_w)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0), os.dup2(out_fds[0], 1), os.dup2(out_fds[-1], 2)
    for fd in {null, *out_fds}:
        os.close(fd)
    sys.stdin = io.TextIOWrapper(io.BufferedReader(io.FileIO(0, "r", closefd=False)))
    sys.stdout = io.TextIOWrapper(io.BufferedWriter(io.FileIO(1, "w", closefd=False)), errors="strict")
    sys.stderr = io.TextIOWrapper(io.BufferedWriter(io.FileIO(2, "w", closefd=False)), errors="backslashreplace",
                                  line_buffering=True)
    sys.__stdin__, sys.__stdout__, sys.__stderr__ = sys.stdin, sys.stdout, sys.stderr
    code = 0
    try:
        os.environ.clear()
        os.environ.update(request["env"])
        os.chdir(request["cwd"])
        if "torch" in sys.modules:
            sys.modules["torch"].set_num_threads(int(os.environ.get("OMP_NUM_THREADS") or 1))
        if "module" in request:  # `python -m`: argv[0] becomes the module's file, sys.path[0] the directory
            sys.argv = ["-m", *request["args"]]
            sys.path[0] = os.getcwd()
            sys.modules["__main__"] = types.ModuleType("__main__")  # not the zygote's namespace
            runpy._run_module_as_main(request["module"])
        else:
            sys.argv = ["-c", *request["args"]]
            exec(compile(request["source"], "<string>", "exec"), {"__name__": "__main__", "__builtins__": builtins})
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            code = exc.code or 0
        else:
            print(exc.code, file=sys.stderr)
            code = 1
    except BaseException as exc:
        exc.__traceback__ = exc.__traceback__.tb_next  # the trace starts where `python -m`'s or `-c`'s does
        sys.excepthook(type(exc), exc, exc.__traceback__)
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
            data, fds, _, _ = socket.recv_fds(conn, 1 << 22, 2)
            pid = os.fork()
            if pid == 0:
                run_child(json.loads(data), fds, list(waiting.values()) + [conn])
            for fd in fds:
                os.close(fd)
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


class Zygote:
    """One session's zygote process: started at the first request with `env`, ended by PID when the session's process
    exits. `env` is what the preloaded modules saw at import (callers compare it with a request's)."""

    def __init__(self, name: str, preload: tuple[str, ...], env: dict[str, str]) -> None:
        self.name = name
        self.preload = preload
        self.env = env
        self._lock = threading.Lock()
        self._process: subprocess.Popen[str] | None = None
        self._dir = ""

    def path(self) -> str:
        """The socket of a running zygote (started now if none is); RuntimeError if it cannot start."""
        with self._lock:
            if self._process is None or self._process.poll() is not None:
                self._start()
            return str(Path(self._dir) / "zygote.sock")

    def _start(self) -> None:
        self._dir = tempfile.mkdtemp(prefix=f"rlkit-{self.name}-zygote-")
        log = Path(self._dir) / "zygote.log"  # the imports' warnings; stdout carries only "ready"
        with log.open("w") as log_file:
            process = subprocess.Popen([sys.executable, "-c", ZYGOTE, str(Path(self._dir) / "zygote.sock"),
                                        ",".join(self.preload)], env=self.env, stdin=subprocess.DEVNULL,
                                       stdout=subprocess.PIPE, stderr=log_file, text=True)
        self._process = process
        atexit.register(self._stop, process, self._dir)
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
            raise RuntimeError(f"the {self.name} zygote did not start:\n{log.read_text()[-3000:]}")

    def _stop(self, process: subprocess.Popen[str], directory: str) -> None:
        if process.poll() is None:
            process.kill()
            process.wait()
        shutil.rmtree(directory, ignore_errors=True)  # its socket and log


class ForkedProcess:
    """One child forked by `zygote`, read like a `subprocess.Popen` with text pipes: stdout and stderr apart when
    `split_stderr`, else stderr into stdout (communicate's second value is then None)."""

    def __init__(self, zygote: Zygote, request: Mapping[str, object], *, split_stderr: bool) -> None:
        pipes = [os.pipe() for _ in range(2 if split_stderr else 1)]
        self._outs = [read_end for read_end, _ in pipes]
        self._chunks: dict[int, list[bytes]] = {fd: [] for fd in self._outs}
        self._open = set(self._outs)
        self.returncode: int | None = None
        self._conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self._conn.connect(zygote.path())
            socket.send_fds(self._conn, [json.dumps(request).encode()], [write_end for _, write_end in pipes])
            self.pid = int(self._conn.recv(64))
        except BaseException:
            self._close_outs()
            self._conn.close()
            raise
        finally:
            for _, write_end in pipes:
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

    def communicate(self, timeout: float | None = None) -> tuple[str, str | None]:
        """Everything the child wrote, once it has exited; subprocess.TimeoutExpired (output kept) past `timeout`."""
        deadline = None if timeout is None else time.monotonic() + timeout
        selector = selectors.DefaultSelector()
        for fd in self._open:
            selector.register(fd, selectors.EVENT_READ)
        while self._open:
            left = None if deadline is None else deadline - time.monotonic()
            ready = selector.select(left) if left is None or left > 0 else []
            if not ready:
                raise subprocess.TimeoutExpired(["<forked>"], timeout or 0.0)
            for key, _ in ready:
                chunk = os.read(key.fd, 1 << 16)
                self._chunks[key.fd].append(chunk)
                if not chunk:
                    selector.unregister(key.fd)
                    self._open.discard(key.fd)
        self._close_outs()
        if self.returncode is None:
            self._conn.settimeout(None if deadline is None else max(deadline - time.monotonic(), 0.001))
            try:
                self._exited(self._conn.recv(64))
            except TimeoutError:
                raise subprocess.TimeoutExpired(["<forked>"], timeout or 0.0) from None
        texts = [b"".join(self._chunks[fd]).decode(errors="replace") for fd in self._chunks]
        return texts[0], texts[1] if len(texts) > 1 else None

    def _close_outs(self) -> None:
        for fd in self._outs:
            if fd >= 0:
                os.close(fd)
        self._outs = [-1 for _ in self._outs]

    def _exited(self, message: bytes) -> None:
        if not message:
            raise RuntimeError(f"the zygote ended before reporting child pid {self.pid}'s exit")
        self.returncode = int(message)
        self._conn.close()
