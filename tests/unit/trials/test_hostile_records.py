"""Files others can write, read as untrusted: the per-user trial index, the stage-run records, progress.json and
`rlkit logs --step`; and `rlkit stop` cancels only a job Slurm still runs as the trial's (job ids are reused)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from rlkit.cli.status import _log_path, _row
from rlkit.errors import UserError
from rlkit.launch import slurm
from rlkit.launch.stop import stop_trial
from rlkit.trials.paths import TrialPaths
from rlkit.trials.records import TrialRecord, list_trials
from rlkit.trials.stage_runs import find_run

GOOD = {"experiment": "exp", "trial": "good", "trial_dir": "/tmp/x", "job_id": "12", "submitted_at": 100.0}


def write_record(home: Path, trial: str, **fields: object) -> Path:
    path = home / "trials" / "exp" / f"{trial}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**GOOD, "trial": trial, **fields}))
    return path


@pytest.mark.parametrize("fields", [
    {"submitted_at": "x"}, {"submitted_at": 1e300}, {"submitted_at": True}, {"job_id": ["1"]}, {"job_id": "-1"},
    {"job_id": "1 2"}, {"trial_dir": 5}, {"trial_dir": ""}, {"extra": 1},
], ids=str)
def test_a_record_of_the_wrong_types_is_skipped_with_a_warning(
        rlkit_home: Path, capsys: pytest.CaptureFixture[str], fields: dict[str, object]) -> None:
    write_record(rlkit_home, "good")
    bad = write_record(rlkit_home, "bad", **fields)
    assert [r.trial for r in list_trials()] == ["good"]
    warnings = capsys.readouterr().err.splitlines()
    assert len(warnings) == 1 and str(bad) in warnings[0], warnings


def test_a_fifo_in_the_index_or_as_progress_is_skipped_not_read(
        rlkit_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A FIFO blocked `rlkit status` for good."""
    write_record(rlkit_home, "good", trial_dir=str(tmp_path))
    os.mkfifo(rlkit_home / "trials" / "exp" / "fifo.json")
    os.mkfifo(tmp_path / "progress.json")
    assert [r.trial for r in list_trials()] == ["good"]
    assert "fifo.json: not a regular file" in capsys.readouterr().err
    assert _row(list_trials()[0], slurm.JobInfo("12", "RUNNING")).step == ""


def test_slurm_job_ids_of_every_shape_are_kept(rlkit_home: Path) -> None:
    for trial, job_id in (("plain", "7"), ("task", "7_3"), ("het", "7+1")):
        write_record(rlkit_home, trial, job_id=job_id, submitted_at=1)
    assert sorted(r.job_id for r in list_trials()) == ["7", "7+1", "7_3"]


def test_a_stage_record_whose_trial_dir_is_not_a_string_is_skipped(
        rlkit_home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = rlkit_home / "staged" / "exp" / "run.json"
    path.parent.mkdir(parents=True)
    stage = {"name": "sft", "type": "sft", "trial": "run_sft", "trial_dir": 5}
    path.write_text(json.dumps({"experiment": "exp", "trial": "run", "stages": [stage], "submitted_at": 1.0}))
    assert find_run("exp/run") is None
    assert str(path) in capsys.readouterr().err


@pytest.mark.parametrize("progress, shown", [({"step": 3}, "3/?"), ({"step": "x", "total_steps": [1]}, "?/?"),
                                             ({"step": 3, "total_steps": 8}, "3/8")])
def test_progress_fields_missing_or_of_the_wrong_type_are_unknown(
        tmp_path: Path, progress: dict[str, object], shown: str) -> None:
    TrialPaths(tmp_path).progress.write_text(json.dumps(progress))
    record = TrialRecord("exp", "t", str(tmp_path), "1", 100.0)
    assert _row(record, slurm.JobInfo("1", "RUNNING")).step == shown


@pytest.mark.parametrize("step", ["x" * 5000, "../../secret", "nosuch"])
def test_a_step_without_a_log_is_a_clear_error(tmp_path: Path, step: str) -> None:
    paths = TrialPaths(tmp_path / "trial")
    paths.logs.mkdir(parents=True)
    (paths.logs / "trainer.log").write_text("hi\n")
    (tmp_path / "secret.log").write_text("not the trial's\n")
    record = TrialRecord("exp", "t", str(paths.root), "1", 100.0)
    with pytest.raises(UserError, match="has no log for step"):
        _log_path(paths, record, step)
    assert _log_path(paths, record, "trainer") == paths.logs / "trainer.log"


def _stop_with(rlkit_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
               info: slurm.JobInfo) -> tuple[str | None, list[str], list[str]]:
    """`rlkit stop --now` of trial exp/t (job 41) while Slurm reports `info` for job 41 until it is cancelled."""
    trial_dir = tmp_path / "trial"
    write_record(rlkit_home, "t", job_id="41", trial_dir=str(trial_dir))
    calls = tmp_path / "calls.txt"
    (tmp_path / "bin").mkdir()
    scancel = tmp_path / "bin" / "scancel"
    scancel.write_text(f'#!/bin/sh\necho "scancel $*" >> {calls}\n')
    scancel.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(slurm, "job_info", lambda job_id, trial_dir=None: (
        slurm.JobInfo(job_id, "CANCELLED") if calls.exists() else info))
    said: list[str] = []
    name = stop_trial("exp/t", now=True, timeout=1, say=said.append)
    return name, said, calls.read_text().splitlines() if calls.exists() else []


@pytest.mark.parametrize("state, name, log", [
    ("UNKNOWN", "", ""),  # Slurm no longer knows the job
    ("COMPLETED", "exp_t", "{trial}/logs/slurm-41.out"),
    ("RUNNING", "other_job", "/home/u/slurm-41.out"),  # the id reused by a later job of the user
    ("RUNNING", "exp_t", "/elsewhere/logs/slurm-41.out"),
])
def test_stop_cancels_nothing_once_the_trial_s_job_has_ended(
        rlkit_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, state: str, name: str, log: str) -> None:
    info = slurm.JobInfo("41", state, name=name, stdout=log.format(trial=tmp_path / "trial"))
    cancelled, said, scancels = _stop_with(rlkit_home, tmp_path, monkeypatch, info)
    assert cancelled is None and scancels == []
    assert said == ["the job of exp/t (Slurm job 41) has already ended; nothing to cancel"]


@pytest.mark.parametrize("name, log", [
    ("exp_t", "{trial}/logs/slurm-41.out"),
    ("", ""),  # sacct answering for a busy controller gives no batch log (older sacct no name): counted as the trial's
    ("exp_t", ""),
])
def test_stop_cancels_the_trial_s_running_job(rlkit_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                              name: str, log: str) -> None:
    info = slurm.JobInfo("41", "PENDING", name=name, stdout=log.format(trial=tmp_path / "trial"))
    cancelled, _, scancels = _stop_with(rlkit_home, tmp_path, monkeypatch, info)
    assert cancelled == "exp/t" and scancels == ["scancel 41"]


def test_submit_force_is_refused_only_while_slurm_runs_the_trial_s_own_job(
        generate_yaml: Path, rlkit_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The recorded id taken by a later, unrelated job no longer holds the trial (its stop says the job ended)."""
    from rlkit.config.load import load_config
    from rlkit.launch.submit import _refuse_over_existing

    config = load_config(generate_yaml)
    paths = TrialPaths.of(config.cluster.fileroot, config.experiment_name, config.trial_name)
    paths.root.mkdir(parents=True)
    paths.config.write_text("")
    write_record(rlkit_home, "t1", experiment="test-exp", job_id="41", trial_dir=str(paths.root))
    own = slurm.JobInfo("41", "RUNNING", name="test-exp_t1", stdout=f"{paths.logs}/slurm-41.out")
    monkeypatch.setattr(slurm, "job_info", lambda job_id, trial_dir=None: own)
    with pytest.raises(UserError, match="still has job 41 in Slurm"):
        _refuse_over_existing(config, paths, force=True, kind="submit")
    unnamed = slurm.JobInfo("41", "RUNNING")  # Slurm said neither name nor log: it may be the trial's, refused
    monkeypatch.setattr(slurm, "job_info", lambda job_id, trial_dir=None: unnamed)
    with pytest.raises(UserError, match="still has job 41 in Slurm"):
        _refuse_over_existing(config, paths, force=True, kind="submit")
    monkeypatch.setattr(slurm, "job_info", lambda job_id, trial_dir=None: slurm.JobInfo(
        "41", "RUNNING", name="someone_else", stdout="/home/u/slurm-41.out"))
    _refuse_over_existing(config, paths, force=True, kind="submit")
