"""Step 0 of every job, on the dev cluster: each node of each component reads a token the batch script has just
written in the trial directory. The dev cluster's node4 runs its slurmd in a mount namespace of its own where
<devcluster state>/not-on-node4 is an empty tmpfs (slurm/devcluster.sh): a fileroot there is one node4 cannot see,
exactly as a node-local or login-node-only fileroot on a real site."""

from __future__ import annotations

import shutil
import time
import uuid
from pathlib import Path

import pytest

from ..conftest import run_rlkit
from ..slurm_helpers import wait_state

pytestmark = pytest.mark.slurm

NOT_ON_NODE4 = Path("/var/lib/rlkit-devcluster/not-on-node4")


@pytest.fixture
def hidden_root() -> Path:
    if not NOT_ON_NODE4.is_dir():
        pytest.fail(f"{NOT_ON_NODE4} is missing: start the dev cluster with slurm/devcluster.sh up")
    root = NOT_ON_NODE4 / f"fileroot-{uuid.uuid4().hex[:8]}"
    yield root
    shutil.rmtree(root, ignore_errors=True)


def test_a_fileroot_one_node_cannot_see_fails_in_step_0_naming_that_node(generate_yaml: Path, hidden_root: Path,
                                                                          rlkit_home: Path) -> None:
    started = time.monotonic()
    submitted = run_rlkit("submit", str(generate_yaml), f"cluster.fileroot={hidden_root}", "trial_name=hidden",
                          "launcher.slurm.nodelist=node[2-4]")  # servers on node2-3, the client on node4
    assert submitted.returncode == 0, submitted.stderr
    assert wait_state("test-exp/hidden", timeout=120) == "FAILED"
    assert time.monotonic() - started < 60, "the node check fails within seconds, not after a startup timeout"
    trial = hidden_root / "test-exp" / "hidden"
    check_log = (trial / "logs" / "node-check.log").read_text()
    assert f"rlkit: node node4 does not see the trial directory {trial} that node node2 wrote in: cluster.fileroot " \
           "must be on a filesystem every compute node mounts at the same path" in check_log, check_log
    assert "node node2 does not see" not in check_log and "node node3 does not see" not in check_log
    assert not any(trial.glob("logs/server-*.log")) and not (trial / "logs" / "generate.log").exists(), \
        "no work step started"
    status = run_rlkit("status", "test-exp/hidden")
    assert "step node-check failed" in status.stdout and "node node4 does not see" in status.stdout, status.stdout

    # the same trial directory on nodes that all see it: the check passes and the steps start
    submitted = run_rlkit("submit", str(generate_yaml), f"cluster.fileroot={hidden_root}", "trial_name=seen",
                          "launcher.slurm.nodelist=node[1-3]")
    assert submitted.returncode == 0, submitted.stderr
    wait_state("test-exp/seen", timeout=120)  # the steps then fail: the fixture's python does not exist
    seen = hidden_root / "test-exp" / "seen"
    batch = "".join(p.read_text() for p in (seen / "logs").glob("slurm-*.out"))
    assert "rlkit: node check passed: every node sees the trial directory" in batch, batch
    assert "rlkit: started step server-0" in batch, batch
    assert not list(seen.glob(".node-check.*")), "the token is removed after the check"
