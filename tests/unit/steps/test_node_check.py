"""rlkit.steps.node_check (step 0 of every job) without Slurm: GPU counting, the canary, the TCP hello between a
node and the work component's first node, each report's words, and the per-component sruns the script renders. The
real job runs it on the dev cluster (tests/integration/test_node_check.py)."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from rlkit.config.load import load_config
from rlkit.launch.render import node_check_command, step_command, supervisor_body
from rlkit.source_id import describe, source_id
from rlkit.step_contract import NO_RETRY_EXIT, NODE_CHECK_ADDRESS_MARK
from rlkit.steps.node_check import (
    NETWORK_FIX,
    GpuView,
    canary_problem,
    gpu_problem,
    listen_and_publish,
    reach_problem,
    read_published,
    serve_peers,
    source_problem,
    visible_gpus,
)
from tests.conftest import CONFIGS
from tests.helpers.planning import plan_of

SMI = """GPU 0: NVIDIA A100-SXM4-80GB (UUID: GPU-1111aaaa-0000-0000-0000-000000000000)
GPU 1: NVIDIA A100-SXM4-80GB (UUID: GPU-2222bbbb-0000-0000-0000-000000000000)
  MIG 1g.10gb     Device  0: (UUID: MIG-3333cccc-0000-0000-0000-000000000000)
GPU 2: NVIDIA A100-SXM4-80GB (UUID: GPU-4444dddd-0000-0000-0000-000000000000)
GPU 3: NVIDIA A100-SXM4-80GB (UUID: GPU-5555eeee-0000-0000-0000-000000000000)
"""


@pytest.mark.parametrize(
    ("cuda_visible", "listing", "count"),
    [
        ("0,1", None, 2),  # what Slurm sets for --gres=gpu:2, no nvidia-smi (the dev cluster)
        (None, None, 0),  # no driver tool and nothing from Slurm: nothing to run on
        ("", None, 0),
        ("0,1,bogus,3", None, 2),  # CUDA stops at the first entry that names no device
        (None, SMI, 4),  # unset: every GPU the driver lists (the MIG line is not a fifth)
        ("0,2", SMI, 2),
        ("2,7", SMI, 1),  # 7 is no device: CUDA sees the ones before it
        ("GPU-4444,GPU-1111aaaa", SMI, 2),  # unique UUID prefixes, as CUDA accepts them
        ("GPU-", SMI, 0),  # a prefix of several is no device
    ],
)
def test_gpus_are_counted_as_cuda_would_see_them(cuda_visible: str | None, listing: str | None, count: int) -> None:
    view = visible_gpus(cuda_visible, listing)
    assert view.count == count
    assert view.smi_found == (listing is not None)


def test_gpu_reports_name_the_node_the_count_and_the_fix() -> None:
    two = GpuView(2, "no nvidia-smi, CUDA_VISIBLE_DEVICES=0,1", False)
    assert gpu_problem("node3", "trainer", 2, two, in_container=False) is None
    assert gpu_problem("node3", "client", 0, GpuView(8, "x", True), in_container=False) is None, \
        "a GPU-less client never uses a GPU"
    fewer = gpu_problem("node3", "server", 4, two, in_container=False)
    assert fewer == ("node node3 sees 2 GPU(s) (no nvidia-smi, CUDA_VISIBLE_DEVICES=0,1) but its server component "
                     "asked for 4: check the partition's GPUs (gres gpu:N, cluster.n_gpus_per_node) and that "
                     "launcher.slurm.srun_additional_args asks for no other GPUs")
    more = gpu_problem("node3", "server", 1, two, in_container=False)
    assert more is not None and "sees 2 GPU(s)" in more, "more than asked for: the step is not confined to its own"
    no_driver = gpu_problem("node3", "trainer", 2, GpuView(2, "no nvidia-smi, CUDA_VISIBLE_DEVICES=0,1", False),
                            in_container=True)
    assert no_driver is not None and "add --nv to launcher.slurm.apptainer_args" in no_driver, \
        "in a container, Slurm's variable alone is no proof: without --nv there is no driver"
    broken = gpu_problem("node3", "trainer", 2, GpuView(0, "x", False), in_container=False,
                         smi_error="nvidia-smi -L failed: NVIDIA-SMI has failed")
    assert broken is not None and "NVIDIA-SMI has failed" in broken and "driver" in broken


def test_the_canary_report_keeps_its_words(tmp_path: Path) -> None:
    canary = tmp_path / ".node-check.7.0"
    canary.write_text("7.1.2\n")
    assert canary_problem("node4", str(canary), "7.1.2", "node1") is None
    expected = (f"node node4 does not see the trial directory {tmp_path} that node node1 wrote in: cluster.fileroot "
                "must be on a filesystem every compute node mounts at the same path (not node-local /tmp, not a disk "
                "of the login node only)")
    assert canary_problem("node4", str(canary), "other", "node1") == expected
    assert canary_problem("node4", str(tmp_path / "missing"), "7.1.2", "node1") == expected


def test_a_node_running_other_rlkit_code_than_the_submit_s_names_both_and_the_fix(tmp_path: Path) -> None:
    assert source_problem("node2", "trainer", str(tmp_path), in_container=True) is None  # a trial from before the id
    (tmp_path / "rlkit-source").write_text(source_id() + "\n")
    assert source_problem("node2", "trainer", str(tmp_path), in_container=True) is None
    (tmp_path / "rlkit-source").write_text("0123456789abcdef\n")
    in_image = source_problem("node2", "trainer", str(tmp_path), in_container=True)
    assert in_image == (f"node node2 (trainer) runs {describe()}, not the rlkit that validated this job at submit "
                        "(source 0123456789abcdef): its steps would read the config with other code; rebuild the "
                        "trainer image from the rlkit that submits (`rlkit image build` in its checkout), or submit "
                        "with the rlkit the image holds")
    bare = source_problem("node2", "trainer", str(tmp_path), in_container=False)
    assert bare is not None and "install the submitting rlkit where launcher.python points" in bare
    (tmp_path / "rlkit-source").unlink()
    os.mkfifo(tmp_path / "rlkit-source")  # another process's FIFO would hold the read forever
    assert source_problem("node2", "trainer", str(tmp_path), in_container=True) == \
        f"node node2: {tmp_path / 'rlkit-source'} is not a file (submit writes it)"


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_a_closed_port_is_reported_with_its_reason() -> None:
    reason = reach_problem(f"127.0.0.1:{_closed_port()}", "t", "node2", timeout_s=2)
    assert reason == "Connection refused"


def test_a_listener_that_is_not_the_check_is_not_taken_for_it() -> None:
    """Something else answering on that port (a stale server) is not the trainer's node."""
    with socket.create_server(("127.0.0.1", 0)) as other:
        def answer_wrong() -> None:
            conn, _ = other.accept()
            with conn:
                conn.recv(100)
                conn.sendall(b"HTTP/1.1 400 Bad Request\n")

        thread = threading.Thread(target=answer_wrong)
        thread.start()
        reason = reach_problem(f"127.0.0.1:{other.getsockname()[1]}", "t", "node2", timeout_s=2)
        thread.join()
    assert reason is not None and reason.startswith("something other than this check answers there")


def test_the_first_node_publishes_and_answers_every_peer_with_the_token(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLKIT_ADVERTISE_HOST", "127.0.0.1")  # the trainer's own notion of its address
    address_file = tmp_path / "a.address"
    address_file.write_text("")  # the batch script creates it empty, then writes the listener's line into it
    lines: list[str] = []
    server, failed = listen_and_publish("node1", lines.append)
    assert server is not None and failed is None
    (line,) = lines
    assert line.startswith(NODE_CHECK_ADDRESS_MARK + " 127.0.0.1:") and line.endswith(" node1")
    address_file.write_text(line.removeprefix(NODE_CHECK_ADDRESS_MARK + " ") + "\n")
    published = read_published(str(address_file), 1.0)
    assert published is not None and published[0].startswith("127.0.0.1:") and published[1] == "node1"
    heard: list[int] = []
    thread = threading.Thread(target=lambda: heard.append(serve_peers(server, "tok", 2, time.monotonic() + 10)))
    thread.start()
    assert reach_problem(published[0], "wrong", "intruder", timeout_s=2) is not None, "a wrong token gets no answer"
    assert reach_problem(published[0], "tok", "node2", timeout_s=2) is None
    assert reach_problem(published[0], "tok", "node3", timeout_s=2) is None
    thread.join(timeout=10)
    assert heard == [2], "it stops as soon as every peer said hello, not at its deadline"


def test_an_address_file_that_is_empty_missing_or_not_an_address_is_no_address(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.write_text("")
    hostile = tmp_path / "hostile"
    hostile.write_text("$(touch pwned):80 node1\n")
    half = tmp_path / "half"
    half.write_text("127.0.0.1:80")  # no newline yet: still being written
    for path in (empty, hostile, half, tmp_path / "missing"):
        started = time.monotonic()
        assert read_published(str(path), 0.3) is None
        assert time.monotonic() - started < 3  # its 0.3 s, not a wait for a file that never comes
    assert not (tmp_path / "pwned").exists()


def test_a_first_node_whose_advertised_host_is_no_host_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLKIT_ADVERTISE_HOST", "not a host")
    lines: list[str] = []
    server, failed = listen_and_publish("node1", lines.append)
    assert server is None and not lines
    assert failed is not None and failed.startswith("node node1 cannot be reached at what it advertises: ")
    assert failed.endswith("fix RLKIT_ADVERTISE_HOST")


def _node(name: str, node_id: int, cuda_visible: str, *args: str, advertise: str = "127.0.0.1") -> str:
    """A bash function standing for one component's srun on one node: the module run here with that node's Slurm
    variables (every "node" is this machine, so the listener advertises 127.0.0.1)."""
    return (f"node_check_{name}() {{\n  SLURMD_NODENAME={name} SLURM_NODEID={node_id} "
            f"CUDA_VISIBLE_DEVICES={cuda_visible} RLKIT_ADVERTISE_HOST={advertise} {sys.executable} -m "
            f"rlkit.steps.node_check {' '.join(args)} --target-group=1 --target-role=trainer --address-wait=2 "
            '"$@"\n}')


def run_step_0(tmp_path: Path, nodes: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """The job script's real supervisor (no work steps) with `nodes` (name: function) as its node checks."""
    (tmp_path / "logs").mkdir()
    listed = " ".join(f"node_check_{name}" for name in nodes)
    body = supervisor_body(trial_dir=str(tmp_path), attempt=1, retries=0, trainer_group=1, steps=[],
                           node_checks=[*nodes.values(), f"NODE_CHECKS=({listed})"])
    from tests.helpers.slurm_stubs import path_with, slurm_bin

    return subprocess.run(["bash", "-c", body], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PATH": path_with(slurm_bin(tmp_path)), "SLURM_JOB_ID": "4242"})


def test_step_0_passes_when_every_node_reads_the_token_sees_its_gpus_and_reaches_the_first_node(
        tmp_path: Path) -> None:
    """The supervisor's check_nodes with three "nodes": a server node, and the trainer's two nodes, the first of which
    listens. Its address goes through the script (which writes it beside the token) to the other two."""
    done = run_step_0(tmp_path, {"node1": _node("node1", 0, "0,1", "--role=server", "--gpus=2"),
                                 "node2": _node("node2", 0, "0", "--role=trainer", "--gpus=1", "--listen=2"),
                                 "node3": _node("node3", 1, "0", "--role=trainer", "--gpus=1")})
    assert done.returncode == 0, done.stdout + done.stderr
    assert "rlkit: node check passed: every node sees the trial directory and the GPUs its component asked for, " \
           "and reaches the work component's first node" in done.stdout
    assert NODE_CHECK_ADDRESS_MARK not in done.stdout, "the address line is the script's, not the log's"
    assert not list(tmp_path.glob(".node-check.*")), "the token and the address file are removed"


def test_step_0_reports_each_node_s_problems_at_once_and_never_retries(tmp_path: Path) -> None:
    """A node with too few GPUs, and a first node that cannot listen where it says: every problem is a line of the
    log and the batch log, and the script exits with the code the supervisor never retries."""
    done = run_step_0(tmp_path, {"node1": _node("node1", 0, "0", "--role=server", "--gpus=2"),
                                 "node2": _node("node2", 0, "0", "--role=trainer", "--gpus=1", "--listen=1",
                                                advertise="bad_host")})
    assert done.returncode == NO_RETRY_EXIT, done.stdout + done.stderr
    log = (tmp_path / "logs" / "node-check.log").read_text()
    assert "rlkit: node node1 sees 1 GPU(s) (no nvidia-smi, CUDA_VISIBLE_DEVICES=0) but its server component asked " \
           "for 2" in log
    assert "rlkit: node node2 cannot be reached at what it advertises: " in log
    assert "rlkit: node node1 cannot reach the trainer's node" in log and "no address from it in" in log
    for line in log.splitlines():
        assert line in done.stdout, "the batch log shows what the node-check log says"
    assert f"rlkit: step node-check failed with exit code {NO_RETRY_EXIT}" in done.stdout


def test_a_node_that_cannot_see_the_trial_directory_names_it_and_its_gpus(tmp_path: Path) -> None:
    canary = tmp_path / ".node-check.9.0"
    canary.write_text("9.1.1\n")
    out = subprocess.run([sys.executable, "-m", "rlkit.steps.node_check", "--role=server", "--gpus=2",
                          f"--canary={canary}", "--token=other", "--writer=node1",
                          f"--address-file={canary}.address", "--target-group=1"], cwd="/", text=True,
                         capture_output=True, timeout=30, check=False,
                         env={**os.environ, "SLURMD_NODENAME": "node3", "SLURM_NODEID": "1",
                              "CUDA_VISIBLE_DEVICES": "0", "PATH": "/bin"})
    assert out.returncode == 1
    assert out.stdout.splitlines() == [
        f"rlkit: node node3 does not see the trial directory {tmp_path} that node node1 wrote in: cluster.fileroot "
        "must be on a filesystem every compute node mounts at the same path (not node-local /tmp, not a disk of the "
        "login node only)",
        "rlkit: node node3 sees 1 GPU(s) (no nvidia-smi, CUDA_VISIBLE_DEVICES=0) but its server component asked for "
        "2: check the partition's GPUs (gres gpu:N, cluster.n_gpus_per_node) and that "
        "launcher.slurm.srun_additional_args asks for no other GPUs"], "no reach check: it cannot read the address"
    assert "ports between the job's nodes" in NETWORK_FIX


def test_each_component_checks_as_its_steps_run() -> None:
    """One srun per component with its own GPUs asked for explicitly, its image, binds, python and environment (the
    steps' own), one task per node, no node killed for another's failure; only the work component listens."""
    plan = plan_of(load_config(CONFIGS / "grpo.yaml", ["launcher.python=/opt/rlkit/bin/python",
                                                       "actor.path=/storage/models/m", "cluster.fileroot=/storage/r",
                                                       "launcher.trainer_env_vars=NCCL_DEBUG=WARN",
                                                       "launcher.slurm.srun_additional_args=--cpu-bind=none"]))
    server_step = next(s for s in plan.steps if s.het_group == 0)
    trainer_step = next(s for s in plan.steps if s.het_group == 1)
    for group, step in ((0, server_step), (1, trainer_step)):
        argv = list(node_check_command(group, plan))
        component = plan.components[group]
        assert f"--het-group={group}" in argv and f"--nodes={component.nodes}" in argv
        assert f"--ntasks={component.nodes}" in argv and "--kill-on-bad-exit=0" in argv
        assert f"--gres=gpu:{component.gpus_per_node}" in argv and f"--gpus={component.gpus_per_node}" in argv
        run = list(step_command(step, plan))
        container = run[run.index("apptainer"):run.index(step.argv[0])]
        assert argv[argv.index("apptainer"):argv.index(step.argv[0])] == container, "the steps' image and binds"
        assert "--nv" in container
        assert argv[:argv.index("timeout")] == run[:run.index("srun")], "the steps' environment additions"
        assert argv[argv.index("--chdir=/"):argv.index("apptainer")] == ["--chdir=/", "--cpu-bind=none"], \
            "the steps' srun arguments"
        assert run[run.index("--chdir=/"):run.index("apptainer")] == ["--chdir=/", "--cpu-bind=none"]
        assert argv[argv.index(step.argv[0]):][:3] == [step.argv[0], "-m", "rlkit.steps.node_check"]
        assert "--container" in argv and "--target-group=1" in argv
        assert ("--listen=1" in argv) == (group == 1)


def test_a_peer_trickling_its_hello_does_not_hold_the_listener_past_its_deadline() -> None:
    """A connection sending a byte every 0.1 s (never a whole line in time) is dropped at the listener's deadline;
    a socket timeout alone is per recv, so it held the listener for 512 of them."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        stop = threading.Event()

        def trickle() -> None:
            with socket.create_connection(server.getsockname()[:2], timeout=5) as conn, contextlib.suppress(OSError):
                while not stop.wait(0.1):
                    conn.sendall(b"t")

        thread = threading.Thread(target=trickle, daemon=True)
        thread.start()
        start = time.monotonic()
        heard = serve_peers(server, "tok", 1, start + 0.5)
        waited = time.monotonic() - start
        stop.set()
        thread.join(5)
    assert heard == 0 and waited < 2.0, f"served for {waited:.1f} s"
