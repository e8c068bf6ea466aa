"""The structure that keeps the README test command within its budget (docs/development/suite.md, "Tests and their
time budget"):
background modules say which scenario every test rides on, the background tests run after everything else, and
scripts/test.sh holds the 30-minute budget line. Checked here, in the fast tier, rather than found out in a full run."""

from __future__ import annotations

import ast
import subprocess
from pathlib import Path

import pytest

from tests.conftest import REPO, pytest_collection_modifyitems

BUDGET_MIN = 30


def _background_modules() -> list[Path]:
    modules = []
    for path in sorted((REPO / "tests" / "integration").glob("test_*.py")):
        if "pytest.mark.background" in path.read_text():
            modules.append(path)
    return modules


def _literal(tree: ast.Module, name: str) -> object:
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            if isinstance(node.value, ast.Dict) and name == "SCENARIOS":  # values are functions: the keys suffice
                return {ast.literal_eval(k) for k in node.value.keys if k is not None}
            return ast.literal_eval(node.value)
    raise AssertionError(f"no module-level {name}")


class _Counted:
    """A scenario that counts how many of its kind run at once, each until `release` is set."""

    def __init__(self) -> None:
        import threading

        self.running, self.most, self.lock, self.release = 0, 0, threading.Lock(), threading.Event()

    def __call__(self) -> None:
        with self.lock:
            self.running += 1
            self.most = max(self.most, self.running)
        self.release.wait(10)
        with self.lock:
            self.running -= 1


def test_every_background_test_names_the_scenarios_it_rides_on() -> None:
    modules = _background_modules()
    assert modules, "the recovery module runs in the background"
    for path in modules:
        tree = ast.parse(path.read_text())
        tests = {node.name for node in tree.body if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")}
        functions = {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}
        functions |= {target.id for node in tree.body if isinstance(node, ast.Assign) for target in node.targets
                      if isinstance(target, ast.Name)}  # start_background = trial_starter(USES, SCENARIOS)
        assert "start_background" in functions, path
        uses, scenarios = _literal(tree, "USES"), _literal(tree, "SCENARIOS")
        assert isinstance(uses, dict) and isinstance(scenarios, set)
        assert set(uses) == tests, f"{path.name}: USES must list every test, and only tests"
        used = {name for names in uses.values() for name in names}
        assert used <= scenarios, f"{path.name}: unknown scenarios {used - scenarios}"
        assert used == scenarios, f"{path.name}: scenarios no test asserts on {scenarios - used}"


class _Item:
    def __init__(self, name: str, background: bool) -> None:
        self.name, self._background = name, background

    def get_closest_marker(self, marker: str) -> object | None:
        return object() if marker == "background" and self._background else None


def test_background_tests_run_last_in_their_own_order() -> None:
    items = [_Item("b1", True), _Item("f1", False), _Item("b2", True), _Item("f2", False), _Item("f3", False)]
    pytest_collection_modifyitems(items)  # type: ignore[arg-type]
    assert [item.name for item in items] == ["f1", "f2", "f3", "b1", "b2"]


@pytest.mark.parametrize(("seconds", "warned"), [(BUDGET_MIN * 60, False), (BUDGET_MIN * 60 + 1, True)])
def test_the_suite_prints_its_budget_and_warns_past_it(tmp_path: Path, seconds: int, warned: bool) -> None:
    """scripts/test.sh's own report function, run with the suite's clock set to `seconds` (bash's SECONDS)."""
    script = (REPO / "scripts" / "test.sh").read_text()
    prelude = script[:script.index("t=$SECONDS\npy=")]  # the settings and functions, before any install
    probe = tmp_path / "probe.sh"
    probe.write_text(prelude + f"SECONDS={seconds}\nstarted=0\n")
    out = subprocess.run(["bash", str(probe)], capture_output=True, text=True, check=True).stdout
    minutes = (seconds + 59) // 60
    assert f"suite: {minutes} min (budget {BUDGET_MIN})" in out, out
    assert ("WARNING: the suite took" in out) is warned, out


def test_background_scenarios_run_one_at_a_time_until_the_pool_is_widened() -> None:
    """One scenario at a time beside the foreground; two once the first background test widens the pool."""
    import time

    from tests.helpers.scenarios import WALL_TIMES, ScenarioPool
    from tests.helpers.slurm_helpers import wait_for

    scenario = _Counted()
    pool = ScenarioPool(1, 2)
    try:
        for name in ("a", "b", "c"):
            pool.start(name, scenario)
        time.sleep(0.3)
        assert scenario.most == 1
        pool.widen()
        pool.widen()  # idempotent
        # the second scenario's thread starts when the machine lets it
        wait_for(lambda: scenario.running >= 2, "a second scenario", timeout=10, every=0.02)
        time.sleep(0.3)  # room for a wrongly started third
        assert scenario.most == 2 and scenario.running == 2
        scenario.release.set()
        for name in ("a", "b", "c"):
            pool.result(name, timeout=10)
    finally:
        scenario.release.set()
        pool.close()
        for name in ("a", "b", "c"):
            WALL_TIMES.pop(name, None)  # not the session's scenarios: kept out of its summary
    assert scenario.most == 2


def test_the_scenario_pool_widens_by_one_per_idle_window_and_never_when_busy() -> None:
    """The background pool takes a second scenario when the machine's CPU was idle enough over a window, one per
    window, never beyond the widened number, and not while the CPU is busy (the CPU times handed in)."""
    import threading

    from tests.helpers.scenarios import WALL_TIMES, ScenarioPool

    busy = threading.Event()
    ticks = [0, 0]  # all, idle

    def cpu_times() -> tuple[int, int]:
        ticks[0] += 100
        ticks[1] += 5 if busy.is_set() else 60
        return ticks[0], ticks[1]

    scenario = _Counted()

    def wait_until_running(count: int) -> None:
        for _ in range(200):
            with scenario.lock:
                if scenario.running == count:
                    return
            threading.Event().wait(0.01)
        raise AssertionError(f"{scenario.running} running, not {count}")

    busy.set()
    pool = ScenarioPool(1, 3)
    try:
        for name in ("w1", "w2", "w3", "w4"):
            pool.start(name, scenario)
        pool.widen_when_idle(0.35, 0.02, cpu_times)
        wait_until_running(1)
        threading.Event().wait(0.2)  # ten busy windows
        assert scenario.most == 1
        busy.clear()
        wait_until_running(3)  # idle windows: one more each, up to the widened number
        threading.Event().wait(0.1)
        assert scenario.most == 3
    finally:
        scenario.release.set()
        pool.close()
        for name in ("w1", "w2", "w3", "w4"):
            WALL_TIMES.pop(name, None)


def test_the_two_lanes_run_every_test() -> None:
    """`nox -s tests` runs the cluster lane (`-m "(slurm or vllm or sglang) and not controller" tests/integration`)
    beside the local lane (the rest of tests/unit and tests/integration, the controller-only CLI tests included): a
    unit test with one of those markers would be in neither."""
    def uses_the_marker(path: Path) -> bool:
        return any(isinstance(node, ast.Attribute) and node.attr in ("slurm", "vllm", "sglang")
                   and isinstance(node.value, ast.Attribute) and node.value.attr == "mark"
                   for node in ast.walk(ast.parse(path.read_text())))

    marked = [path.name for path in (REPO / "tests" / "unit").rglob("test_*.py") if uses_the_marker(path)]
    assert marked == [], marked
    assert uses_the_marker(REPO / "tests" / "integration" / "test_recovery.py")  # the check sees the marker
    noxfile = (REPO / "noxfile.py").read_text()
    assert 'CLUSTER = "(slurm or vllm or sglang) and not controller"' in noxfile
    assert '"-m", CLUSTER, "tests/integration"' in noxfile
    assert '"-m", f"not ({CLUSTER})", "tests/unit", "tests/integration"' in noxfile


def test_a_wait_on_a_trial_ends_with_its_job_and_explains_itself(tmp_path: Path) -> None:
    """A scenario waiting for steps of a job that has ended stops at once (not at its 600 s timeout, which is what a
    failed run costs CI per wait), and every such error carries the trial's picture: the queue, the nodes, the
    trial's processes and the end of each log (CI prints only the first failure's message)."""
    import os
    import threading
    import time

    from tests.helpers.slurm_helpers import wait_for

    trial = tmp_path / "trial"
    (trial / "logs").mkdir(parents=True)
    exit_noise = 'nanobind: leaked 514 functions!\n - leaked function "create_or"\n - ... skipped remainder\n'
    (trial / "logs" / "grpo.log").write_text("".join(f"line {k}\n" for k in range(30)) + exit_noise)
    (trial / "job_end").write_text("an earlier attempt's end\n")
    os.utime(trial / "job_end", (time.time() - 60, time.time() - 60))  # before the wait: not this job's end
    soon = time.monotonic() + 0.3
    assert wait_for(lambda: time.monotonic() > soon and "trained", "steps", timeout=5, every=0.05, trial=trial)
    ended = threading.Timer(0.5, lambda: (trial / "job_end").write_text("1\nFAILED\n1\n0\n"))
    ended.start()
    began = time.monotonic()
    with pytest.raises(AssertionError) as error:
        wait_for(lambda: False, "10 trained steps", timeout=60, every=0.1, trial=trial)
    ended.join()
    assert time.monotonic() - began < 10
    message = str(error.value)
    assert message.startswith("the trial's job ended while waiting for 10 trained steps")
    for part in ("squeue:", "sinfo:", "processes of the trial:", "grpo.log (last 12 lines):\nline 18\n"):
        assert part in message
    assert "line 17\n" not in message and message.endswith("line 29")
    assert wait_for(lambda: 7, "a value", timeout=1, trial=trial) == 7  # a true predicate wins over an ended job
