"""A reward function that fails on every call for MAX_FAILING_STEPS steps in a row stops the trainer (StepError), with
real RewardRunner workers; one success in a step starts the count again; each function of a mix counts alone."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from rlkit.config.schema.auxiliary import AuxiliaryModelConfig
from rlkit.config.schema.experiment import ExperimentConfig, RewardConfig
from rlkit.errors import FatalStepError, StepError
from rlkit.jobs.grpo import rank0 as rank0_module
from rlkit.jobs.grpo.rank0 import Rank0
from rlkit.rewards.failing import MAX_FAILING_STEPS, FailingRewards
from rlkit.rewards.mix import RewardScorer, reward_scorer
from rlkit.rewards.runner import plain
from tests.helpers.user_modules import importable_module

MODULE = "rlkit_test_failing_rewards"
SOURCE = '''
import time


def missing_import(prompt, completion, row):
    import rlkit_no_such_judge_client  # noqa: F401
    return 1.0


def only_ok(prompt, completion, row):
    if completion != "ok":
        raise ValueError("solution\\x1b[31m\\nnot a column")
    return 1.0


def sleepy(prompt, completion, row):
    time.sleep(30)
    return 1.0
'''


@pytest.fixture
def module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    yield from importable_module(tmp_path, monkeypatch, MODULE, SOURCE)


def experiment(reward: RewardConfig, *, auxiliary: tuple[str, ...] = ()) -> ExperimentConfig:
    models = [AuxiliaryModelConfig(name=n, model_path="judge-model") for n in auxiliary]
    return ExperimentConfig(experiment_name="exp", trial_name="t1", type="grpo", allocation_mode="vllm:d1+fsdp:d1",
                            reward=reward, auxiliary_models=models)


def step(scorer: RewardScorer, *completions: str) -> None:
    """One step's rollouts: every completion scored (as the controller scores them) by the real worker processes."""
    async def all_of_them() -> None:
        await asyncio.gather(*(scorer.score("Q", c, {"answer": "12"}) for c in completions))

    asyncio.run(asyncio.wait_for(all_of_them(), 60))


@pytest.fixture
def closing() -> Iterator[list[RewardScorer]]:
    scorers: list[RewardScorer] = []
    yield scorers
    for scorer in scorers:
        scorer.close()


def watched(config: ExperimentConfig, closing: list[RewardScorer]) -> tuple[RewardScorer, FailingRewards]:
    scorer = reward_scorer(config.reward)
    closing.append(scorer)
    return scorer, FailingRewards(scorer, config)


def test_a_function_that_always_raises_stops_at_the_nth_step(module: str, closing: list[RewardScorer],
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    config = experiment(RewardConfig(fn=f"{module}:missing_import", num_workers=1), auxiliary=("judge",))
    scorer, failing = watched(config, closing)
    warnings = []
    for _ in range(1, MAX_FAILING_STEPS):
        step(scorer, "a", "b")
        failing.check()
        said = capsys.readouterr().out
        warnings.append([line for line in said.splitlines() if line.startswith("rlkit train: WARNING:")])
    assert [len(w) for w in warnings] == [1] + [0] * (MAX_FAILING_STEPS - 2)  # once, at the first failing step
    assert f"{module}:missing_import (reward.fn) failed on all 2 of its calls" in warnings[0][0]
    step(scorer, "a", "b")
    with pytest.raises(StepError) as raised:
        failing.check()
    message = str(raised.value)
    assert not isinstance(raised.value, FatalStepError)  # retried, as the NaN-gradient stop
    assert f"the reward function {module}:missing_import (reward.fn) failed on every call for " \
           f"{MAX_FAILING_STEPS} steps in a row ({2 * MAX_FAILING_STEPS} calls" in message
    assert "ModuleNotFoundError: No module named 'rlkit_no_such_judge_client'" in message
    assert f"that {module}:missing_import (reward.fn: module.path:function) imports" in message
    assert "auxiliary model (judge)" in message and "rlkit logs t1 --step aux-judge-0" in message


def test_one_success_after_n_minus_1_failing_steps_starts_the_count_again(module: str,
                                                                          closing: list[RewardScorer]) -> None:
    scorer, failing = watched(experiment(RewardConfig(fn=f"{module}:only_ok", num_workers=1)), closing)
    for _ in range(MAX_FAILING_STEPS - 1):
        step(scorer, "a", "b")
        failing.check()
    step(scorer, "a", "ok")  # one row scored: the function works
    failing.check()
    for _ in range(MAX_FAILING_STEPS - 1):
        step(scorer, "a", "b")
        failing.check()
    failing.check()  # a step without a call of it neither counts nor resets
    step(scorer, "a")
    with pytest.raises(StepError) as raised:
        failing.check()
    assert "ValueError: solution [31m not a column" in str(raised.value)  # the text, on one plain line
    assert "\x1b" not in str(raised.value) and "\n" not in str(raised.value)


def test_one_function_of_a_mix_failing_stops_and_is_named(module: str, closing: list[RewardScorer]) -> None:
    reward = RewardConfig(fns={"exact_match": 1.0, f"{module}:missing_import": 0.5}, num_workers=1)
    scorer, failing = watched(experiment(reward), closing)
    for _ in range(MAX_FAILING_STEPS - 1):
        step(scorer, r"\boxed{12}", "13")  # exact_match scores every row
        failing.check()
    step(scorer, "12")
    with pytest.raises(StepError) as raised:
        failing.check()
    assert f"the reward function {module}:missing_import (reward.fns) failed" in str(raised.value)
    assert "exact_match" not in str(raised.value)


def test_timeouts_count_as_failures(module: str, closing: list[RewardScorer]) -> None:
    scorer, failing = watched(experiment(RewardConfig(fn=f"{module}:sleepy", timeout=0.2, num_workers=1)), closing)
    for _ in range(MAX_FAILING_STEPS - 1):
        step(scorer, "a")
        failing.check()
    step(scorer, "a")
    with pytest.raises(StepError, match=r"took longer than 0.2 s \(reward.timeout\)"):
        failing.check()


def test_a_built_in_names_the_column_it_reads() -> None:
    runner = SimpleNamespace(succeeded=0, errors=0, timeouts=0, last_error="KeyError: 'solution'")
    failing = FailingRewards(runner, experiment(RewardConfig(fn="math", answer_key="solution")))  # type: ignore[arg-type]
    for n in range(1, MAX_FAILING_STEPS + 1):
        runner.errors = n
        if n < MAX_FAILING_STEPS:
            failing.check()
    with pytest.raises(StepError, match=r"the built-in math reads \(reward.answer_key='solution'\)"):
        failing.check()


def test_plain_cuts_and_flattens() -> None:
    assert plain("a\nb\x1b[0m\tc  d", 300) == "a b [0m c d"
    assert plain("x" * 1000, 20) == "x" * 17 + "..."


def test_rank0_stops_before_training_the_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rank0.next_batch (grpo, opmd, ppo and distill) checks after each batch: the StepError becomes rank 0's
    pending error, which abort raises, and the batch is not trained."""
    class Failing:
        checks = 0

        def check(self) -> None:
            self.checks += 1
            raise StepError("the reward function m:f (reward.fn) failed on every call")

    prepared: list[Any] = []
    monkeypatch.setattr(rank0_module, "prepare_batch", lambda *a, **k: prepared.append(a))
    stub = SimpleNamespace(config=experiment(RewardConfig()), version=0, failing=Failing(),
                           controller=SimpleNamespace(get_batch=lambda timeout: ([], None)))
    said = Rank0.next_batch(stub)  # type: ignore[arg-type]
    assert said == "trainer rank 0 failed: StepError: the reward function m:f (reward.fn) failed on every call"
    assert isinstance(stub._pending_error, StepError) and stub.failing.checks == 1 and not prepared
