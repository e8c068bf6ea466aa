"""reward.fns: the weighted sum, each function's value and counts, a timeout in one function only."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from rlkit.config.schema.experiment import RewardConfig
from rlkit.errors import ConfigError
from rlkit.rewards.mix import RewardMix, part_means, reward_scorer, term_name, term_names
from rlkit.rewards.runner import RewardOutcome, RewardRunner
from tests.helpers.user_modules import importable_module

MODULE = "rlkit_test_mix_rewards"
SOURCE = '''
import os
import time


def length(prompt, completion, row):
    return float(len(completion))


def slow(prompt, completion, row):
    if completion == "slow":
        time.sleep(30)
    return 2.0


def worker_pid(prompt, completion, row):
    time.sleep(0.2)  # calls overlap: each busy worker makes the next call wait or start another
    return float(os.getpid())
'''


@pytest.fixture
def module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    yield from importable_module(tmp_path, monkeypatch, MODULE, SOURCE)


def score(mix: RewardMix, completion: str) -> RewardOutcome:
    return asyncio.run(asyncio.wait_for(mix.score("Q", completion, {"answer": "12"}), 60))


def test_names_of_the_functions() -> None:
    assert term_name("exact_match") == "exact_match"
    assert term_name("pkg.mod:fmt_reward") == "fmt_reward"
    assert term_names(RewardConfig(fns={"math": 1.0, "a.b:length": 0.5})) == ["math", "length"]
    with pytest.raises(ConfigError, match="share the metric name"):
        term_names(RewardConfig(fns={"a:length": 1.0, "b:length": 1.0}))


def test_single_fn_stays_a_runner() -> None:
    runner = reward_scorer(RewardConfig(fn="exact_match"))
    try:
        assert isinstance(runner, RewardRunner)
    finally:
        runner.close()


def test_weighted_sum_parts_counts_and_a_timeout_in_one_function(module: str) -> None:
    reward = RewardConfig(fns={"exact_match": 0.7, f"{module}:length": 0.1, f"{module}:slow": 1.0},
                          timeouts={f"{module}:slow": 1.0}, timeout=20.0)
    mix = reward_scorer(reward)
    assert isinstance(mix, RewardMix)
    try:
        hit = score(mix, "12")  # exact 1, length 2, slow 2: 0.7 + 0.2 + 2.0
        assert hit.error is None and not hit.timed_out
        assert hit.value == pytest.approx(2.9)
        assert dict(hit.parts) == {"exact_match": 1.0, "length": 2.0, "slow": 2.0}
        slow = score(mix, "slow")  # exact 0, length 4, slow times out (its own 1 s limit, not reward.timeout 20 s)
        assert slow.timed_out and slow.error is not None and slow.error.startswith("slow: ")
        assert slow.value == pytest.approx(0.4)  # the other functions still count
        assert dict(slow.parts) == {"exact_match": 0.0, "length": 4.0, "slow": 0.0}
        counts = mix.step_counts()
        assert counts["reward/fn/slow/timeouts"] == 1 and counts["reward/fn/length/timeouts"] == 0
        assert counts["reward/fn/exact_match/errors"] == 0
        assert mix.step_counts()["reward/fn/slow/timeouts"] == 0  # per step: since the last call
        infos = [{f"reward/{k}": v for k, v in o.parts} for o in (hit, slow)]
        means = part_means(infos, term_names(reward))
        assert means == {"reward/fn/exact_match/mean": 0.5, "reward/fn/length/mean": 3.0, "reward/fn/slow/mean": 1.0}
        # the mean of the weighted sums is the weighted sum of the functions' means
        assert (hit.value + slow.value) / 2 == pytest.approx(0.7 * 0.5 + 0.1 * 3.0 + 1.0 * 1.0)
    finally:
        mix.close()


def test_a_timeout_for_a_function_not_in_the_mix_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"reward\.timeouts names math"):
        RewardMix(RewardConfig(fns={"exact_match": 1.0}, timeouts={"math": 3.0}))


@pytest.mark.parametrize("workers", [1, 2])
def test_num_workers_bounds_the_processes_of_each_function(module: str, workers: int) -> None:
    """reward.num_workers: six overlapping calls of each function of a mix run in at most that many processes
    (the function returns its worker's pid), and in exactly that many when the calls overlap."""
    reward = RewardConfig(fns={f"{module}:worker_pid": 1.0, f"{module}:length": 0.0}, num_workers=workers)
    mix = reward_scorer(reward)
    assert isinstance(mix, RewardMix)

    async def six() -> list[RewardOutcome]:
        return list(await asyncio.gather(*(mix.score("Q", "x", {}) for _ in range(6))))

    try:
        outcomes = asyncio.run(asyncio.wait_for(six(), 120))
        assert all(o.error is None for o in outcomes), [o.error for o in outcomes]
        assert len({dict(o.parts)["worker_pid"] for o in outcomes}) == workers
        assert all(term.runner.workers == workers for term in mix.terms)
    finally:
        mix.close()
    single = reward_scorer(RewardConfig(fn="exact_match", num_workers=workers))
    try:
        assert isinstance(single, RewardRunner) and single.workers == workers
    finally:
        single.close()
