"""The recovery tests' fault points (rlkit.slurm.faults): a trial may carry several, each firing in its first run."""

from __future__ import annotations

import pytest

from rlkit.slurm.faults import fault_every_time, fault_point


def test_several_faults_joined_by_plus_each_fire_at_their_version_in_the_first_run_only(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLKIT_FAULT_INJECT", "corrupt_server_weights@3+die_mid_push@7")
    for name in ("SLURM_RESTART_COUNT", "RLKIT_STEP_RETRY", "RLKIT_ATTEMPT"):
        monkeypatch.delenv(name, raising=False)
    assert fault_point("corrupt_server_weights", 3) and fault_point("die_mid_push", 7)
    assert not fault_point("die_mid_push", 3) and not fault_point("corrupt_server_weights", 7)
    assert not fault_point("die_mid_push@7", 7) and not fault_point("disk_full", 2)
    monkeypatch.setenv("RLKIT_STEP_RETRY", "1")  # the in-job retry of the step: no fault fires again
    assert not fault_point("die_mid_push", 7)


def test_die_at_start_fires_in_every_run_alone_or_joined(monkeypatch: pytest.MonkeyPatch) -> None:
    """The crash-loop fault: every retry and attempt dies again (that is what makes it a crash loop)."""
    monkeypatch.setenv("RLKIT_FAULT_INJECT", "disk_full@2+die_at_start")
    monkeypatch.setenv("RLKIT_STEP_RETRY", "1")
    monkeypatch.setenv("RLKIT_ATTEMPT", "2")
    assert fault_every_time("die_at_start") and not fault_point("disk_full", 2)
    assert not fault_every_time("die_at_star") and not fault_every_time("disk_full")
    monkeypatch.setenv("RLKIT_FAULT_INJECT", "die_at_start")
    assert fault_every_time("die_at_start")


def test_no_fault_without_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RLKIT_FAULT_INJECT", raising=False)
    assert not fault_point("die_mid_push", 7) and not fault_every_time("die_at_start")
