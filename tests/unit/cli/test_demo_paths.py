"""The demos (`bash scripts/demo.sh [NAME]` -> `python -m rlkit.cli.demo`) find the checkout's configs wherever the
module sits in the package (a move of the module one folder deeper once sent it to rlkit/configs/)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from rlkit.cli import demo
from rlkit.cli.demos import DEMOS
from tests.conftest import REPO


def test_every_demo_submits_a_config_of_the_checkout() -> None:
    assert demo.REPO == REPO
    assert DEMOS["grpo"].config == "grpo-cpu-demo.yaml"  # the README's demo
    for entry in DEMOS.values():
        assert (demo.REPO / "configs" / entry.config).is_file(), entry.name



def test_the_printed_submit_line_shows_the_fileroot_really_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """What `rlkit demo` prints before it submits, copied, submits the same: a cluster.fileroot override given to the
    demo wins over RLKIT_FILEROOT, so the variable is not shown as if it were used."""
    submitted: list[tuple[str, ...]] = []
    monkeypatch.setattr(demo, "prepare", lambda *_: None)
    monkeypatch.setattr(demo, "rlkit", lambda *args: submitted.append(args) or subprocess.CompletedProcess(args, 2,
                                                                                                          "", ""))
    monkeypatch.setenv("RLKIT_DEMO_DIR", str(tmp_path / "d"))
    monkeypatch.setenv("RLKIT_FILEROOT", "/tmp/rlkit-me")
    monkeypatch.setenv("RLKIT_DEMO_TRIAL", "t1")  # run() sets what is unset, in this process's environment
    assert demo.run(DEMOS["rw"], ["seed=2"]) == 2
    assert (f"$ RLKIT_DEMO_DIR={tmp_path / 'd'} RLKIT_FILEROOT=/tmp/rlkit-me rlkit submit configs/rw-cpu-demo.yaml "
            "seed=2\n") in capsys.readouterr().out
    assert demo.run(DEMOS["rw"], ["cluster.fileroot=/shared/me", "reward.fns={a: 1}"]) == 2
    assert (f"$ RLKIT_DEMO_DIR={tmp_path / 'd'} rlkit submit configs/rw-cpu-demo.yaml cluster.fileroot=/shared/me "
            "'reward.fns={a: 1}'\n") in capsys.readouterr().out
    assert submitted[-1][-2:] == ("cluster.fileroot=/shared/me", "reward.fns={a: 1}")


def test_the_default_fileroot_another_user_could_have_taken_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """The per-user default fileroot (/tmp/rlkit-<user>) is a name anyone could create first, open to all: the demo
    refuses it, as it refuses such a demo directory, before anything is submitted."""
    import os
    import uuid

    submitted: list[tuple[str, ...]] = []
    monkeypatch.setattr(demo, "prepare", lambda *_: None)
    monkeypatch.setattr(demo, "rlkit", lambda *args: submitted.append(args) or subprocess.CompletedProcess(args, 2,
                                                                                                          "", ""))
    name = f"nobody-{uuid.uuid4().hex[:8]}"
    monkeypatch.setattr(demo, "_user", lambda: name)
    monkeypatch.setenv("RLKIT_DEMO_DIR", str(tmp_path / "d"))
    monkeypatch.delenv("RLKIT_FILEROOT", raising=False)
    monkeypatch.setenv("RLKIT_DEMO_TRIAL", "t1")
    taken = Path(f"/tmp/rlkit-{name}")
    taken.mkdir(mode=0o777)
    os.chmod(taken, 0o777)  # as another user would leave it (the umask cut mkdir's mode)
    try:
        assert demo.run(DEMOS["rw"], []) == 2
        err = capsys.readouterr().err
        assert f"demo fileroot {taken}: others may write in it (mode 777)" in err and submitted == []
    finally:
        taken.rmdir()


def test_the_demo_follows_the_trial_its_overrides_named(monkeypatch: pytest.MonkeyPatch) -> None:
    """`rlkit demo grpo experiment_name=x trial_name=y` submits x/y: the demo follows x/y, not the file's name (it once
    waited an hour for a trial that did not exist)."""
    monkeypatch.setattr("rlkit.trials.stage_runs.find_run", lambda name: None)
    config = REPO / "configs" / DEMOS["grpo"].config
    assert demo._trials(config, "t1", []) == ["demo-grpo/t1"]
    assert demo._trials(config, "t1", ["seed=2", "experiment_name=mine"]) == ["mine/t1"]
    assert demo._trials(config, "t1", ["trial_name=try2", "experiment_name=mine"]) == ["mine/try2"]


def test_a_trial_that_is_never_listed_ends_the_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(demo, "_row", lambda name: None)
    monkeypatch.setattr(demo.time, "sleep", lambda s: None)
    clock = iter(range(0, 10_000, 30))  # each poll 30 s later
    monkeypatch.setattr(demo.time, "monotonic", lambda: float(next(clock)))
    assert demo.wait_for("nobody/none", 3600) == ("NOT LISTED", None)
    assert next(clock) < 300, "given up after about two minutes, not the hour"


def test_a_child_command_that_does_not_answer_is_ended_and_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """`rlkit submit` run by the demo hangs (a Slurm controller that never answers sbatch): past its deadline the
    demo ends it and what it started, and exits 1 naming the command and the deadline, with no traceback."""
    import time

    started_file = tmp_path / "grandchild.pid"
    hangs = tmp_path / "python"
    hangs.write_text(f"#!/bin/sh\nsleep 60 &\necho $! > {started_file}\nwait\n")  # python -m rlkit submit ...
    hangs.chmod(0o755)
    monkeypatch.setattr(demo, "prepare", lambda *_: None)
    monkeypatch.setattr(demo.sys, "executable", str(hangs))
    monkeypatch.setitem(demo.DEADLINES_S, "submit", 0.5)
    monkeypatch.setenv("RLKIT_DEMO_DIR", str(tmp_path / "d"))
    monkeypatch.setenv("RLKIT_FILEROOT", str(tmp_path / "root"))
    monkeypatch.setenv("RLKIT_DEMO_TRIAL", "t1")
    t0 = time.monotonic()
    assert demo.main(["rw"]) == 1
    assert time.monotonic() - t0 < 10
    err = capsys.readouterr().err
    assert "demo rw: `rlkit submit` did not answer within 0.5 s and was ended; it may have submitted" in err, err
    assert "Traceback" not in err
    stat = Path(f"/proc/{int(started_file.read_text())}/stat")
    for _ in range(50):  # SIGKILLed with its parent's session (a zombie until init reaps it)
        try:
            if stat.read_text().rsplit(")", 1)[1].split()[0] == "Z":
                break
        except FileNotFoundError:
            break
        time.sleep(0.1)
    else:
        raise AssertionError(f"the hung child's own child ({stat}) outlived the demo")
