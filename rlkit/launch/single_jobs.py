"""Single-function Slurm jobs from the login node (image builds, `rlkit doctor`), submitted with submitit: what
submitit is for (the RL job itself is heterogeneous, which submitit cannot express)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from rlkit.errors import SlurmError


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
