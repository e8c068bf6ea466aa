"""`rlkit resume TRIAL [OVERRIDES]`: resubmit a stopped or failed trial as a new attempt that continues from its
last valid recover checkpoint (same resolved config unless overridden; the previous attempt's logs move to
logs/attempt-<N>/)."""

from __future__ import annotations

import shutil
import sys
from collections.abc import Iterable
from pathlib import Path

from rlkit.errors import ConfigError, ConfigErrors, UserError
from rlkit.jobs import job_type_for
from rlkit.launch import slurm
from rlkit.launch.submit import prepare, submit
from rlkit.trials.paths import TrialPaths
from rlkit.trials.records import TrialRecord, attempts, find_trial


def archive_logs(paths: TrialPaths, attempt: int) -> Path:
    """Move the files of logs/ into logs/attempt-<attempt>/ (the attempt that ran them)."""
    target = paths.logs / f"attempt-{attempt}"
    target.mkdir(parents=True, exist_ok=True)
    for item in paths.logs.iterdir() if paths.logs.is_dir() else []:
        if item.is_file():
            shutil.move(str(item), target / item.name)
    return target


def say_recorded(warnings: Iterable[ConfigError], overrides: list[str], where: str = "") -> None:
    """On stderr, what a recorded config holds and this rlkit ignores (ConfigError.recorded_ok); `where`: "stage
    NAME: " for a stage of a run. Such a knob the resume's own `overrides` give is new input: refused as at submit
    (nothing is submitted)."""
    keys = [o.split("=", 1)[0].strip() for o in overrides]
    given = [w for w in warnings if any(k == w.recorded_ok or w.recorded_ok.startswith(f"{k}.") or
                                        k.startswith(f"{w.recorded_ok}.") for k in keys)]
    if given:
        errors = [ConfigError(f"{where}{w.message}", hint=w.hint) for w in given]
        raise ConfigErrors(errors) if len(errors) > 1 else errors[0]
    for warning in warnings:
        print(f"rlkit: warning: {where}{warning} (the trial was recorded with it: it stays ignored)", file=sys.stderr)


def resume_trial(spec: str, overrides: list[str]) -> tuple[TrialRecord, int]:
    """Check, then resubmit `spec` in recover mode resume; returns the new record and its attempt number."""
    record = find_trial(spec)
    paths = TrialPaths(Path(record.trial_dir))
    if not paths.config.is_file():
        raise UserError(f"trial {record.name} has no config at {paths.config}", hint="submit it again instead")
    stand_in, reward_stand_in = _stage_stand_ins(record.trial_dir)
    info = slurm.job_info(record.job_id)
    if slurm.is_trials_active_job(info, record.experiment, record.trial, record.trial_dir):
        raise UserError(f"trial {record.name} is still {info.state} as job {record.job_id}",
                        hint=f"it resumes by itself after a failure; to restart it anyway: rlkit stop {record.name}")
    done = len(attempts(paths)) or 1
    user_mode = [o for o in overrides if o.split("=", 1)[0].strip() == "recover.mode"]
    prepared = prepare(paths.config, [*([] if user_mode else ["recover.mode=resume"]), *overrides],
                       attempt=done + 1, model_stand_in=stand_in, reward_stand_in=reward_stand_in, preflight=True)
    say_recorded(prepared.warnings, overrides)
    if not job_type_for(prepared.config.type).resumable:
        raise UserError(f"trial {record.name} is a {prepared.config.type} job, which keeps no recover checkpoints to "
                        "resume from",
                        hint="submit it again with --force")
    submitted = submit(prepared, force=True, kind="resume", before_write=lambda: archive_logs(paths, done),
                       replaces_job=record.job_id)
    return submitted.record, done + 1


def _stage_stand_ins(trial_dir: str) -> tuple[str, str]:
    """For a stage of a multi-stage run: the models its checks read (policy, reward model). A stage whose model is an
    earlier stage's final checkpoint not written yet cannot run on its own: the run must be resumed instead."""
    from rlkit.trials.stage_runs import run_of_trial

    found = run_of_trial(trial_dir)
    if found is None:
        return "", ""
    run, stage = found
    earlier = run.stages[: run.stages.index(stage)]
    if stage.stand_ins and not all(s.finished() for s in earlier):
        waiting = next(s for s in earlier if not s.finished())
        raise UserError(f"{stage.trial} is stage {stage.name} of the run {run.name}, and stage {waiting.name} has not "
                        "written the model it starts from",
                        hint=f"resume the run, which continues stage {waiting.name} first: rlkit resume {run.name}")
    return stage.model_stand_in, stage.reward_stand_in
