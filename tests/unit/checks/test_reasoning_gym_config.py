"""reasoning-gym as a dataset source at submit: every mistake refused with its fix (unknown tasks with the nearest
names), exit 2 and nothing written through the real CLI; and the reward and metrics helpers of
rlkit.rewards.reasoning_gym on rows the job generates."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
from omegaconf import OmegaConf

from rlkit.checks.reasoning_gym import validate_reasoning_gym
from rlkit.config.problems import Problems
from rlkit.config.schema.experiment import ExperimentConfig
from rlkit.rewards.reasoning_gym import answer_tag_reward, task_metrics
from tests.conftest import CONFIGS, run_rlkit


def _problems(**fields: object) -> list[str]:
    """The problems validate_reasoning_gym finds in a default config with `fields` (dotted keys) set."""
    config = OmegaConf.structured(ExperimentConfig(experiment_name="e", trial_name="t", allocation_mode="vllm:d1"))
    for dotted, value in fields.items():
        OmegaConf.update(config, dotted.replace("__", "."), value, merge=False)
    problems = Problems()
    validate_reasoning_gym(OmegaConf.to_object(config), problems)  # type: ignore[arg-type]
    return [str(e) for e in problems.errors]  # the problem, then its fix


def test_a_valid_source_passes() -> None:
    assert _problems(train_dataset__path="reasoning-gym:chain_sum", reward__fn="reasoning_gym") == []
    assert _problems(train_dataset__path="reasoning-gym", valid_dataset__path="reasoning-gym",
                     reasoning_gym__tasks={"chain_sum": 2.0, "leg_counting": 1.0},
                     reasoning_gym__task_config={"chain_sum": {"min_terms": 2}}, reward__fn="reasoning_gym") == []


@pytest.mark.parametrize(("fields", "says"), [
    ({"train_dataset__path": "reasoning-gym:chain_summ"}, "'chain_summ' is not a reasoning-gym task\n  fix: did you "
                                                          "mean chain_sum"),
    ({"train_dataset__path": "reasoning-gym:qqqqqq"}, "choose among reasoning-gym 0.1.25's 105 tasks: ab, acre"),
    ({"train_dataset__path": "reasoning-gym:composite"}, "'composite' is reasoning-gym's mixer"),
    ({"train_dataset__path": "reasoning-gym"}, "reasoning-gym but reasoning_gym.tasks is empty"),
    ({"train_dataset__path": "reasoning-gym", "reasoning_gym__tasks": {"chain_sum": 0}}, "weight must be positive"),
    ({"train_dataset__path": "reasoning-gym:gcd", "reasoning_gym__tasks": {"lcm": 1}}, "names one task and"),
    ({"train_dataset__path": "reasoning-gym:gcd", "reasoning_gym__task_config": {"lcm": {}}},
     "'lcm' is not among the tasks trained on (gcd)"),
    ({"train_dataset__path": "reasoning-gym:gcd", "reasoning_gym__task_config": {"gcd": {"seed": 3}}},
     "sets seed, which the reasoning_gym section sets"),
    ({"train_dataset__path": "reasoning-gym:gcd", "reasoning_gym__system_prompt": "deepseek"},
     "system_prompt 'deepseek' is not one of"),
    ({"train_dataset__path": "reasoning-gym:gcd", "reasoning_gym__size": 2, "train_dataset__batch_size": 4},
     "reasoning_gym.size 2 is smaller than train_dataset.batch_size 4"),
    ({"train_dataset__path": "/data/x.jsonl", "reward__fn": "reasoning_gym"}, "scores rows generated from"),
    ({"reasoning_gym__tasks": {"gcd": 1}}, "no dataset path is reasoning-gym"),
    ({"train_dataset__path": "reasoning-gym:gcd", "valid_dataset__path": "reasoning-gym:gcd",
      "reasoning_gym__valid_seed": 2}, "valid_dataset would repeat training rows\n  fix: set reasoning_gym.valid_seed "
                                        "to at least 1003"),
])
def test_each_mistake_is_named_with_its_fix(fields: dict[str, object], says: str) -> None:
    found = _problems(**fields)
    assert any(says in p for p in found), found


def test_every_mistake_is_reported_at_once() -> None:
    found = _problems(train_dataset__path="reasoning-gym", reasoning_gym__tasks={"gcdd": 1, "lcm": -1},
                      reasoning_gym__system_prompt="x")
    assert len(found) == 3, found


def test_the_cli_refuses_an_unknown_task_with_exit_2_and_writes_nothing(tmp_path: Path) -> None:
    env = {**os.environ, "RLKIT_DEMO_DIR": str(tmp_path), "RLKIT_HOME": str(tmp_path / "home")}
    result = run_rlkit("submit", str(CONFIGS / "grpo-rgym-cpu-demo.yaml"), f"cluster.fileroot={tmp_path}/fileroot",
                       "reasoning_gym.tasks={chain_sum: 1, basic_arithmetc: 1}", env=env)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert "'basic_arithmetc' is not a reasoning-gym task" in result.stderr
    assert "did you mean basic_arithmetic" in result.stderr
    assert not (tmp_path / "fileroot").exists() and not (tmp_path / "home").exists()


def test_a_job_type_that_reads_files_only_names_the_source_it_cannot_take() -> None:
    from rlkit.checks.site_files import check_dataset_file
    from rlkit.errors import ConfigError

    with pytest.raises(ConfigError, match=r"generated only as the prompts of grpo, ppo, opmd and distill .* and "
                                          r"generate \(generate.dataset\)"):
        check_dataset_file("expert_dataset.path", "reasoning-gym:gcd")


def test_the_format_reward_credits_the_tag_and_progress_towards_it() -> None:
    assert answer_tag_reward("", "x <answer> 12 </answer>", {}) == 1.0
    assert answer_tag_reward("", "<answer> </answer>", {}) == 0.5  # the tag, but nothing in it
    assert answer_tag_reward("", "12 <ans", {}) == 0.5 * 4 / 8
    assert answer_tag_reward("", "12", {}) == 0.0


def test_task_metrics_read_the_tasks_own_score() -> None:
    def sample(reward: float, info: dict[str, float]) -> SimpleNamespace:
        return SimpleNamespace(reward=reward, info=info)

    own = "reward/reasoning_gym"  # the task's own term of a reward.fns mix
    scored = [({"task": "gcd"}, [sample(1.5, {own: 1.0}), sample(0.5, {own: 0.0})]),
              ({"task": "lcm"}, [sample(0.25, {}), sample(0.75, {})]),  # a single reward.fn: the sample's reward
              ({"prompt": "not generated"}, [sample(1.0, {})])]
    assert task_metrics(scored) == {"reward/task/gcd/mean": 0.5, "reward/task/lcm/mean": 0.5}
    assert task_metrics(scored[:1], prefix="eval") == {"eval/task/gcd/mean": 0.5}  # the evaluator's


def test_the_reward_runs_in_the_reward_workers_on_generated_rows() -> None:
    """Train and valid rows from their two seeds; the built-in scored in real worker processes, as in the job."""
    pytest.importorskip("reasoning_gym")
    from rlkit.config.schema.experiment import RewardConfig
    from rlkit.config.schema.reasoning_gym import ReasoningGymConfig
    from rlkit.rewards.mix import reward_scorer
    from rlkit.tasks.reasoning_gym import generate_rows

    section = ReasoningGymConfig(tasks={"gcd": 1.0, "lcm": 1.0}, size=6, valid_size=6)
    train = generate_rows(section, "reasoning-gym", valid=False)
    valid = generate_rows(section, "reasoning-gym", valid=True)
    assert {r["task"] for r in train} <= {"gcd", "lcm"} and len(train) == len(valid) == 6
    assert not {r["question"] for r in train} & {r["question"] for r in valid}  # another seed: held-out rows
    runner = reward_scorer(RewardConfig(fn="reasoning_gym", timeout=30))
    try:
        async def score_all() -> list[float]:
            outcomes = await asyncio.gather(*(runner.score("", f"<answer>{r['answer']}</answer>", r) for r in train),
                                            runner.score("", "<answer>x</answer>", train[0]))
            assert all(o.error is None for o in outcomes), outcomes
            return [o.value for o in outcomes]

        assert asyncio.run(asyncio.wait_for(score_all(), 120)) == [1.0] * 6 + [0.0]
    finally:
        runner.close()
