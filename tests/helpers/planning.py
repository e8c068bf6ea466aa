"""Planning a loaded config in tests the way submit does: allocation_mode parsed once, then handed to the planner."""

from __future__ import annotations

from rlkit.config.allocation import parse_allocation
from rlkit.config.schema.experiment import ExperimentConfig
from rlkit.launch.plan import JobPlan, plan_job


def plan_of(config: ExperimentConfig) -> JobPlan:
    return plan_job(config, parse_allocation(config.allocation_mode))
