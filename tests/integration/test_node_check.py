"""Step 0 of every job, on the dev cluster (rlkit.steps.node_check on every node, one srun per component): each node
reads a token the batch script has just written in the trial directory, counts its GPUs, and reaches the work
component's first node over TCP. The dev cluster's node4 runs its slurmd in a mount namespace of its own where
<devcluster state>/not-on-node4 is an empty tmpfs (slurm/devcluster.sh): a fileroot there is one node4 cannot see,
exactly as a node-local or login-node-only fileroot on a real site. The check runs the steps' python: the fixtures'
/opt/py/bin/python does not exist, so the jobs that must pass it use this interpreter."""

from __future__ import annotations

import shutil
import sys
import time
import uuid
from pathlib import Path

import pytest

from rlkit import __version__
from rlkit.source_id import PACKAGE, source_id
from tests.conftest import run_rlkit
from tests.helpers.slurm_helpers import wait_for, wait_state

pytestmark = pytest.mark.slurm

NOT_ON_NODE4 = Path("/var/lib/rlkit-devcluster/not-on-node4")
THIS_PYTHON = f"launcher.python={sys.executable}"


def _batch_log(trial: Path) -> str:
    return "".join(p.read_text() for p in (trial / "logs").glob("slurm-*.out"))


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
                          "launcher.slurm.nodelist=node[2-4]", THIS_PYTHON)  # servers on node2-3, the client on node4
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
                          "launcher.slurm.nodelist=node[1-3]", THIS_PYTHON)
    assert submitted.returncode == 0, submitted.stderr
    seen = hidden_root / "test-exp" / "seen"
    wait_for(lambda: "started step generate" in _batch_log(seen), "the steps to start", timeout=120)
    assert run_rlkit("stop", "test-exp/seen", "--now").returncode == 0  # the fixture's model is no model anyway
    wait_state("test-exp/seen", timeout=120)
    batch = _batch_log(seen)
    assert "rlkit: node check passed: every node sees the trial directory" in batch, batch
    assert "rlkit: started step server-0" in batch, batch
    assert not list(seen.glob(".node-check.*")), "the token is removed after the check"


def _check_log(trial: Path) -> str:
    return (trial / "logs" / "node-check.log").read_text()


def test_too_few_gpus_and_an_unreachable_trainer_are_each_reported_by_every_node(grpo_yaml: Path, tmp_path: Path,
                                                                                  rlkit_home: Path) -> None:
    """Three real faults in one job, each of which would break the steps too: an extra `--gres=gpu:1` in the srun
    arguments (every step then gets one GPU of the two its component asked for), a trainer that advertises an
    address nobody reaches (RLKIT_ADVERTISE_HOST, what its rank 0 publishes for the rendezvous, set to TEST-NET-1),
    and steps whose python imports another rlkit than the one that submitted (a copy with one more line, as an
    image built from an older checkout). Each node names each of its own problems; the job fails in step 0, no work
    step starts."""
    other = tmp_path / "other-rlkit"
    shutil.copytree(PACKAGE, other / "rlkit", ignore=shutil.ignore_patterns("__pycache__"))
    with (other / "rlkit" / "errors.py").open("a") as f:
        f.write("# built from another checkout\n")
    python = tmp_path / "python-with-other-rlkit"
    python.write_text(f"#!/bin/sh\nPYTHONPATH={other} exec {sys.executable} \"$@\"\n")
    python.chmod(0o755)
    started = time.monotonic()
    submitted = run_rlkit("submit", str(grpo_yaml), "trial_name=faults", "allocation_mode=vllm:d2+fsdp:d4",
                          "cluster.n_gpus_per_node=2", "cluster.n_nodes=3", "launcher.slurm.nodelist=node[1-3]",
                          "launcher.slurm.srun_additional_args=--gres=gpu:1",
                          "launcher.trainer_env_vars=RLKIT_ADVERTISE_HOST=192.0.2.1", f"launcher.python={python}")
    assert submitted.returncode == 0, submitted.stderr
    assert wait_state("test-exp/faults", timeout=120) == "FAILED"
    assert time.monotonic() - started < 60, "the check fails within seconds, not after a rendezvous timeout"
    trial = tmp_path / "fileroot" / "test-exp" / "faults"
    log = _check_log(trial)
    for node, role in (("node1", "server"), ("node2", "trainer"), ("node3", "trainer")):
        assert f"rlkit: node {node} sees 1 GPU(s) (no nvidia-smi, CUDA_VISIBLE_DEVICES=" in log, log
        assert f"but its {role} component asked for 2: check the partition's GPUs" in log, log
    for node in ("node1", "node3"):  # the servers' node and the trainer's second node; node2 is the one listening
        assert f"rlkit: node {node} cannot reach the trainer's node node2 at 192.0.2.1:" in log, log
    assert "node node2 cannot reach" not in log
    assert "open the ports between the job's nodes" in log
    ours, theirs = source_id(), source_id(other / "rlkit")
    for node, role in (("node1", "server"), ("node2", "trainer"), ("node3", "trainer")):
        assert f"rlkit: node {node} ({role}) runs rlkit {__version__} (source {theirs}, {other / 'rlkit'}), not the " \
               f"rlkit that validated this job at submit (source {ours}): its steps would read the config with " \
               "other code; install the submitting rlkit where launcher.python points" in log, log
    assert not any(trial.glob("logs/server-*.log")) and not (trial / "logs" / "grpo.log").exists()
    assert not list(trial.glob(".node-check.*")), "the token and the address file are removed after the check"
    status = run_rlkit("status", "test-exp/faults")
    assert "step node-check failed" in status.stdout, status.stdout


def test_a_python_the_nodes_do_not_have_fails_step_0_naming_each_node(generate_yaml: Path, tmp_path: Path,
                                                                      rlkit_home: Path) -> None:
    """The check runs the steps' own python (launcher.python): one the nodes lack stops the job in step 0, each
    node saying so, instead of every step failing (and being retried) later."""
    submitted = run_rlkit("submit", str(generate_yaml), "trial_name=nopython", "launcher.slurm.nodelist=node[1-3]")
    assert submitted.returncode == 0, submitted.stderr
    assert wait_state("test-exp/nopython", timeout=120) == "FAILED"
    trial = tmp_path / "fileroot" / "test-exp" / "nopython"
    log = _check_log(trial)
    for node in ("node1", "node2", "node3"):
        assert f"slurmstepd-{node}: error: execve(): /opt/py/bin/python: No such file or directory" in log, log
    assert not any(trial.glob("logs/server-*.log")) and not (trial / "logs" / "generate.log").exists()
