"""`rlkit stop TRIAL`: a trial of a resumable job type first checkpoints (its trainer gets USR2 and saves after the
current step), then the job is cancelled; `--now` (and every other job type) cancels at once."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from rlkit.config.load import load_config
from rlkit.jobs import job_type_for
from rlkit.launch import slurm
from rlkit.step_contract import STATUS_STOPPED
from rlkit.trials.paths import TrialPaths
from rlkit.trials.records import find_trial, read_json_dict


def _trainer_status(paths: TrialPaths) -> str:
    return str(read_json_dict(paths.progress).get("status", ""))


def _signal_trainer(job_id: str, info: slurm.JobInfo, step_name: str) -> bool:
    """USR2 to the trainer's steps only: its het component, or in a job of one allocation (packed, or trainer
    only) its step by name, since a signal to the whole job would reach the servers' steps too. False: no trainer
    step runs now (between restarts), so nobody will checkpoint."""
    if len(info.component_job_ids) > 1:
        slurm.signal_steps(info.component_job_ids[-1], "USR2")
        return True
    step_ids = slurm.step_ids(job_id, step_name)
    for step_id in step_ids:
        slurm.signal_steps(step_id, "USR2")
    return bool(step_ids)


def stop_trial(spec: str, *, now: bool, timeout: float, say: Callable[[str], None]) -> str:
    """Stop the trial's job; returns its record name. With a checkpoint first unless `now` or not applicable."""
    record = find_trial(spec)
    paths = TrialPaths(Path(record.trial_dir))
    info = slurm.job_info(record.job_id)
    if not now and info.state == "RUNNING" and paths.config.is_file():
        config = load_config(paths.config)
        if not job_type_for(config.type).resumable or config.recover.mode == "disabled":
            pass
        elif not _signal_trainer(record.job_id, info, job_type_for(config.type).name):
            say("no trainer step is running now (between restarts?); cancelling at once (resume uses the last "
                "checkpoint)")
        else:
            say(f"asked the trainer of {record.name} to checkpoint after its current step (up to {timeout:.0f} s; "
                "--now skips this)")
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline and _trainer_status(paths) != STATUS_STOPPED:
                if not slurm.job_info(record.job_id).active:
                    break
                time.sleep(1)
            if _trainer_status(paths) == STATUS_STOPPED:
                say("the trainer checkpointed; rlkit resume continues from there")
            else:
                say(f"no checkpoint within {timeout:.0f} s; cancelling anyway (resume uses the last checkpoint)")
    slurm.scancel(record.job_id)
    return record.name
