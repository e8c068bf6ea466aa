"""`python -m rlkit.steps.doctor_allreduce DIR RANK WORLD`: one all-reduce over the doctor job's nodes.

Rank 0 picks a free port on its host and writes `host:port` into DIR (a directory every node reads); the others wait
for it. Every wait has a timeout, and the outcome is one JSON line: {"ok": true, "backend": ..., "seconds": ...} or
{"ok": false, "error": ...}. NCCL where CUDA is available (the trainer's GPUs), gloo otherwise, as the trainer does.
"""

from __future__ import annotations

import datetime
import json
import sys
import time
from pathlib import Path

TIMEOUT_S = 60.0


def _address(directory: Path, rank: int) -> str:
    from rlkit.servers.health import find_free_port
    from rlkit.slurm.jobenv import advertised_host
    from rlkit.trials.records import write_atomic

    published = directory / "allreduce-address"
    if rank == 0:
        address = f"{advertised_host()}:{find_free_port('0.0.0.0')}"
        write_atomic(published, address)
        return address
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        if published.is_file() and (text := published.read_text().strip()):
            return text
        time.sleep(0.2)
    raise TimeoutError(f"rank 0's address did not appear in {published} within {TIMEOUT_S:.0f} s")


def main(argv: list[str]) -> int:
    started = time.monotonic()
    try:
        directory, rank, world = Path(argv[0]), int(argv[1]), int(argv[2])
        address = _address(directory, rank)
        import torch
        import torch.distributed as dist

        backend = "nccl" if torch.cuda.is_available() else "gloo"
        if backend == "nccl":
            torch.cuda.set_device(0)
        dist.init_process_group(backend, init_method=f"tcp://{address}", rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=TIMEOUT_S))
        ones = torch.ones(1, device="cuda" if backend == "nccl" else "cpu")
        dist.all_reduce(ones)
        total = int(ones.item())
        dist.destroy_process_group()
        if total != world:
            raise RuntimeError(f"the all-reduce summed to {total}, not {world}")
    except Exception as exc:  # every failure becomes the one JSON line the doctor reads
        print(json.dumps({"ok": False, "error": f"{type(exc).__name__}: {exc}"}), flush=True)
        return 1
    print(json.dumps({"ok": True, "backend": backend, "seconds": round(time.monotonic() - started, 1)}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
