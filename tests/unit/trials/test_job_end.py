"""The job script's end record (rlkit.step_contract.JOB_END) as rlkit status reads it once Slurm forgot the job."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from rlkit.launch import slurm
from rlkit.trials.paths import TrialPaths
from rlkit.trials.records import JobEnd, read_job_end


@pytest.mark.parametrize(("text", "expected"), [
    ("42\nCOMPLETED\n0\n1764200000\n", JobEnd("COMPLETED", 0, 1764200000.0)),
    ("42\nTIMEOUT\n143\n1764200000.5\n", JobEnd("TIMEOUT", 143, 1764200000.5)),
    ("41\nCOMPLETED\n0\n1764200000\n", None),  # an earlier attempt's job
    ("42\nRUNNING\n0\n1764200000\n", None),  # not a state the script writes
    ("42\nCOMPLETED\nzero\n1764200000\n", None),
    ("42\nCOMPLETED\n", None),
    ("", None),
])
def test_only_this_jobs_well_formed_record_is_read(tmp_path: Path, text: str, expected: JobEnd | None) -> None:
    (tmp_path / "job_end").write_text(text)
    assert read_job_end(TrialPaths(tmp_path), "42") == expected


def test_no_record_is_none(tmp_path: Path) -> None:
    assert read_job_end(TrialPaths(tmp_path), "42") is None


def test_job_info_falls_back_to_the_record_only_when_slurm_has_forgotten(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "job_end").write_text("42\nCANCELLED\n143\n1764200000\n")
    forgotten = subprocess.CompletedProcess([], 1, "", "slurm_load_jobs error: Invalid job id specified")
    monkeypatch.setattr(slurm, "_run", lambda argv: forgotten)
    monkeypatch.setattr(slurm.shutil, "which", lambda name: None)  # no accounting
    info = slurm.job_info("42", tmp_path)
    assert (info.state, info.exit_code) == ("CANCELLED", "143:0")
    assert "Slurm no longer knows the job" in info.reason
    assert slurm.job_info("42").state == "UNKNOWN"  # no trial directory given
    known = subprocess.CompletedProcess([], 0, "JobId=42 JobState=RUNNING RunTime=00:01:00 NodeList=node1\n", "")
    monkeypatch.setattr(slurm, "_run", lambda argv: known)
    assert slurm.job_info("42", tmp_path).state == "RUNNING"  # the controller's word comes first
