"""The job script's last Slurm call (rlkit/launch/supervisor.sh): after the trainer checkpointed for the time limit
it asks `scontrol requeue`, after `rlkit stop` it asks `scancel` of its own job. When that call fails or does not
answer (a busy controller, RLKIT_SLURM_CALL_TIMEOUT) the job must not end COMPLETED with exit 0: an afterok
dependent (the next stage) would start on an unfinished model, and a trial out of time would end as if done."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from rlkit.launch.render import supervisor_body
from rlkit.step_contract import EXIT_REQUEUE, JOB_END, STATUS_REQUEUE, STATUS_STOPPED, STEP_STATE, step_state_text
from tests.helpers.slurm_stubs import path_with, slurm_bin


def run_to_the_end(tmp_path: Path, status: str, **stubs: str) -> tuple[int, str, list[str]]:
    """The supervisor with one trainer step that exits 0 having recorded `status` (the step_state it writes before
    exiting); returns the script's exit code, its output and its job_end record."""
    (tmp_path / "logs").mkdir()
    (tmp_path / STEP_STATE).write_text(step_state_text(5, status))
    body = supervisor_body(trial_dir=str(tmp_path), attempt=1, retries=2, trainer_group=0, packed=True, steps=[
        "STOP_GRACE=1", "cmd_grpo() { sleep 0.2; }",
        "component_policy 0 trainer 1 on-failure 1", "start_step grpo 0 cmd_grpo",
    ], node_checks=["node_check_0() { return 0; }", "NODE_CHECKS=(node_check_0)"])
    env = {"PATH": path_with(slurm_bin(tmp_path, **stubs)), "SLURM_JOB_ID": "7", "SLURM_RESTART_COUNT": "0",
           "RLKIT_SLURM_CALL_TIMEOUT": "1"}
    run = subprocess.run(["bash", "-c", body], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60,
                         check=False)
    end = tmp_path / JOB_END
    return run.returncode, run.stdout + run.stderr, end.read_text().splitlines() if end.exists() else []


def test_a_requeue_that_went_through_ends_the_run_without_an_end_record(tmp_path: Path) -> None:
    rc, out, end = run_to_the_end(tmp_path, STATUS_REQUEUE, scontrol='echo "scontrol $*" >> calls.txt')
    assert rc == 0, out
    assert (tmp_path / "calls.txt").read_text() == "scontrol requeue 7\n"
    assert end == [], end  # the job runs again: no end


@pytest.mark.parametrize("scontrol", ["echo 'scontrol: error: Unable to contact slurm controller' >&2; exit 1",
                                      "exec sleep 30"])
def test_a_requeue_that_failed_or_did_not_answer_is_not_a_completed_job(tmp_path: Path, scontrol: str) -> None:
    rc, out, end = run_to_the_end(tmp_path, STATUS_REQUEUE, scontrol=scontrol)
    assert rc == EXIT_REQUEUE, out
    assert "could not be requeued" in out and "rlkit resume" in out, out
    assert end[1:3] == ["FAILED", str(EXIT_REQUEUE)], end


@pytest.mark.parametrize("scancel", ["exit 1", "exec sleep 30"])
def test_a_stop_whose_scancel_failed_is_not_a_completed_job(tmp_path: Path, scancel: str) -> None:
    """`rlkit stop`'s own scancel may have failed too (the same controller): exit 0 would make Slurm record the
    stopped job COMPLETED and start its afterok dependents."""
    rc, out, end = run_to_the_end(tmp_path, STATUS_STOPPED, scancel=scancel)
    assert rc != 0, out
    assert end[1] == "CANCELLED", end
    assert "could not cancel" in out, out
