"""`rlkit stop TRIAL`: a trial of a resumable job type first checkpoints (its trainer gets USR2 and saves after the
current step), then the job is cancelled; `--now` (and every other job type) cancels at once."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from rlkit.config.load import load_config
from rlkit.jobs import job_type_for
from rlkit.launch import slurm
from rlkit.step_contract import STATUS_FINISHED, STATUS_STOPPED
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
        job = job_type_for(config.type)
        if job.resumable and config.recover.mode != "disabled":
            _checkpoint_first(record.job_id, record.name, info, paths, job.name, timeout, say)
    slurm.scancel(record.job_id)
    return record.name


def _checkpoint_first(job_id: str, name: str, info: slurm.JobInfo, paths: TrialPaths, step_name: str,
                      timeout: float, say: Callable[[str], None]) -> None:
    """USR2 to the trainer, then wait (up to `timeout` in all) for its checkpoint. A trainer that has finished its
    last step leaves a job that ends by itself: waited for, not cut short in its final writes. No trainer step
    between two (a restart, on a busy machine seconds apart): the next one is waited for and signalled, since
    cancelling then would lose every step since the last checkpoint."""
    deadline = time.monotonic() + timeout
    signalled = _signal_trainer(job_id, info, step_name)
    if not signalled and _trainer_status(paths) == STATUS_FINISHED:
        say(f"the trainer of {name} has finished its last step; waiting for the job to end by itself (up to "
            f"{timeout:.0f} s)")
        _wait(job_id, deadline, lambda: False)
        return
    if not signalled:
        say(f"no trainer step of {name} is running now (between restarts?); waiting up to {timeout:.0f} s for the "
            "next one to checkpoint it (--now cancels at once)")
        signalled = _wait(job_id, deadline, lambda: _signal_trainer(job_id, info, step_name))
        if not signalled:
            say("no trainer step started; cancelling (resume uses the last checkpoint)")
            return
    say(f"asked the trainer of {name} to checkpoint after its current step (up to {timeout:.0f} s; --now skips "
        "this)")
    _wait(job_id, deadline, lambda: _trainer_status(paths) in (STATUS_STOPPED, STATUS_FINISHED))
    status = _trainer_status(paths)
    if status == STATUS_STOPPED:
        say("the trainer checkpointed; rlkit resume continues from there")
    elif status == STATUS_FINISHED:
        say("the trainer finished its last step before it could stop; the trial is complete")
    else:
        say(f"no checkpoint within {timeout:.0f} s; cancelling anyway (resume uses the last checkpoint)")


def _wait(job_id: str, deadline: float, done: Callable[[], bool]) -> bool:
    """Poll `done` every second until it is true (True), the job has ended or the deadline passed (False)."""
    while True:
        if done():
            return True
        if time.monotonic() >= deadline or not slurm.job_info(job_id).active:
            return False
        time.sleep(1)
