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
