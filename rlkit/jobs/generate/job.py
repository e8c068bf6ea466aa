"""Job type generate: complete a dataset's prompts on inference servers, from one GPU-less client step."""

from __future__ import annotations

from pathlib import PurePosixPath
from typing import TYPE_CHECKING

from rlkit.checks.site_files import check_dataset_file
from rlkit.jobs.base import JobType
from rlkit.trials.paths import ATTEMPT_DIR, RESERVED_NAMES

if TYPE_CHECKING:
    from rlkit.config.allocation import Allocation
    from rlkit.config.problems import Problems
    from rlkit.config.schema.experiment import ExperimentConfig


def _validate_generate(config: ExperimentConfig, allocation: Allocation | None, problems: Problems) -> None:
    dataset = config.generate.dataset.path
    if not dataset:
        problems.add("generate.dataset.path is not set", hint="give a .jsonl or .parquet file of prompts")
    else:
        with problems.check():
            check_dataset_file("generate.dataset.path", dataset)
    output = config.generate.output_file
    parts = PurePosixPath(output).parts
    if not output.strip():
        problems.add("generate.output_file is empty", hint="e.g. generate.output_file=completions.jsonl")
    elif PurePosixPath(output).is_absolute() or ".." in parts or not parts or output.endswith("/"):
        problems.add(f"generate.output_file '{output}' must name a file inside the trial directory",
                     hint="e.g. generate.output_file=completions.jsonl")
    elif parts[0] in RESERVED_NAMES or ATTEMPT_DIR.fullmatch(parts[0]):
        problems.add(f"generate.output_file '{output}' would overwrite rlkit's own '{parts[0]}' in the trial "
                     "directory", hint="e.g. generate.output_file=completions.jsonl")


GENERATE = JobType(
    name="generate", help="batch generation: complete a dataset's prompts on the servers",
    needs_servers=True, trainer=False, resumable=False, step="rlkit.jobs.generate.step:run_generate", trinity=(),
    sections=("generate", "gconfig", "rollout"), prompt_dataset="generate.dataset", validate=_validate_generate,
    own_section="generate",
)
