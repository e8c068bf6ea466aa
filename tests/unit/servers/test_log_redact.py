"""The server-output copy of `rlkit serve` (rlkit.servers.log_redact): real child processes print the token; what
reaches the step's output has `<token>` in its place, the last line without its newline included, and never the token.
"""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import time

from rlkit.servers.log_redact import MAX_HELD, REDACTED, Redactor, popen_redacted

TOKEN = "s3cr3t-Tok3n-0123456789abcdef"


def copy_of(script: str, *, join_timeout: float = 20.0) -> tuple[str, subprocess.Popen[bytes]]:
    """Run `python -c script` through popen_redacted; its copied output once the copy ended."""
    sink = io.StringIO()
    proc, output = popen_redacted([sys.executable, "-c", script, TOKEN], [TOKEN], sink=sink)
    assert proc.wait(timeout=20) == 0
    assert output.join(join_timeout), "the copy did not end after the child exited"
    return sink.getvalue(), proc


def test_every_split_of_the_token_across_feeds_is_blanked() -> None:
    """Deterministic read boundaries: the token cut at every position, across lines and at the very end."""
    text = f"a {TOKEN} b\nline two {TOKEN}{TOKEN}\n{TOKEN} partial end {TOKEN}".encode()
    for cut in range(1, len(text)):
        redactor = Redactor([TOKEN])
        out = redactor.feed(text[:cut]) + redactor.feed(text[cut:]) + redactor.finish()
        assert TOKEN.encode() not in out
        assert out == text.replace(TOKEN.encode(), REDACTED.encode()), cut


def test_a_byte_at_a_time_and_a_long_line_without_newline() -> None:
    """A partial line longer than MAX_HELD is written out early, but never a token's start (held back) with it."""
    text = b"x" * (MAX_HELD - 5) + TOKEN.encode() + b"y" * MAX_HELD + TOKEN.encode()
    redactor = Redactor([TOKEN])
    pieces = [redactor.feed(text[i:i + 1]) for i in range(len(text))]
    early = b"".join(pieces)
    assert early, "a long line without newline must not be held whole"
    out = early + redactor.finish()
    assert out == text.replace(TOKEN.encode(), REDACTED.encode())


def test_child_output_has_the_placeholder_and_never_the_token() -> None:
    script = r"""
import os, sys, time
tok = sys.argv[1].encode()
print("server_args=ServerArgs(api_key='%s', port=1)" % tok.decode(), flush=True)
sys.stderr.write("stderr too: " + tok.decode() + "\n"); sys.stderr.flush()
os.write(1, b"split over two writes: " + tok[:7]); time.sleep(0.2); os.write(1, tok[7:] + b" done\n")
os.write(1, b"\xff\xfe not utf-8 " + tok + b"\n")
os.write(1, b"last line without newline " + tok)
"""
    out, _ = copy_of(script)
    assert TOKEN not in out
    assert "api_key='<token>'" in out
    assert "stderr too: <token>\n" in out
    assert "split over two writes: <token> done\n" in out
    assert "\ufffd" in out and "not utf-8 <token>\n" in out
    assert out.endswith("last line without newline <token>")


def test_fast_output_is_drained_without_blocking_the_child() -> None:
    """~8 MB as fast as the child can write (far over a pipe's 64 KiB): every line arrives, each token blanked."""
    script = r"""
import sys
tok = sys.argv[1]
out = sys.stdout
for i in range(100000):
    out.write(f"{i:06d} {tok} {'.' * 40}\n")
out.write(tok * 3000)
out.flush()
"""
    started = time.monotonic()
    out, _ = copy_of(script)
    assert time.monotonic() - started < 15
    assert TOKEN not in out
    lines = out.split("\n")
    assert len(lines) == 100001
    assert all(line.startswith(f"{i:06d} <token> ") for i, line in enumerate(lines[:-1]))
    assert lines[-1] == REDACTED * 3000


def test_a_child_holding_the_pipe_does_not_keep_the_copy_waited_on() -> None:
    """The server exits but a process it started keeps the pipe open: join gives up within its timeout."""
    script = r"""
import subprocess, sys
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
print(child.pid, sys.argv[1], flush=True)
"""
    sink = io.StringIO()
    proc, output = popen_redacted([sys.executable, "-c", script, TOKEN], [TOKEN], sink=sink)
    try:
        assert proc.wait(timeout=20) == 0
        started = time.monotonic()
        assert not output.join(0.3)
        assert time.monotonic() - started < 3
        deadline = time.monotonic() + 5
        while not sink.getvalue().endswith("\n") and time.monotonic() < deadline:
            time.sleep(0.01)
        assert sink.getvalue().endswith(" <token>\n")
    finally:
        grandchild = int(sink.getvalue().split()[0])
        os.kill(grandchild, signal.SIGKILL)  # the one process this test started through the child
    assert output.join(5), "the copy must end once the last writer is gone"


def test_no_secret_copies_unchanged() -> None:
    redactor = Redactor([""])
    assert redactor.feed(b"abc\ndef") == b"abc\n"
    assert redactor.finish() == b"def"
