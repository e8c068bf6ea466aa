"""Single-function Slurm jobs from the login node (image builds, `rlkit doctor`), submitted with submitit: what
submitit is for (the RL job itself is heterogeneous, which submitit cannot express)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rlkit.errors import SlurmError

# minutes a single-function job may wait in the queue, beyond its own time limit, before the command stops waiting
# (the job keeps its place: wait_for_job says how to follow or cancel it)
QUEUE_WAIT_MIN = 120


def last_line(exc: BaseException) -> str:
    """The reason in an exception submitit raised (sbatch's answer, or the job's traceback): its last line."""
    lines = str(exc).strip().splitlines()
    return lines[-1] if lines else type(exc).__name__


def submit_function(folder: Path, params: dict[str, object], partition: str | None, fn: Callable[..., Any],
                    *args: object, what: str) -> Any:
    """Submit `fn(*args)` with submitit's files in `folder`; a refusal by sbatch is a SlurmError naming `what`."""
    import logging

    import submitit

    logging.getLogger("submitit").setLevel(logging.ERROR)  # its sacct retries warn on sites without accounting
    executor = submitit.AutoExecutor(folder=folder, cluster="slurm")
    executor.update_parameters(**params, **({"slurm_partition": partition} if partition else {}))
    try:
        return executor.submit(fn, *args)
    except Exception as exc:  # submitit raises sbatch's failure as a bare exception; its text is the reason
        raise SlurmError(f"sbatch refused {what}: {last_line(exc)}") from None


def wait_for_job(job: Any, limit_s: float, what: str, folder: Path) -> None:
    """Wait until submitit's `job` is done, at most `limit_s`: its own wait (the result file every second, sacct now
    and then, which submitit runs with no timeout) runs in a thread, so a queue that does not move, a job that hangs
    or a sacct that hangs cannot hold the command past it. Past it: a SlurmError naming the job, that it keeps
    running, and how to follow or cancel it."""
    waiter = threading.Thread(target=job.wait, name="rlkit-job-wait", daemon=True)
    waiter.start()
    waiter.join(limit_s)
    if waiter.is_alive():
        job_id = job.job_id
        raise SlurmError(f"{what} (Slurm job {job_id}) has not finished after {limit_s / 60:g} minutes of waiting; "
                         f"it keeps running: follow it with `squeue -j {job_id}` (submitit's logs in {folder}), "
                         f"cancel it with `scancel {job_id}`")
