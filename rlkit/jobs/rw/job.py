"""Job type rw: a reward model (scalar head) trained on chosen/rejected pairs, a trainer-only job (allocation_mode
fsdp:dN, no inference servers). Its step is rlkit.jobs.rw.algorithm:run_rw; its checks rlkit.jobs.pairs.checks."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlkit.jobs.base import JobType

if TYPE_CHECKING:
    from rlkit.config.allocation import Allocation
    from rlkit.config.problems import Problems
    from rlkit.config.schema.experiment import ExperimentConfig


def _validate_rw(config: ExperimentConfig, allocation: Allocation | None, problems: Problems) -> None:
    from rlkit.jobs.pairs.checks import validate_rw

    validate_rw(config, problems)


RW = JobType(
    name="rw", help="reward model on chosen/rejected pairs (trainer only, no servers)",
    needs_servers=False, trainer=True, resumable=True, step="rlkit.jobs.rw.algorithm:run_rw", trinity=(),
    sections=("actor", "rw", "train_dataset", "valid_dataset", "saver", "recover"),
    validate=_validate_rw, passes_on="reward_model", own_section="rw", rows="rw",
    no_lora=("trains a reward model: a scalar value head on the backbone, trained with every weight, which a LoRA "
             "adapter of the causal LM would leave out (and which no adapter can carry to the next stage)"),
)
