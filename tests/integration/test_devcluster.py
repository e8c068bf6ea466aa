"""Integration tests for the emulated Slurm dev cluster (slurm/devcluster.sh).

The test session is expected to have run ``slurm/devcluster.sh up`` beforehand. A cluster that is down is a failure,
not a skip: these tests exist to prove the cluster works.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slurm

REPO = Path(__file__).resolve().parents[2]
DEVCLUSTER = REPO / "slurm" / "devcluster.sh"
NODES = {"node1", "node2", "node3", "node4"}
JOB_TIMEOUT = 120.0  # seconds for the whole hetjob (it needs ~2 s on an idle cluster)
TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "BOOT_FAIL"}


def run(*cmd: str, timeout: float = 30.0, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    if check and proc.returncode != 0:
        pytest.fail(f"{' '.join(cmd)} exited {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}")
    return proc


@pytest.fixture(scope="module", autouse=True)
def cluster_up() -> None:
    if shutil.which("sinfo") is None or shutil.which("sbatch") is None:
        pytest.fail("Slurm client commands are missing: run `sudo slurm/devcluster.sh up` first")
    proc = run(str(DEVCLUSTER), "status", check=False)
    if proc.returncode != 0:
        pytest.fail(
            f"the dev cluster is not up (devcluster.sh status exited {proc.returncode}); "
            f"run `sudo slurm/devcluster.sh up`\n{proc.stdout}{proc.stderr}"
        )


def test_sinfo_lists_four_nodes_with_eight_gpus() -> None:
    out = run("sinfo", "-h", "-N", "-o", "%N %G %c %m").stdout
    rows = {}
    for line in out.splitlines():
        node, gres, cpus, mem = line.split()
        rows[node] = (gres, int(cpus), int(mem))
    assert set(rows) == NODES, out
    for node, (gres, cpus, mem) in rows.items():
        # %G is "gpu:8", or "gpu:8(S:0-1)" where sockets are known.
        assert re.fullmatch(r"gpu:8(\(.*\))?", gres), f"{node}: {gres}"
        assert cpus == 64 and mem == 512000, f"{node}: cpus={cpus} mem={mem}"


def _job_states(job_id: str) -> dict[str, str]:
    """{'12+0': 'RUNNING', '12+1': 'RUNNING'}; -t all keeps finished jobs (MinJobAge) in the listing."""
    out = run("squeue", "-h", "-t", "all", "-j", job_id, "-o", "%i %T").stdout
    return dict(line.split() for line in out.splitlines() if line.strip())


def _wait_finished(job_id: str, timeout: float) -> dict[str, str]:
    deadline = time.monotonic() + timeout
    delay = 0.2
    states: dict[str, str] = {}
    while time.monotonic() < deadline:
        states = _job_states(job_id)
        if states and all(s in TERMINAL for s in states.values()):
            return states
        time.sleep(delay)
        delay = min(delay * 1.5, 2.0)
    pytest.fail(f"job {job_id} not finished after {timeout:.0f} s: {states}")


HETJOB = """\
#!/bin/bash
#SBATCH --job-name=rlkit-devcluster-test
#SBATCH --output={out}/batch-%j.out
#SBATCH --nodes=1 --ntasks=1 --cpus-per-task=1 --mem=500M --gres=gpu:2
#SBATCH hetjob
#SBATCH --nodes=1 --ntasks=1 --cpus-per-task=1 --mem=500M --gres=gpu:1
set -u
report='echo "$SLURMD_NODENAME|${{CUDA_VISIBLE_DEVICES-unset}}|$SLURM_STEP_ID"'
srun --het-group=0 --nodes=1 --ntasks=1 --cpus-per-task=1 --mem=200M --gres=gpu:2 --exact \\
     --output={out}/step-g0.out bash -c "$report" &
srun --het-group=1 --nodes=1 --ntasks=1 --cpus-per-task=1 --mem=200M --gres=gpu:1 --exact \\
     --output={out}/step-g1.out bash -c "$report" &
wait
echo "G0=$SLURM_JOB_NODELIST_HET_GROUP_0" > {out}/groups.txt
echo "G1=$SLURM_JOB_NODELIST_HET_GROUP_1" >> {out}/groups.txt
"""


def test_hetjob_two_components_run_steps_with_own_gpus(tmp_path: Path) -> None:
    tmp_path.chmod(0o755)
    script = tmp_path / "hetjob.sh"
    script.write_text(HETJOB.format(out=tmp_path))
    job_id = run("sbatch", "--parsable", str(script)).stdout.strip().split(";")[0]
    assert job_id.isdigit(), job_id
    finished = False
    try:
        states = _wait_finished(job_id, JOB_TIMEOUT)
        finished = True
        assert states == {f"{job_id}+0": "COMPLETED", f"{job_id}+1": "COMPLETED"}, states
        show = run("scontrol", "show", "job", job_id).stdout
        assert show.count("JobState=COMPLETED") == 2, show
        assert show.count("ExitCode=0:0") == 2, show
    finally:
        if not finished:
            run("scancel", job_id, check=False)

    steps = {}
    for group in (0, 1):
        text = (tmp_path / f"step-g{group}.out").read_text().strip()
        node, cvd, step_id = text.split("|")
        steps[group] = (node, cvd, step_id)
    groups = dict(line.split("=", 1) for line in (tmp_path / "groups.txt").read_text().split())

    # Each step runs on its own component's node and sees exactly the GPUs its step asked for.
    assert steps[0][0] == groups["G0"] and steps[1][0] == groups["G1"], (steps, groups)
    assert steps[0][0] in NODES and steps[1][0] in NODES
    assert len(steps[0][1].split(",")) == 2, steps
    assert len(steps[1][1].split(",")) == 1, steps
    assert all(re.fullmatch(r"\d+(,\d+)*", cvd) for _, cvd, _ in steps.values()), steps
    # Step ids are unique across the whole heterogeneous job.
    assert steps[0][2] != steps[1][2], steps
