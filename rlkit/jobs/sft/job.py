"""Job type sft: supervised fine-tuning, a trainer-only job (allocation_mode fsdp:dN, no inference servers).

Its in-job step is rlkit.jobs.sft.algorithm:run_sft (the training loop with the sft algorithm); the sft section's own
checks live in rlkit.jobs.sft.checks.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlkit.jobs.base import JobType

if TYPE_CHECKING:
    from rlkit.config.allocation import Allocation
    from rlkit.config.problems import Problems
    from rlkit.config.schema.experiment import ExperimentConfig


def _validate_sft(config: ExperimentConfig, allocation: Allocation | None, problems: Problems) -> None:
    """The layout (no server part, a trainer part) is checked for every job type in rlkit.checks.layout."""
    from rlkit.jobs.sft.checks import validate_sft

    validate_sft(config, problems)


SFT = JobType(
    name="sft", help="supervised fine-tuning on prompt/completion data (trainer only, no servers)",
    needs_servers=False, trainer=True, resumable=True, step="rlkit.jobs.sft.algorithm:run_sft", trinity=("sft",),
    sequence_parallel=True,
    sections=("actor", "sft", "train_dataset", "valid_dataset", "saver", "recover"),
    lora=True, validate=_validate_sft, passes_on="policy", own_section="sft", rows="sft",
)
