"""In the job: run the step the trial's job type names (imported only here, never on the login node)."""

from __future__ import annotations

import importlib
from pathlib import Path

from rlkit.config.load import load_config
from rlkit.errors import FatalStepError, StepError
from rlkit.jobs.registry import job_type_for
from rlkit.slurm.faults import fault_every_time
from rlkit.slurm.jobenv import JobEnv
from rlkit.trials.paths import TrialPaths


def run_job_step(trial_dir: Path, *, trainer: bool) -> None:
    """Call the job type's step with the trial directory and its config, loaded here once for the process.
    `trainer`: the command that started us (`rlkit train` or `rlkit client`); a script whose command does not match
    its job type's component is refused, not guessed."""
    config = load_config(TrialPaths(trial_dir).config)
    job = job_type_for(config.type)
    if job.trainer != trainer:
        raise FatalStepError(f"job type {job.name} runs `rlkit {'train' if job.trainer else 'client'}`, not this "
                             "command (the job script does not match the trial's config)")
    env = JobEnv.from_environ()
    if env.local_rank == 0:  # one line per node of the step
        print(env.slice_line(job.name), flush=True)
    if fault_every_time("die_at_start"):  # tests: a step of any job type that can never make progress (a crash loop),
        raise StepError("fault injected: die_at_start")  # before its job type's imports: ~1 CPU-s a run, not ~20
    module, _, function = job.step.partition(":")
    getattr(importlib.import_module(module), function)(trial_dir, config)
