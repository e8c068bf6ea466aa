"""Whether allocation_mode gives a job type the components it has: servers exactly when it needs them, a trainer
part exactly when its work step is a trainer. Checked once, at validation, with every problem reported."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlkit.config.allocation import Allocation
from rlkit.config.problems import Problems

if TYPE_CHECKING:
    from rlkit.jobs.base import JobType


def check_layout(job: JobType, allocation: Allocation, mode: str, problems: Problems) -> bool:
    """Add a problem for each missing or surplus component; True when the layout fits the job type."""
    found = len(problems.errors)
    if job.needs_servers and allocation.server is None:
        problems.add(f"allocation_mode '{mode}': job type {job.name} needs inference servers",
                     hint="start it with vllm:dN or sglang:dN, e.g. vllm:d2")
    if not job.needs_servers and allocation.server is not None:
        problems.add(f"allocation_mode '{mode}': job type {job.name} runs no inference servers",
                     hint=f"drop the '{allocation.server.backend}:...' part, e.g. allocation_mode=fsdp:d2")
    if not job.trainer and allocation.trainer is not None:
        problems.add(f"allocation_mode '{mode}': job type {job.name} has no trainer", hint="drop the '+fsdp:...' part")
    if job.trainer and allocation.trainer is None:
        example = "vllm:d4t2+fsdp:d8" if job.needs_servers else "fsdp:d2"
        problems.add(f"allocation_mode '{mode}': job type {job.name} needs trainer GPUs",
                     hint=f"add a trainer part, e.g. {example}")
    return len(problems.errors) == found
