"""Reward functions: math-verify and exact-match built-ins, reward.fn resolution, and the process-based runner."""

from __future__ import annotations

import asyncio
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from rlkit.errors import ConfigError
from rlkit.rewards import (
    RewardOutcome,
    RewardRunner,
    exact_match_reward,
    extract_answer,
    math_reward,
    resolve_reward_fn,
)

USER_MODULE = "rlkit_test_user_rewards"
USER_SOURCE = '''
import math
import os
import threading


def echo(prompt, completion, row):
    return float(row["x"])


def pid_or_hang(prompt, completion, row):
    if completion == "hang":
        threading.Event().wait()
    return float(os.getpid())


def boom(prompt, completion, row):
    raise ValueError("boom on " + completion)


def text(prompt, completion, row):
    return "abc"


def not_a_number(prompt, completion, row):
    return math.nan


def die(prompt, completion, row):
    if completion == "die":
        os._exit(3)
    return 1.0


def length(prompt, completion, row):
    return float(len(completion))


THRESHOLD = 3
shout = lambda prompt, completion, row: 1.0  # noqa: E731
'''


@pytest.fixture
def user_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A user's reward module in tmp_path, importable by name (here and in the runner's worker processes)."""
    (tmp_path / f"{USER_MODULE}.py").write_text(USER_SOURCE)
    (tmp_path / "rlkit_test_broken_rewards.py").write_text("raise RuntimeError('bad import')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield USER_MODULE
    for name in (USER_MODULE, "rlkit_test_broken_rewards"):
        sys.modules.pop(name, None)


@pytest.fixture
def make_runner() -> Iterator[Callable[..., RewardRunner]]:
    runners: list[RewardRunner] = []

    def make(fn: Any, timeout: float = 0.5, workers: int = 1) -> RewardRunner:
        runners.append(RewardRunner(fn, timeout, workers=workers))
        return runners[-1]

    yield make
    for runner in runners:
        runner.close()


def score(runner: RewardRunner, completion: str = "", row: dict[str, Any] | None = None) -> RewardOutcome:
    """One call, with a hard limit so a broken runner fails the test instead of hanging it."""
    return asyncio.run(asyncio.wait_for(runner.score("prompt", completion, row or {}), 60))


def config_error(spec: str, answer_key: str = "answer") -> str:
    with pytest.raises(ConfigError) as info:
        resolve_reward_fn(spec, answer_key)
    return str(info.value)


def process_gone(pid: int, within: float = 5.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


# --- math ---------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("completion", "answer", "expected"), [
    ("The answer is \\boxed{\\frac{1}{2}}", "0.5", 1.0),
    ("so 12 apples", "12", 1.0),
    ("so 12 apples", 12, 1.0),  # a number in the answer column
    ("\\boxed{2^{10}}", "1024", 1.0),  # LaTeX answer, plain reference
    ("half of 1.5 is 0.75", "\\frac{3}{4}", 1.0),  # plain answer, LaTeX reference
    ("\\boxed{\\dfrac{3}{4}}", "3/4", 1.0),
    ("\\boxed{x+1}", "1+x", 1.0),
    ("total: 1,000 dollars", "1000", 1.0),
    ("it is -3", "-3", 1.0),
    ("\\boxed{7} after 8 tries", "7", 1.0),  # a boxed answer wins over the last number
    ("\\boxed{3} no wait \\boxed{4}", "4", 1.0),  # the last boxed answer counts
    ("first 12 then 13", "12", 0.0),  # the last number counts
    ("so 11 apples", "12", 0.0),
    ("The answer is \\boxed{\\frac{1}{3}}", "0.5", 0.0),
    ("I do not know", "12", 0.0),
])
def test_math_reward(completion: str, answer: object, expected: float) -> None:
    assert math_reward("prompt", completion, {"answer": answer}) == expected


def test_extract_answer_boxed_nesting_and_last_number() -> None:
    assert extract_answer("so \\boxed{\\frac{1}{\\sqrt{2}}} done") == "\\frac{1}{\\sqrt{2}}"
    assert extract_answer("\\boxed{4} then \\boxed{5") == "4"  # an unclosed box is not an answer
    assert extract_answer("5-3 gives 2.") == "2"
    assert extract_answer("10-3") == "3"
    assert extract_answer("about 3/4 of 1,200") == "1200"
    assert extract_answer("nothing here") is None


def test_math_reward_works_outside_the_main_thread() -> None:
    # math-verify's default signal-based timeouts raise ValueError off the main thread.
    results: list[object] = []

    def call() -> None:
        try:
            results.append(math_reward("", "\\boxed{\\frac{1}{2}}", {"answer": "0.5"}))
        except Exception as exc:
            results.append(exc)

    thread = threading.Thread(target=call)
    thread.start()
    thread.join(60)
    assert results == [1.0]


def test_math_reward_missing_answer_column_names_it() -> None:
    with pytest.raises(KeyError, match=r"'answer'.*reward.answer_key.*\['question'\]"):
        math_reward("", "12", {"question": "6+6"})


# --- exact_match --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("completion", "answer", "expected"), [
    (" Paris \n", "Paris", 1.0),
    ("Paris", " Paris ", 1.0),
    ("The capital is \\boxed{ Paris }", "Paris", 1.0),
    ("paris", "Paris", 0.0),
    ("The answer is Paris", "Paris", 0.0),
    ("\\boxed{Lyon}", "Paris", 0.0),
])
def test_exact_match_reward(completion: str, answer: str, expected: float) -> None:
    assert exact_match_reward("prompt", completion, {"answer": answer}) == expected


# --- resolve_reward_fn --------------------------------------------------------------------------------------------

def test_resolve_builtins_bind_the_answer_key() -> None:
    exact = resolve_reward_fn("exact_match", "label")
    assert exact("", "Paris", {"label": "Paris", "answer": "Lyon"}) == 1.0
    math = resolve_reward_fn(" math ", "solution")
    assert math("", "\\boxed{0.5}", {"solution": "1/2", "answer": "7"}) == 1.0
    with pytest.raises(KeyError, match="solution"):
        math("", "\\boxed{0.5}", {"answer": "1/2"})


def test_resolve_unknown_builtin_lists_the_choices() -> None:
    message = config_error("maths")
    assert "'maths'" in message and "not a built-in" in message
    assert "exact_match, math" in message and "module.path:function" in message


def test_resolve_dotted_spec_without_colon_shows_the_fix() -> None:
    message = config_error("mypkg.rewards.score")
    assert "no ':'" in message and "'mypkg.rewards:score'" in message


@pytest.mark.parametrize("spec", [":score", "mypkg.rewards:", "a:b:c"])
def test_resolve_malformed_spec(spec: str) -> None:
    assert "not of the form module.path:function" in config_error(spec)


def test_resolve_missing_module_names_it_and_the_import_error() -> None:
    message = config_error("rlkit_no_such_module_xyz.sub:score")
    assert "cannot import module 'rlkit_no_such_module_xyz.sub'" in message
    assert "No module named 'rlkit_no_such_module_xyz'" in message and "PYTHONPATH" in message


def test_resolve_module_that_fails_on_import(user_module: str) -> None:
    message = config_error("rlkit_test_broken_rewards:score")
    assert "'rlkit_test_broken_rewards'" in message and "RuntimeError: bad import" in message


def test_resolve_missing_attribute_lists_the_functions(user_module: str) -> None:
    message = config_error(f"{user_module}:nope")
    assert f"module '{user_module}' has no attribute 'nope'" in message
    assert "echo" in message and "length" in message and "math" not in message.split("found:")[1]


def test_resolve_not_callable(user_module: str) -> None:
    message = config_error(f"{user_module}:THRESHOLD")
    assert "'THRESHOLD'" in message and "is a int, not callable" in message


def test_resolve_lambda_is_rejected_as_unpicklable(user_module: str) -> None:
    message = config_error(f"{user_module}:shout")
    assert "cannot be pickled" in message and "top level" in message


def test_resolve_user_function(user_module: str) -> None:
    fn = resolve_reward_fn(f"{user_module}:length", "answer")
    assert fn("prompt", "abcd", {}) == 4.0


# --- RewardRunner -------------------------------------------------------------------------------------------------

def test_runner_scores_concurrently_and_reuses_workers(user_module: str,
                                                       make_runner: Callable[..., RewardRunner]) -> None:
    runner = make_runner(resolve_reward_fn(f"{user_module}:echo", "answer"), workers=2)

    async def many() -> list[RewardOutcome]:
        return await asyncio.gather(*(runner.score("p", "c", {"x": i}) for i in range(6)))

    assert [o.value for o in asyncio.run(many())] == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    assert [o.value for o in asyncio.run(many())] == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]  # a second event loop
    assert (runner.calls, runner.errors, runner.timeouts) == (12, 0, 0)

    pids = make_runner(resolve_reward_fn(f"{user_module}:pid_or_hang", "answer"))
    first, second = score(pids, "ok"), score(pids, "ok")
    assert first.error is None and first.value == second.value != float(os.getpid())


def test_runner_timeout_kills_the_hung_worker(user_module: str, make_runner: Callable[..., RewardRunner]) -> None:
    runner = make_runner(resolve_reward_fn(f"{user_module}:pid_or_hang", "answer"), timeout=0.5)
    hung_pid = score(runner, "ok").value
    started = time.monotonic()
    outcome = score(runner, "hang")
    elapsed = time.monotonic() - started
    assert outcome.timed_out and outcome.value == 0.0
    assert outcome.error is not None and "longer than 0.5 s" in outcome.error
    assert 0.4 < elapsed < 3.0
    assert (runner.timeouts, runner.errors, runner.calls) == (1, 0, 2)
    assert process_gone(int(hung_pid))  # a thread would still be stuck; the process is gone
    after = score(runner, "ok")  # workers=1: only possible because the hung worker was replaced
    assert after.error is None and after.value not in (0.0, hung_pid)


def test_runner_function_that_raises(user_module: str, make_runner: Callable[..., RewardRunner]) -> None:
    runner = make_runner(resolve_reward_fn(f"{user_module}:boom", "answer"))
    outcome = score(runner, "hello")
    assert outcome == RewardOutcome(0.0, "ValueError: boom on hello", timed_out=False)
    assert (runner.errors, runner.timeouts) == (1, 0)


def test_runner_says_why_calls_fail_in_the_log(user_module: str, make_runner: Callable[..., RewardRunner],
                                               capsys: pytest.CaptureFixture[str]) -> None:
    """A function that raises on every row scores 0.0 each time; the log must say why (the first calls, then every
    hundredth), or the user sees rewards of 0.0 and a count of errors with no reason."""
    runner = make_runner(resolve_reward_fn(f"{user_module}:boom", "answer"))
    for i in range(5):
        score(runner, f"c{i}")
    said = [line for line in capsys.readouterr().out.splitlines() if line.startswith("rlkit reward:")]
    assert said == [f"rlkit reward: the reward function {user_module}:boom failed on {i} of {i} calls so far, each "
                    f"scored 0.0; this one: ValueError: boom on c{i - 1}" for i in (1, 2, 3)]
    for failed in range(6, 201):  # the counting alone: 200 calls would take seconds of worker round trips
        runner.errors = runner.calls = failed
        runner._say_failed("more")
    later = capsys.readouterr().out
    assert [line.split(" failed on ")[1].split(" of ")[0] for line in later.splitlines()] == ["100", "200"], later


def test_runner_rejects_non_numbers(user_module: str, make_runner: Callable[..., RewardRunner]) -> None:
    text = make_runner(resolve_reward_fn(f"{user_module}:text", "answer"))
    outcome = score(text)
    assert outcome.value == 0.0 and not outcome.timed_out
    assert outcome.error is not None and "returned str 'abc', expected a float" in outcome.error
    nan = make_runner(resolve_reward_fn(f"{user_module}:not_a_number", "answer"))
    outcome = score(nan)
    assert outcome.value == 0.0 and outcome.error is not None and "returned nan" in outcome.error
    assert (text.errors, nan.errors, text.timeouts + nan.timeouts) == (1, 1, 0)


def test_runner_survives_a_worker_that_exits(user_module: str, make_runner: Callable[..., RewardRunner]) -> None:
    runner = make_runner(resolve_reward_fn(f"{user_module}:die", "answer"))
    outcome = score(runner, "die")
    assert outcome.value == 0.0 and outcome.error is not None and "exit code 3" in outcome.error
    assert score(runner, "live") == RewardOutcome(1.0)
    assert (runner.calls, runner.errors) == (2, 1)


def test_runner_math_builtin(make_runner: Callable[..., RewardRunner]) -> None:
    runner = make_runner(resolve_reward_fn("math", "solution"), timeout=10.0)
    assert score(runner, "so \\boxed{\\frac{1}{2}}", {"solution": "0.5"}) == RewardOutcome(1.0)
    assert score(runner, "so 3", {"solution": "0.5"}) == RewardOutcome(0.0)
    missing = score(runner, "so 3", {"answer": "3"})
    assert missing.value == 0.0 and missing.error is not None and "'solution'" in missing.error
    assert (runner.calls, runner.errors) == (3, 1)


def test_runner_close_kills_workers(user_module: str, make_runner: Callable[..., RewardRunner]) -> None:
    runner = make_runner(resolve_reward_fn(f"{user_module}:pid_or_hang", "answer"))
    pid = int(score(runner, "ok").value)
    runner.close()
    assert process_gone(pid)
    with pytest.raises(RuntimeError, match="after close"):
        score(runner)


def test_runner_close_ends_a_call_in_flight(user_module: str, make_runner: Callable[..., RewardRunner]) -> None:
    runner = make_runner(resolve_reward_fn(f"{user_module}:pid_or_hang", "answer"), timeout=30.0)
    assert score(runner, "ok").error is None  # the worker is up

    async def close_during_call() -> RewardOutcome:
        call = asyncio.create_task(runner.score("p", "hang", {}))
        await asyncio.sleep(0.3)
        runner.close()
        return await asyncio.wait_for(call, 10)

    started = time.monotonic()
    outcome = asyncio.run(close_during_call())
    assert outcome == RewardOutcome(0.0, "the runner was closed during the call")
    assert time.monotonic() - started < 5.0


def test_runner_rejects_bad_arguments() -> None:
    with pytest.raises(TypeError, match="cannot be pickled"):
        RewardRunner(lambda prompt, completion, row: 1.0, 1.0)
    with pytest.raises(ValueError, match="timeout must be positive"):
        RewardRunner(math_reward, 0)
    with pytest.raises(ValueError, match="workers"):
        RewardRunner(math_reward, 1.0, workers=0)


def test_a_reward_module_that_exits_as_it_is_imported_is_a_config_error(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A module calling sys.exit(7) at import made `rlkit render` exit 7 with no message."""
    from rlkit.import_path import import_callable

    (tmp_path / "exits_on_import.py").write_text("import sys\nsys.exit(7)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for spec in ("exits_on_import:score", f"{tmp_path / 'exits_on_import.py'}:score"):
        with pytest.raises(ConfigError, match="raised SystemExit: 7"):
            import_callable(spec, setting="reward.fn", form="module:function", files=True)
