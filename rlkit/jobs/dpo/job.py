"""Job type dpo: the actor trained on chosen/rejected pairs against a frozen reference, a trainer-only job
(allocation_mode fsdp:dN, no inference servers). Its step is rlkit.jobs.dpo.algorithm:run_dpo; its checks
rlkit.jobs.pairs.checks."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlkit.jobs.base import JobType

if TYPE_CHECKING:
    from rlkit.config.allocation import Allocation
    from rlkit.config.problems import Problems
    from rlkit.config.schema.experiment import ExperimentConfig


def _validate_dpo(config: ExperimentConfig, allocation: Allocation | None, problems: Problems) -> None:
    from rlkit.jobs.pairs.checks import validate_dpo

    validate_dpo(config, problems)


DPO = JobType(
    name="dpo", help="DPO on chosen/rejected pairs against a frozen reference (trainer only, no servers)",
    needs_servers=False, trainer=True, resumable=True, step="rlkit.jobs.dpo.algorithm:run_dpo", trinity=("dpo",),
    sections=("actor", "dpo", "train_dataset", "valid_dataset", "saver", "recover"),
    lora=True, validate=_validate_dpo, passes_on="policy", always_reference=True, own_section="dpo",
    rows="dpo",
)
