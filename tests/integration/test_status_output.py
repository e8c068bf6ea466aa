"""`rlkit status` as scripts and pipes see it: the whole table, not one cut at 80 columns."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from rlkit.trials.records import TrialRecord, record_trial
from tests.conftest import run_rlkit


@pytest.mark.slurm
def test_piped_status_table_is_not_truncated(rlkit_home: Path, tmp_path: Path) -> None:
    experiment, trial = "an-experiment-with-a-rather-long-name", "and_a_long_trial_name_as_people_write_them"
    record_trial(TrialRecord(experiment, trial, str(tmp_path / "trial"), "999999", time.time()))
    (tmp_path / "trial").mkdir()
    (tmp_path / "trial" / "progress.json").write_text(json.dumps({"step": 120, "total_steps": 400, "reward": 0.75}))
    result = run_rlkit("status", env={"COLUMNS": "80"})  # captured: not a terminal, as in `rlkit status | grep`
    assert result.returncode == 0, result.stderr
    row = next(line for line in result.stdout.splitlines() if "999999" in line)
    assert f"{experiment}/{trial}" in row and "120/400" in row and "0.750" in row, result.stdout
    assert "…" not in result.stdout


@pytest.mark.slurm
def test_a_trial_whose_job_slurm_forgot_shows_the_end_its_script_recorded(rlkit_home: Path, tmp_path: Path) -> None:
    """Job 999998 is unknown to the dev cluster's controller (as a finished job is after MinJobAge) and there is no
    accounting: `rlkit status` shows the end the job script wrote as it exited, never UNKNOWN; a record of another
    job (an earlier attempt's) or one the script does not write is not believed."""
    trial = tmp_path / "trial"
    trial.mkdir()
    record_trial(TrialRecord("exp", "forgotten", str(trial), "999998", time.time()))
    (trial / "job_end").write_text("999998\nFAILED\n78\n1764200000\n")
    table = run_rlkit("status")
    assert table.returncode == 0, table.stderr
    row = next(line for line in table.stdout.splitlines() if "999998" in line)
    assert "FAILED" in row and "UNKNOWN" not in row, table.stdout
    detail = run_rlkit("status", "exp/forgotten", "--json")
    assert detail.returncode == 0, detail.stderr
    shown = json.loads(detail.stdout)
    assert shown["row"]["state"] == "FAILED", shown
    assert "Slurm no longer knows the job" in json.dumps(shown), shown
    for planted in ("999997\nCOMPLETED\n0\n1764200000\n", "999998\nCOMPLETED; rm -rf\n0\n1\n", "999998\n"):
        (trial / "job_end").write_text(planted)
        shown = json.loads(run_rlkit("status", "exp/forgotten", "--json").stdout)
        assert shown["row"]["state"] == "UNKNOWN", (planted, shown)
