"""Copy a server's output to the step's own output with the trial token blanked out.

Engines print their arguments at start-up (SGLang prints its whole `server_args`, `api_key` included), and the step's
output is the trial's `logs/server-N.log`, which anyone who can read the trial directory reads: so the server's
stdout+stderr go through a pipe and this copier, never straight to the log. It works on bytes (a server may print
anything), reads in a daemon thread (a fast server never waits on it; a server whose children keep the pipe open never
keeps the step alive) and holds back only what could still be the start of a token, so a token split across writes
or reads is caught too. A watcher (`on_line`) may see each line as it was written, token blanked and cut to LINE_LIMIT
bytes: how `rlkit serve` learns an engine's reason for not starting (rlkit.servers.startup_failure) without holding
its output.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterable
from typing import Any, TextIO

REDACTED = "<token>"
READ_SIZE = 65536
MAX_HELD = 65536  # a partial line longer than this is written out (all but a possible token start) without its newline
LINE_LIMIT = 4096  # bytes of a line a watcher sees (the rest of a longer line is dropped for it, not for the log)


class Redactor:
    """Blanks every occurrence of the secrets in a byte stream fed in arbitrary pieces."""

    def __init__(self, secrets: Iterable[str], replacement: str = REDACTED) -> None:
        # longest first, so a secret that contains another is blanked whole; empty secrets have nothing to hide
        self._secrets = sorted({s.encode() for s in secrets if s}, key=len, reverse=True)
        self._replacement = replacement.encode()
        self._hold = max((len(s) for s in self._secrets), default=1) - 1
        self._pending = b""

    def _blank(self, data: bytes) -> bytes:
        for secret in self._secrets:
            data = data.replace(secret, self._replacement)
        return data

    def feed(self, chunk: bytes) -> bytes:
        """The complete lines (and, of a long partial line, all that cannot be part of a token) now safe to write."""
        self._pending += chunk
        end = max(self._pending.rfind(b"\n"), self._pending.rfind(b"\r")) + 1  # \r: progress bars
        ready, self._pending = self._blank(self._pending[:end]), self._pending[end:]
        if len(self._pending) > MAX_HELD:
            # blank what is there, then keep back the longest tail that could still be the start of a secret
            blanked = self._blank(self._pending)
            cut = len(blanked) - self._hold
            ready, self._pending = ready + blanked[:cut], blanked[cut:]
        return ready

    def finish(self) -> bytes:
        """Whatever is left (a last line without its newline), blanked."""
        rest, self._pending = self._blank(self._pending), b""
        return rest


class RedactedCopy:
    """A daemon thread copying a pipe to `sink` (default sys.stdout), secrets blanked, until EOF; it owns and closes
    the read end `fd`. `on_line`, when given, is called (in that thread) with each line of the blanked output, without
    its line end and cut to LINE_LIMIT bytes; one that raises is not called again, and the copy goes on."""

    def __init__(self, fd: int, secrets: Iterable[str], sink: TextIO | None = None,
                 on_line: Callable[[str], None] | None = None) -> None:
        self._fd = fd
        self._redactor = Redactor(secrets)
        self._sink = sink if sink is not None else sys.stdout
        self._sink_ok = True
        self._on_line = on_line
        self._line = b""  # the watched line so far (at most LINE_LIMIT bytes)
        self._thread = threading.Thread(target=self._run, name="server-log-copy", daemon=True)

    def start(self) -> RedactedCopy:
        self._thread.start()
        return self

    def _write(self, data: bytes) -> None:
        if data and self._sink_ok:
            try:
                self._sink.write(data.decode("utf-8", errors="replace"))
                self._sink.flush()
            except (OSError, ValueError):  # our output is gone: keep draining the pipe so the server never blocks
                self._sink_ok = False
        self._watch(data)

    def _watch(self, data: bytes) -> None:
        """Hand each complete line of `data` (blanked) to the watcher; keep a bounded start of an unfinished one."""
        if self._on_line is None:
            return
        for piece in data.splitlines(keepends=True):  # bytes split only at \n, \r and \r\n
            self._line += piece[:max(0, LINE_LIMIT - len(self._line))]
            if piece.endswith((b"\n", b"\r")):
                self._emit()

    def _emit(self) -> None:
        line, self._line = self._line.rstrip(b"\r\n").decode("utf-8", errors="replace"), b""
        if self._on_line is None:
            return
        try:
            self._on_line(line)
        except Exception:  # a broken watcher must not stop the copy: the server would block on a full pipe
            self._on_line = None

    def _run(self) -> None:
        try:
            while True:
                try:
                    chunk = os.read(self._fd, READ_SIZE)
                except OSError:
                    break
                if not chunk:
                    break
                self._write(self._redactor.feed(chunk))
            self._write(self._redactor.finish())
            if self._line:
                self._emit()  # the last line, without its newline
        finally:
            os.close(self._fd)

    def join(self, timeout: float) -> bool:
        """Wait up to `timeout` s for EOF (after the server exited, for its last lines); True when the copy ended."""
        self._thread.join(timeout)
        return not self._thread.is_alive()


def popen_redacted(argv: list[str], secrets: Iterable[str], *, sink: TextIO | None = None,
                   on_line: Callable[[str], None] | None = None,
                   **popen_kwargs: Any) -> tuple[subprocess.Popen[bytes], RedactedCopy]:
    """Start `argv` with its stdout and stderr merged into one pipe that a RedactedCopy drains into `sink` (and shows
    `on_line`, line by line)."""
    read_end, write_end = os.pipe()
    try:
        proc = subprocess.Popen(argv, stdout=write_end, stderr=write_end, **popen_kwargs)
    except BaseException:
        os.close(read_end)
        raise
    finally:
        os.close(write_end)  # only the server holds the write end, so its exit is our EOF
    return proc, RedactedCopy(read_end, secrets, sink, on_line).start()
