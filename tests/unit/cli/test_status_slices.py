"""`rlkit status TRIAL`'s step slices: the node and GPUs each step holds, read back from the slice line each step
prints first in its log (the last one per node: a restarted step prints it again), in a bounded number of bytes,
from the trial's own regular log files only, shown without the log's control characters."""

from __future__ import annotations

import json
import os
from io import StringIO
from pathlib import Path

import pytest
from rich.console import Console

from rlkit.cli import status_slices
from rlkit.cli.status import TrialDetail, TrialRow, print_detail
from rlkit.cli.status_slices import NodeSlice, StepSlice, read_slice, run_started, step_slices
from rlkit.slurm.jobenv import JobEnv
from rlkit.trials.paths import TrialPaths


def line(step: str, node: str, gpus: str) -> str:
    """The line a step prints, made by the code the steps use."""
    env = JobEnv.from_environ({"SLURMD_NODENAME": node, "SLURM_STEP_GPUS": gpus})
    return env.slice_line(step) + "\n"


def write_log(paths: TrialPaths, step: str, text: str) -> Path:
    paths.logs.mkdir(parents=True, exist_ok=True)
    log = paths.step_log(step)
    log.write_text(text)
    return log


def test_each_step_shows_its_node_and_gpus_and_a_restart_s_line_wins(tmp_path: Path) -> None:
    paths = TrialPaths(tmp_path)
    write_log(paths, "server-0", line("server-0", "node1", "0") + "INFO vllm started\n")
    write_log(paths, "server-1", line("server-1", "node1", "1") + "died\n" + line("server-1", "node1", "3") + "up\n")
    write_log(paths, "server-10", line("server-10", "node2", "2"))
    write_log(paths, "grpo", line("grpo", "node1", "4,5") + line("grpo", "node2", "4,5") + "step 1 done\n")
    write_log(paths, "generate", "no slice line yet\n")
    write_log(paths, "node-check", line("node-check", "node1", "0"))
    (paths.logs / "slurm-12.out").write_text(line("slurm-12", "node1", "0"))
    found = step_slices(paths.logs)
    assert [s.text() for s in found] == ["step grpo: node1, GPUs 4,5; node2, GPUs 4,5", "step server-0: node1, GPUs 0",
                                         "step server-1: node1, GPUs 3", "step server-10: node2, GPUs 2"]
    client = line("generate", "node1", "")
    assert client.endswith("holds GPUs none\n")
    write_log(paths, "generate", client)
    assert step_slices(paths.logs)[0] == StepSlice("generate", (NodeSlice("node1", "none"),))


def test_a_long_log_is_read_at_its_end_else_at_its_start(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(status_slices, "TAIL_BYTES", 4096)
    monkeypatch.setattr(status_slices, "HEAD_BYTES", 1024)
    noise = "x" * 99 + "\n"
    log = tmp_path / "server-0.log"
    log.write_text(line("server-0", "node1", "0") + noise * 200)
    assert read_slice(log, "server-0") == (NodeSlice("node1", "0"),), "the first start's line, from the head"
    log.write_text(line("server-0", "node1", "0") + noise * 200 + line("server-0", "node1", "2") + noise * 5)
    assert read_slice(log, "server-0") == (NodeSlice("node1", "2"),), "the restart's line, from the tail"
    log.write_text(noise * 20 + line("server-0", "node1", "0") + noise * 200)
    assert read_slice(log, "server-0") == (), "a line past both bounds is not looked for"
    reads: list[int] = []
    real_pread = os.pread
    monkeypatch.setattr(status_slices.os, "pread", lambda fd, n, at: reads.append(n) or real_pread(fd, n, at))
    log.write_text(noise * 100_000)  # 10 MB without the line
    assert read_slice(log, "server-0") == () and sum(reads) <= 4096 + 1024, reads


def test_log_content_is_shown_not_trusted(tmp_path: Path) -> None:
    paths = TrialPaths(tmp_path)
    write_log(paths, "server-0", "rlkit step slice: server-0 on node1\x1b[2J\x07 holds GPUs 0\x1b]0;pwned\x07\n")
    write_log(paths, "server-1", "rlkit step slice: server-0 on node9 holds GPUs 7\n"  # another step's line
              "  rlkit step slice: server-1 on node9 holds GPUs 7\n")  # not at the start of a line
    write_log(paths, "server-2", f"rlkit step slice: server-2 on {'n' * 500} holds GPUs [bold]0[/bold]\n")
    found = step_slices(paths.logs)
    assert found[0].nodes == (NodeSlice("node1[2J", "0]0;pwned"),)
    assert [s.step for s in found] == ["server-0", "server-2"]
    assert len(found[1].nodes[0].node) == status_slices.MAX_FIELD and found[1].nodes[0].node.endswith("...")
    out = StringIO()
    row = TrialRow("e/t", "7", "RUNNING", "1:00", "node1", "2026-01-01 00:00", str(tmp_path))
    print_detail(Console(file=out, width=400), TrialDetail(row, "", "", [], slices=found))
    text = out.getvalue()
    assert "step server-0: node1[2J, GPUs 0]0;pwned" in text and "\x1b" not in text and "\x07" not in text
    assert "GPUs [bold]0[/bold]" in text, "printed as text, not as rich markup"


def test_only_the_trial_s_own_regular_files_of_this_run(tmp_path: Path) -> None:
    paths = TrialPaths(tmp_path / "trial")
    elsewhere = tmp_path / "elsewhere.log"
    elsewhere.write_text(line("server-0", "node1", "0"))
    paths.logs.mkdir(parents=True)
    (paths.logs / "server-0.log").symlink_to(elsewhere)
    os.mkfifo(paths.logs / "server-1.log")  # would block an open without O_NONBLOCK
    (paths.logs / "server-2.log").mkdir()
    assert step_slices(paths.logs) == []
    assert read_slice(paths.logs / "server-0.log", "server-0") == ()
    old = write_log(paths, "server-3", line("server-3", "node1", "0"))
    write_log(paths, "grpo", line("grpo", "node2", "0"))
    os.utime(old, (1000.0, 1000.0))
    assert [s.step for s in step_slices(paths.logs, since=5000.0)] == ["grpo"], "server-3's log is an earlier run's"
    assert [s.step for s in step_slices(paths.logs)] == ["grpo", "server-3"]
    linked = TrialPaths(tmp_path / "linked")
    linked.root.mkdir()
    linked.logs.symlink_to(paths.logs)
    assert step_slices(linked.logs) == [] and step_slices(tmp_path / "none") == []


def test_the_run_s_start_from_slurm_s_run_time() -> None:
    assert run_started("00:05:00", now=10_000.0) == 9_700.0
    assert run_started("1-00:00:10", now=100_000.0) == 100_000.0 - 86_410
    assert run_started("", now=1.0) is None and run_started("INVALID", now=1.0) is None


def test_json_holds_each_step_s_nodes(tmp_path: Path) -> None:
    row = TrialRow("e/t", "7", "RUNNING", "1:00", "node1", "2026-01-01 00:00", str(tmp_path))
    slices = [StepSlice("grpo", (NodeSlice("node1", "0,1"), NodeSlice("node2", "0,1")))]
    data = json.loads(json.dumps(TrialDetail(row, "", "", [], slices=slices).to_dict()))
    assert data["slices"] == [{"step": "grpo", "nodes": [{"node": "node1", "gpus": "0,1"},
                                                         {"node": "node2", "gpus": "0,1"}]}]
