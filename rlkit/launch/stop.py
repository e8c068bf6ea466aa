"""`rlkit stop TRIAL`: a trial of a resumable job type first checkpoints (its trainer gets USR2 and saves after the
current step), then the job is cancelled; `--now` (and every other job type) cancels at once."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from rlkit.config.load import load_config
from rlkit.errors import SlurmError
from rlkit.jobs import job_type_for
from rlkit.launch import slurm
from rlkit.step_contract import STATUS_FINISHED, STATUS_STOPPED, STOP_ANSWER_S
from rlkit.trials.paths import TrialPaths
from rlkit.trials.records import find_trial, read_json_dict

END_WAIT_S = 60.0  # after scancel: how long a stop waits for Slurm to end the job


def _trainer_progress(paths: TrialPaths) -> tuple[str, float]:
    """The trainer's status in progress.json and when it wrote it."""
    progress = read_json_dict(paths.progress)
    updated = progress.get("updated", 0.0)
    return str(progress.get("status", "")), float(updated) if isinstance(updated, int | float) else 0.0


def _stop_ack(paths: TrialPaths) -> str:
    """What the trainer's rank 0 last wrote when a stop signal reached it ("" for nothing yet)."""
    try:
        return paths.stop_ack.read_text(errors="replace")[:200]
    except OSError:
        return ""


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


def stop_trial(spec: str, *, now: bool, timeout: float, say: Callable[[str], None]) -> str | None:
    """Stop the trial's job, with a checkpoint first unless `now` or not applicable; returns its record name, or None
    when nothing was cancelled (the job had ended, or ended by itself while the trainer finished)."""
    record = find_trial(spec)
    paths = TrialPaths(Path(record.trial_dir))
    info = slurm.job_info(record.job_id)
    if not slurm.is_trials_active_job(info, record.experiment, record.trial, record.trial_dir):
        say(f"the job of {record.name} (Slurm job {record.job_id}) has already ended; nothing to cancel")
        return None
    cancel = True
    if not now and info.state == "RUNNING" and paths.config.is_file():
        config = load_config(paths.config)
        job = job_type_for(config.type)
        if job.resumable and config.recover.mode != "disabled":
            cancel = _checkpoint_first(record.job_id, record.name, info, paths, job.name, timeout, say)
    if not cancel:
        return None
    slurm.scancel(record.job_id)
    _wait_until_gone(record.job_id, say)
    return record.name


def _wait_until_gone(job_id: str, say: Callable[[str], None]) -> None:
    """After scancel, until Slurm no longer lists the job active (COMPLETING while its steps are torn down): a
    `rlkit status` or `rlkit resume` right after the stop then sees the job ended, and a resume cannot run beside the
    old job's last processes. Bounded: a node slow to clean up is said, not waited for."""
    _wait(job_id, time.monotonic() + END_WAIT_S, lambda: False)
    if slurm.job_info(job_id).active:
        say(f"Slurm still lists job {job_id} as ending after {END_WAIT_S:.0f} s; it ends by itself (rlkit status "
            "shows when)")


def _checkpoint_first(job_id: str, name: str, info: slurm.JobInfo, paths: TrialPaths, step_name: str,
                      timeout: float, say: Callable[[str], None]) -> bool:
    """USR2 to the trainer, then wait (up to `timeout` in all) for its checkpoint; returns whether the job must
    still be cancelled. A trainer that has finished its last step (before the signal or after it) leaves a job that
    ends by itself: waited for, never cut short in its final writes. Only a status written after the signal counts:
    the one of the attempt before is still on disk until the trainer's first step."""
    deadline = time.monotonic() + timeout
    before, written = _trainer_progress(paths)
    ack_before = _stop_ack(paths)
    try:
        signalled = _signal_trainer(job_id, info, step_name)
    except SlurmError as exc:
        say(f"{exc}; cancelling without a checkpoint (resume uses the last checkpoint)")
        return True
    if not signalled and before == STATUS_FINISHED:
        return _wait_for_the_end(job_id, name, deadline, say)
    if not signalled:
        say("no trainer step is running now (between restarts?); cancelling at once (resume uses the last "
            "checkpoint)")
        return True
    say(f"asked the trainer of {name} to checkpoint after its current step (up to {timeout:.0f} s; --now skips "
        "this)")

    def answered() -> bool:
        status, updated = _trainer_progress(paths)
        return updated > written and (status in (STATUS_STOPPED, STATUS_FINISHED) or status.startswith("failed"))

    heard = _wait(job_id, min(deadline, time.monotonic() + STOP_ANSWER_S),
                  lambda: _stop_ack(paths) != ack_before or answered())
    if not heard and slurm.job_info(job_id).active:
        say(f"the trainer did not answer the signal within {STOP_ANSWER_S:.0f} s (a rank hung, stopped, or waiting in "
            "a collective for one that is); cancelling without a new checkpoint (resume uses the last one)")
        return True
    _wait(job_id, deadline, answered)
    status = _trainer_progress(paths)[0] if answered() else ""
    if status == STATUS_STOPPED:
        say("the trainer checkpointed; rlkit resume continues from there")
        return True
    if status == STATUS_FINISHED:
        say("the trainer finished its last step before it could stop")
        return _wait_for_the_end(job_id, name, deadline, say)
    if status.startswith("failed"):
        say(f"the trainer {status} before it could checkpoint; cancelling (resume uses the last checkpoint)")
        return True
    say(f"no checkpoint within {timeout:.0f} s; cancelling anyway (resume uses the last checkpoint)")
    return True


def _wait_for_the_end(job_id: str, name: str, deadline: float, say: Callable[[str], None]) -> bool:
    """The trainer has trained its last step: its job ends by itself (final model, loggers); wait for that, and cancel
    only past the deadline."""
    say(f"the trainer of {name} has finished its last step; waiting for the job to end by itself")
    _wait(job_id, deadline, lambda: False)
    if not slurm.job_info(job_id).active:
        say("the job ended by itself; the trial is complete")
        return False
    say("the job did not end before the deadline; cancelling it")
    return True


def _wait(job_id: str, deadline: float, done: Callable[[], bool]) -> bool:
    """Poll `done` every second until it is true (True), the job has ended or the deadline passed (False)."""
    while True:
        if done():
            return True
        if time.monotonic() >= deadline or not slurm.job_info(job_id).active:
            return False
        time.sleep(1)
