"""Evaluation during training: when it is due (rlkit.trainer.evaluator.EvalSchedule), its sampling, its submit-time
checks (rlkit.checks.evaluation), how one evaluation counts completions of one version, and `rlkit status`."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import math
import time
from pathlib import Path
from typing import Any

import pytest

from rlkit.checks.evaluation import validate_evaluator
from rlkit.cli.status import _last_eval
from rlkit.config.load import config_from_mapping
from rlkit.config.problems import Problems
from rlkit.config.ranges import check_ranges
from rlkit.config.schema.evaluation import EvaluatorConfig
from rlkit.config.schema.experiment import ExperimentConfig
from rlkit.rewards.runner import RewardOutcome
from rlkit.rollout.groups import GroupSampler, Prompt, SampledGroup, SingleTurnGroups
from rlkit.servers.backend import Completion, SamplingParams, Server
from rlkit.servers.sampling import sampling_params
from rlkit.trainer.evaluator import EvalOutcome, EvalSchedule, Evaluator, eval_sampling


def _config(tmp_path: Path, *overrides: str, row: dict[str, Any] | None = None) -> ExperimentConfig:
    valid = tmp_path / "valid.jsonl"
    valid.write_text(json.dumps(row if row is not None else {"prompt": "Q: 1+2= A:", "answer": "3"}) + "\n")
    data = {"experiment_name": "e", "trial_name": "t", "type": "grpo", "allocation_mode": "vllm:d1+fsdp:d1",
            "gconfig": {"n_samples": 4, "max_new_tokens": 8, "temperature": 1.0, "stop": ["\n"]},
            "valid_dataset": {"path": str(valid)}, "evaluator": {"freq_steps": 5}}
    return config_from_mapping(data, list(overrides))


def _problems(config: ExperimentConfig) -> list[str]:
    problems = Problems()
    check_ranges(config, problems)  # what rlkit.checks.experiment runs before every job type's checks
    validate_evaluator(config, problems)
    return [str(e) for e in problems.errors]


# --- when an evaluation starts ---------------------------------------------------------------------------------

def _starts(schedule: EvalSchedule, steps: range, *, running_at: set[int] = frozenset(), last: int = 0,  # type: ignore[assignment]
            epoch_every: int = 1000, seconds_per_step: float = 1.0) -> list[int]:
    return [s for s in steps if schedule.should_start(s, s // epoch_every, s * seconds_per_step,
                                                      running=s in running_at, last=s == last)]


def test_freq_steps_starts_every_n_steps_and_after_the_last() -> None:
    schedule = EvalSchedule(EvaluatorConfig(freq_steps=5), now=0.0)
    assert _starts(schedule, range(1, 13), last=12) == [5, 10, 12]


def test_a_due_evaluation_waits_for_the_running_one_then_starts() -> None:
    schedule = EvalSchedule(EvaluatorConfig(freq_steps=5), now=0.0)
    assert _starts(schedule, range(1, 16), running_at={5, 6, 7}) == [8, 10, 15]


def test_no_trigger_evaluates_only_after_the_last_step() -> None:
    schedule = EvalSchedule(EvaluatorConfig(), now=0.0)
    assert _starts(schedule, range(1, 9), last=8) == [8]


def test_freq_epochs_and_freq_secs_use_the_savers_rules() -> None:
    by_epoch = EvalSchedule(EvaluatorConfig(freq_epochs=2), now=0.0)
    assert _starts(by_epoch, range(1, 13), epoch_every=3) == [6, 12]  # epochs 2 and 4 end at steps 6 and 12
    by_time = EvalSchedule(EvaluatorConfig(freq_secs=10), now=0.0)
    assert _starts(by_time, range(1, 31), seconds_per_step=4.0) == [3, 6, 9, 12, 15, 18, 21, 24, 27, 30]


# --- sampling ---------------------------------------------------------------------------------------------------

def test_eval_gconfig_fields_left_unset_take_gconfigs(tmp_path: Path) -> None:
    inherited = eval_sampling(_config(tmp_path))
    assert inherited == SamplingParams(n=4, max_new_tokens=8, temperature=1.0, top_p=1.0, top_k=-1, stop=["\n"])
    greedy = eval_sampling(_config(tmp_path, "eval_gconfig.temperature=0", "eval_gconfig.n_samples=1",
                                   "eval_gconfig.stop=[]"))
    assert (greedy.temperature, greedy.n, greedy.stop, greedy.max_new_tokens) == (0.0, 1, [], 8)


# --- submit-time checks -----------------------------------------------------------------------------------------

def test_a_valid_evaluator_config_has_no_problem(tmp_path: Path) -> None:
    assert _problems(_config(tmp_path, "eval_gconfig.temperature=0")) == []


@pytest.mark.parametrize(("overrides", "row", "expected"), [
    (["valid_dataset.path=''"], None, "valid_dataset.path is empty"),
    (["evaluator.freq_steps=null"], None, "the evaluator never runs"),
    (["eval_gconfig.n_samples=0"], None, "eval_gconfig.n_samples must be at least 1"),
    (["evaluator.max_prompts=0"], None, "evaluator.max_prompts must be at least 1"),
    (["eval_gconfig.temperature=-1"], None, "eval_gconfig.temperature must be at least 0 or null"),
    (["reward.fn=math"], {"prompt": "Q: 1+2= A:"}, "answer column 'answer'"),
    (["reward.fns={none: 0.5, exact_match: 0.5}"], {"prompt": "Q: 1+2= A:"}, "exact_match scores evaluations"),
    ([], {"query": "Q: 1+2= A:", "answer": "3"}, "rows have no column 'prompt'"),  # {question, answer}: GSM8K's
    (["valid_dataset.path=/nonexistent/valid.jsonl"], None, "does not exist"),
])
def test_bad_evaluator_configs_are_refused_naming_the_field(tmp_path: Path, overrides: list[str],
                                                            row: dict[str, Any] | None, expected: str) -> None:
    problems = _problems(_config(tmp_path, *overrides, row=row))
    assert any(expected in p for p in problems), problems


def test_every_evaluator_problem_is_collected_at_once(tmp_path: Path) -> None:
    problems = _problems(_config(tmp_path, "evaluator.freq_secs=0", "eval_gconfig.n_samples=0",
                                 "eval_gconfig.top_p=2", "reward.fn=exact_match", row={"prompt": "x"}))
    assert len(problems) == 4, problems


def test_ppo_takes_grpos_evaluator_sections_and_checks() -> None:
    """Job type ppo runs GRPO's evaluator (rlkit.jobs.ppo.algorithm subclasses rlkit.jobs.grpo.algorithm): its sections
    are accepted and checked the same way."""
    from rlkit.jobs import job_type_for

    grpo, ppo = job_type_for("grpo"), job_type_for("ppo")
    assert {"valid_dataset", "evaluator", "eval_gconfig"} <= set(ppo.sections) & set(grpo.sections)
    config = config_from_mapping({"experiment_name": "e", "trial_name": "t", "type": "ppo",
                                  "allocation_mode": "vllm:d1+fsdp:d1"},
                                 ["evaluator.freq_steps=0", "eval_gconfig.n_samples=0"])
    problems = Problems()
    check_ranges(config, problems)
    ppo.validate(config, None, problems)
    found = [str(e) for e in problems.errors]
    for expected in ("evaluator.freq_steps must be at least 1", "eval_gconfig.n_samples must be at least 1"):
        assert any(expected in m for m in found), found


# --- one evaluation ---------------------------------------------------------------------------------------------

class _Servers:
    """The rollout controller's two calls an evaluation makes, over a stand-in pool whose completions echo the
    prompt; a weight update begins during prompt `racing`."""

    def __init__(self, racing: int) -> None:
        self.version, self.updates, self.racing = 3, 0, racing

    async def settled_version(self) -> tuple[int, int]:
        return self.version, self.updates

    async def complete(self, prompt_ids: list[int], params: SamplingParams,
                       prefer: int | None = None) -> tuple[Server, list[Completion]]:
        completions = [Completion(str(prompt_ids[0]), prompt_ids, [0.0], "stop") for _ in range(params.n)]
        return Server(index=0, address="a:1", model="/m", backend="vllm"), completions

    async def sample_at_one_version(self, sampler: GroupSampler, prompt: Prompt, seq: int
                                    ) -> tuple[SampledGroup, int, bool]:
        async def settled() -> int:
            return self.version

        sampled = await sampler.sample(self, prompt, self.version, seq, settled)  # type: ignore[arg-type]
        return sampled, self.version, prompt.ids[0] != self.racing


class _Reward:
    async def score(self, prompt: str, completion: str, row: dict[str, Any]) -> RewardOutcome:
        return RewardOutcome(float(row.get("value", 0)))


def _training_sampler(config: ExperimentConfig) -> SingleTurnGroups:
    """The single-turn rollout's sampler, as rank 0 builds it; the evaluator samples with its for_params."""
    return SingleTurnGroups(sampling_params(config), _Reward(), str, config.seed)  # type: ignore[arg-type]


def test_an_evaluation_scores_completions_of_its_version_only(tmp_path: Path) -> None:
    prompts = [Prompt(i, {"value": i % 2}, f"p{i}", [i]) for i in range(6)]
    config = _config(tmp_path, "evaluator.max_prompts=4")
    evaluator = Evaluator(config, prompts, _Servers(racing=1), _training_sampler(config))  # type: ignore[arg-type]
    outcome = asyncio.run(evaluator._evaluate())
    # prompts 0..3 (max_prompts), 4 samples each; prompt 1's completions overlapped an update
    assert (outcome.version, len(outcome.rewards), outcome.mismatched) == (3, 12, 4)
    assert outcome.reward == pytest.approx(4 / 12)
    metrics = outcome.metrics()
    assert (metrics["eval/n"], metrics["eval/version"], metrics["eval/version_mismatches"]) == (12, 3, 4)


def test_status_shows_the_last_evaluation() -> None:
    assert _last_eval({"eval_reward": 0.9375, "eval_version": 25}) == "reward 0.938 at weight version 25"
    assert _last_eval({"step": 3}) == ""
    assert _last_eval({"eval_reward": None, "eval_version": 4}).startswith("reward none")
    assert math.isnan(EvalOutcome(version=2).reward)


class _Submitted:
    """The controller's `submit`: keeps each evaluation's future for the test to finish (nothing runs)."""

    def __init__(self) -> None:
        self.futures: list[concurrent.futures.Future[EvalOutcome]] = []

    def submit(self, coro: Any) -> concurrent.futures.Future[EvalOutcome]:
        coro.close()
        self.futures.append(concurrent.futures.Future())
        return self.futures[-1]


def test_results_reach_the_step_that_sees_them_and_a_push_waits_for_the_running_one(tmp_path: Path) -> None:
    servers = _Submitted()
    config = _config(tmp_path, "rollout.request_timeout=0.2")
    evaluator = Evaluator(config, [Prompt(0, {}, "p", [0])], servers, _training_sampler(config))  # type: ignore[arg-type]
    assert evaluator.after_step(4, 0, last=False) == {} and servers.futures == []
    assert evaluator.after_step(5, 0, last=False) == {} and len(servers.futures) == 1  # started, not waited for
    assert evaluator.after_step(6, 0, last=False) == {}  # still running: nothing to log, nothing new
    assert evaluator.wait_before_push() >= 0.2  # bounded by rollout.request_timeout, then the push goes on
    servers.futures[0].set_result(EvalOutcome(version=5, rewards=[1.0, 0.0]))
    assert evaluator.wait_before_push() < 0.2
    assert evaluator.after_step(7, 0, last=False)["eval/version"] == 5
    assert evaluator.progress() == {"eval_reward": 0.5, "eval_version": 5}
    assert len(servers.futures) == 1  # the evaluation due at step 10 has not come yet


def test_the_last_step_waits_for_the_final_evaluation(tmp_path: Path) -> None:
    servers = _Submitted()
    config = _config(tmp_path, "rollout.request_timeout=0.2", "evaluator.freq_steps=null",
                     "evaluator.eval_on_startup=true")
    evaluator = Evaluator(config, [Prompt(0, {}, "p", [0])], servers, _training_sampler(config))  # type: ignore[arg-type]
    evaluator.start()  # eval_on_startup
    servers.futures[0].set_result(EvalOutcome(version=0, rewards=[0.0]))
    # the final evaluation never finishes here: the last step gives up after request_timeout, logging the older one
    assert evaluator.after_step(3, 0, last=True)["eval/version"] == 0
    assert len(servers.futures) == 2 and servers.futures[1].cancelled()


def test_the_last_step_may_wait_for_two_evaluations(tmp_path: Path) -> None:
    """An evaluation still running at the last step (the push's wait gave up on it) is waited for once more, then
    the final weights' evaluation: two eval_wait_bound waits in one after_step, which rank0_wait_bound counts."""
    servers = _Submitted()
    config = _config(tmp_path, "rollout.request_timeout=0.2", "evaluator.freq_steps=null",
                     "evaluator.eval_on_startup=true")
    evaluator = Evaluator(config, [Prompt(0, {}, "p", [0])], servers, _training_sampler(config))  # type: ignore[arg-type]
    evaluator.start()  # never finishes here, nor does the final one
    started = time.monotonic()
    evaluator.after_step(3, 0, last=True)
    assert time.monotonic() - started >= 2 * 0.2
    assert len(servers.futures) == 2 and all(f.cancelled() for f in servers.futures)
