"""Start a Python script as N torch.distributed ranks on this machine (gloo, one process each), as srun starts
trainer ranks, and wait for them. Ranks still running when the wait times out are killed by PID, so a hung
collective fails the test instead of outliving it. A `-c` script's ranks are forked from the session's rank zygote
(tests/helpers/rank_zygote.py: torch, transformers and peft imported once, not once per rank)."""

from __future__ import annotations

import os
import subprocess
import sys

from rlkit.servers.health import find_free_port
from tests.helpers.rank_zygote import ForkedRank

Rank = subprocess.Popen[str] | ForkedRank


def start_ranks(world: int, argv: list[str], extra_env: dict[str, str] | None = None) -> list[Rank]:
    """`python <argv>` once per rank, with the rank's RANK/WORLD_SIZE/LOCAL_RANK and one rendezvous port."""
    port = find_free_port()
    procs: list[Rank] = []
    for rank in range(world):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1", **(extra_env or {})}
        if argv[0] == "-c":
            procs.append(ForkedRank(argv[1], argv[2:], env))
        else:
            procs.append(subprocess.Popen([sys.executable, *argv], env=env, stdout=subprocess.PIPE,
                                          stderr=subprocess.STDOUT, text=True))
    return procs


def wait_ranks(procs: list[Rank], *, expect: int = 0, timeout: float = 300.0) -> list[str]:
    """Every rank's output; asserts that each exited with `expect` (the report shows the tail of every rank)."""
    try:
        outputs = [p.communicate(timeout=timeout)[0] for p in procs]
    except subprocess.TimeoutExpired:
        for p in procs:
            if p.poll() is None:
                p.kill()
        outputs = [p.communicate()[0] for p in procs]
        raise AssertionError(f"ranks still running after {timeout:.0f} s:\n{_report(procs, outputs)}") from None
    assert all(p.returncode == expect for p in procs), _report(procs, outputs)
    return outputs


def run_ranks(world: int, argv: list[str], extra_env: dict[str, str] | None = None, *, expect: int = 0) -> list[str]:
    return wait_ranks(start_ranks(world, argv, extra_env), expect=expect)


def _report(procs: list[Rank], outputs: list[str]) -> str:
    return "\n".join(f"--- rank {rank}, exit code {p.returncode}:\n{text[-3000:]}"
                     for rank, (p, text) in enumerate(zip(procs, outputs, strict=True)))
