"""Fault injection for the recovery tests (RLKIT_FAULT_INJECT), and whether this trial failed before.

Never set in normal use; each point names where a test makes the trainer fail (rlkit/jobs/run.py,
rlkit/trainer/loop.py, rlkit/trainer/loop_rank0.py, rlkit/weights/base.py, rlkit/jobs/grpo/). Here, below the trainer
and the weight transports, so both can name one.
"""

from __future__ import annotations

import os

from rlkit.slurm.jobenv import JobEnv


def fault_point(name: str, version: int) -> bool:
    """Fault injection for the recovery tests: RLKIT_FAULT_INJECT=<name>@<version> fires once, in the first attempt
    and the first run of the step only (never set in normal use; `die_at_start` fires every time). Several faults of
    one trial are joined by '+' (the config's env list is comma-separated): corrupt_server_weights@3+die_mid_push@7."""
    specs = os.environ.get("RLKIT_FAULT_INJECT", "").split("+")
    return f"{name}@{version}" in specs and not failed_before()


def fault_every_time(name: str) -> bool:
    """A fault of no step that fires in every attempt and every run of the step: RLKIT_FAULT_INJECT=die_at_start
    makes a trainer that can never make progress (the crash-loop test). Joined with others by '+' as above."""
    return name in os.environ.get("RLKIT_FAULT_INJECT", "").split("+")


def failed_before() -> bool:
    """This trial failed or was interrupted before: a requeue, an in-allocation retry, or a later attempt."""
    return (JobEnv.from_environ().restart_count > 0
            or int(os.environ.get("RLKIT_STEP_RETRY", "0") or 0) > 0
            or int(os.environ.get("RLKIT_ATTEMPT", "1") or 1) > 1)
