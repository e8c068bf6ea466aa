"""Job type sft: supervised fine-tuning, a trainer-only job (allocation_mode fsdp:dN, no inference servers).

Its in-job step, rlkit.train.sft:run_sft, is not part of this installation yet: `rlkit render` shows the job, and
`rlkit submit` refuses it (ConfigError) until that module exists (rlkit.launch.submit asks JobType.step_available).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlkit.jobs.base import JobType

if TYPE_CHECKING:
    from rlkit.config.allocation import Allocation
    from rlkit.config.problems import Problems
    from rlkit.config.schema import ExperimentConfig


def _validate_sft(config: ExperimentConfig, allocation: Allocation | None, problems: Problems) -> None:
    """What launching an sft job needs; the layout (no server part, a trainer part) is checked for every job type
    in rlkit.jobs.layout. The sft section's own checks (rlkit.config.validate_sft, wave 1 merge) are called here and
    nowhere else."""
    from rlkit.config.site_files import check_model_dir

    if not config.actor.path:
        problems.add("actor.path is not set", hint="give the Hugging Face model directory to fine-tune")
    else:
        with problems.check():
            check_model_dir("actor.path", config.actor.path)


SFT = JobType(
    name="sft", help="supervised fine-tuning on prompt/completion data (trainer only, no servers)",
    needs_servers=False, trainer=True, resumable=True, step="rlkit.train.sft:run_sft",
    sections=("actor", "train_dataset", "saver", "recover"), validate=_validate_sft,
)
