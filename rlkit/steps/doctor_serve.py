"""`python -m rlkit.steps.doctor_serve CONFIG TIMEOUT`: start one inference server as the job's serve step would (the
config's backend, model, arguments and environment, in the server image when there is one), wait until it is healthy
and refuses a request without its token, then stop it. One JSON line says how it went; the server's last output
lines come with a failure (token blanked)."""

from __future__ import annotations

import io
import json
import os
import secrets
import sys
import tempfile
import time
from pathlib import Path

LAST_LINES = 8


def main(argv: list[str]) -> int:
    from rlkit.config.allocation import parse_allocation
    from rlkit.config.load import load_config
    from rlkit.servers.backend import backend_for
    from rlkit.servers.guard_check import prove_guard
    from rlkit.servers.health import find_free_port, wait_healthy
    from rlkit.servers.log_redact import popen_redacted
    from rlkit.servers.scratch import EngineScratch
    from rlkit.steps.serve import launch_env, server_launch

    started = time.monotonic()
    config = load_config(argv[0])
    timeout = float(argv[1])
    alloc = parse_allocation(config.allocation_mode)
    assert alloc.server is not None, "the doctor starts a server only for a config that has servers"
    backend, token, port = backend_for(alloc.server.backend), secrets.token_hex(16), find_free_port("0.0.0.0")
    sink = io.StringIO()
    with tempfile.TemporaryDirectory(prefix="rlkit-doctor-") as secret_dir:
        os.chmod(secret_dir, 0o700)
        try:
            launch = server_launch(config, backend, alloc.server.tp, port, token=token, secret_dir=Path(secret_dir),
                                   index=0)
        except Exception as exc:  # refused extra_args: reported, nothing started
            print(json.dumps({"ok": False, "error": str(exc)}), flush=True)
            return 1
        scratch = EngineScratch.create("engine", parent=secret_dir)  # removed with secret_dir
        proc, output = popen_redacted(launch.argv, [token], sink=sink, env=launch_env(launch, scratch))
        try:
            wait_healthy(f"http://127.0.0.1:{port}", timeout, process=proc)
            prove_guard(f"http://127.0.0.1:{port}", backend, token)
            answer = {"ok": True, "backend": backend.name, "seconds": round(time.monotonic() - started, 1)}
        except Exception as exc:  # not healthy in time, exited, or answered without the token
            answer = {"ok": False, "error": f"{exc}", "last_lines": sink.getvalue().splitlines()[-LAST_LINES:]}
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except Exception:
                proc.kill()
            output.join(5.0)
    print(json.dumps(answer), flush=True)
    return 0 if answer["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
