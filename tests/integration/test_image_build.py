"""`rlkit image build --on-cluster` submits a real single-function Slurm job through submitit on the dev cluster;
the build itself fails there because the emulated nodes have no Apptainer, and that is what the user is told."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tests.conftest import run_rlkit
from tests.helpers.slurm_helpers import job_ids_named

pytestmark = pytest.mark.slurm


def test_on_cluster_build_runs_as_a_slurm_job_and_reports_the_nodes_missing_apptainer(tmp_path: Path) -> None:
    out = tmp_path / "rlkit-vllm.sif"
    result = run_rlkit("image", "build", "vllm", "--on-cluster", "--partition", "debug", "--time", "5", "--cpus",
                       "1", "--out", str(out), timeout=300)
    assert result.returncode == 1, result
    submitted = re.search(r"image build submitted as Slurm job (\d+)", result.stdout)
    assert submitted, result.stdout
    job_id = submitted.group(1)
    assert re.search(rf"image build job {job_id} failed: apptainer is not installed on node \S+: pick a partition",
                     result.stderr), result.stderr
    assert "Traceback" not in result.stderr and not out.exists()
    # the job really ran on a compute node: submitit's record of it names the Slurm job and its body's failure
    builds = tmp_path / ".rlkit-image-builds"
    assert (builds / f"{job_id}_submission.sh").is_file()
    assert "apptainer is not installed" in (builds / f"{job_id}_0_log.err").read_text()
    state = subprocess.run(["scontrol", "show", "job", job_id], capture_output=True, text=True, check=False).stdout
    assert "JobName=rlkit-image-vllm" in state and "Partition=debug" in state, state


def test_a_partition_that_does_not_exist_exits_2_before_submitting(tmp_path: Path) -> None:
    before = job_ids_named("rlkit-image-")
    result = run_rlkit("image", "build", "vllm", "--on-cluster", "--partition", "nosuch", "--out",
                       str(tmp_path / "v.sif"), timeout=120)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result
    assert "partition 'nosuch' does not exist" in result.stderr and "--partition one of: debug" in result.stderr
    assert job_ids_named("rlkit-image-") <= before and not (tmp_path / ".rlkit-image-builds").exists()
