"""Every number of the schema with a declared range (rlkit.config.schema.fields._f(..., ge=, gt=, le=, lt=)) is
checked in one place (rlkit.config.ranges): a value outside is refused naming the field, the range and a fix whose
value the same check accepts; a value inside, and null where the field takes it, pass."""

from __future__ import annotations

import math
import re
from typing import Any

import pytest

from rlkit.config.load import config_from_mapping
from rlkit.config.problems import Problems
from rlkit.config.ranges import check_ranges, describe, ranged_fields
from rlkit.config.schema.experiment import get_field, set_field
from rlkit.config.schema.fields import Range

BASE = {"experiment_name": "e", "trial_name": "t", "type": "grpo", "allocation_mode": "vllm:d1+fsdp:d1",
        "auxiliary_models": [{"name": "judge", "model_path": "/m"}]}


def _config() -> Any:
    return config_from_mapping(BASE)


def _outside(rng: Range, whole: bool) -> float:
    """A value just outside the range: below the lower bound, else above the upper one."""
    step = 1 if whole else 0.5
    if rng.ge is not None:
        return rng.ge - step
    if rng.gt is not None:
        return rng.gt if whole else rng.gt - step
    upper = rng.le if rng.le is not None else rng.lt
    assert upper is not None
    return upper + step


FIELDS = list(ranged_fields(_config()))


def test_the_schema_declares_ranges_where_users_set_numbers() -> None:
    paths = {f.path for f in FIELDS}
    for path in ("rollout.request_timeout", "actor.optimizer.lr", "critic.optimizer.lr", "gconfig.n_samples",
                 "actor.discount", "vllm.gpu_memory_utilization", "auxiliary_models[0].engine_num",
                 "recover.keep_last", "eval_gconfig.top_p"):
        assert path in paths
    assert len(FIELDS) > 60


def test_the_defaults_are_in_range() -> None:
    problems = Problems()
    check_ranges(_config(), problems)
    assert problems.ok(), [str(e) for e in problems.errors]


@pytest.mark.parametrize("field", FIELDS, ids=[f.path for f in FIELDS])
def test_a_value_outside_is_refused_with_a_fix_that_is_accepted(field: Any) -> None:
    config = _config()
    bad = _outside(field.range, field.whole)
    set_field(config, field.path, int(bad) if field.whole else bad)
    problems = Problems()
    check_ranges(config, problems)
    assert len(problems.errors) == 1, [str(e) for e in problems.errors]
    error = problems.errors[0]
    assert str(error).startswith(f"{field.path} must be {describe(field.range)}")
    assert f"(got {int(bad) if field.whole else bad})" in str(error)
    fixed = re.match(rf"e\.g\. {re.escape(field.path)}=(\S+?)(,|$)", error.hint or "")
    assert fixed is not None, error.hint
    value = float(fixed[1])
    set_field(config, field.path, int(value) if field.whole else value)
    again = Problems()
    check_ranges(config, again)
    assert again.ok(), [str(e) for e in again.errors]
    if field.nullable:
        assert f"{field.path}=null" in (error.hint or "")
        set_field(config, field.path, None)
        check_ranges(config, nulled := Problems())
        assert nulled.ok()


def test_nan_is_never_in_range() -> None:
    config = _config()
    config.rollout.request_timeout = math.nan
    problems = Problems()
    check_ranges(config, problems)
    assert [str(e) for e in problems.errors] == ["rollout.request_timeout must be positive (got nan)\n"
                                                 "  fix: e.g. rollout.request_timeout=3600"]


@pytest.mark.parametrize(("rng", "words"), [
    (Range(gt=0), "positive"), (Range(ge=1), "at least 1"), (Range(gt=1), "greater than 1"),
    (Range(ge=0, le=1), "between 0 and 1"), (Range(gt=0, le=1), "in (0, 1]"), (Range(ge=0, lt=0.5), "in [0, 0.5)"),
    (Range(le=3), "at most 3"),
])
def test_ranges_read_as_a_user_writes_them(rng: Range, words: str) -> None:
    assert describe(rng) == words


def test_submit_names_every_number_out_of_range_at_once(tmp_path: Any) -> None:
    """Through the whole check (rlkit.jobs.validate.validate): each field once, with its own fix; a fix line
    never proposes a value its own range refuses (gconfig.n_samples=0 once drew `set actor.group_size=0`)."""
    from rlkit.jobs.validate import validate

    config = config_from_mapping({**BASE, "cluster": {"fileroot": str(tmp_path)}},
                                 ["rollout.request_timeout=-5", "gconfig.n_samples=0", "actor.kl_ctl=-1"])
    text = "\n".join(str(e) for e in validate(config).problems.errors)
    for says in ("rollout.request_timeout must be positive (got -5.0)", "gconfig.n_samples must be at least 1 (got 0)",
                 "actor.kl_ctl must be at least 0 (got -1.0)"):
        assert text.count(says) == 1, text
    assert "actor.group_size=0" not in text


@pytest.mark.parametrize(("overrides", "says"), [
    (["launcher.slurm.container_type=none", "launcher.slurm.mount=/data:/data"],
     "launcher.slurm.mount is set, but launcher.slurm.container_type is none"),
    (["launcher.slurm.container_type=none", "launcher.slurm.trainer_image=/i.sif"],
     "launcher.slurm.trainer_image is set, but launcher.slurm.container_type is none"),
    (["rollout.agent.workflow=tool_use", "rollout.agent.code_tool.memory_mb=1024"],
     "rollout.agent.code_tool.memory_mb is set, but rollout.agent.code_tool.enabled is false"),
    (["rollout.agent.code_tool.enabled=true"], "rollout.agent.code_tool.enabled is set but rollout.agent.workflow is "
                                               "empty"),
])
def test_a_field_that_would_be_ignored_is_refused(tmp_path: Any, overrides: list[str], says: str) -> None:
    """docs/guides/validation.md's promise: a field rlkit would ignore under another setting is refused, not
    silently dropped."""
    from rlkit.jobs.validate import validate

    config = config_from_mapping({**BASE, "cluster": {"fileroot": str(tmp_path)}}, overrides)
    problems = [str(e) for e in validate(config).problems.errors]
    assert sum(says in p for p in problems) == 1, problems
    assert any("would be ignored" in p or "run no code" in p for p in problems)


def test_stop_strings_may_hold_a_newline_where_no_other_string_may() -> None:
    """Stop strings only travel in request bodies (gconfig.stop, eval_gconfig.stop alike); every other string
    reaches a script, an argv or a file name (rlkit.config.strings)."""
    from rlkit.config.strings import check_strings

    config = _config()
    config.gconfig.stop = ["\n\n"]
    config.eval_gconfig.stop = ["\n"]
    problems = Problems()
    check_strings(config, problems)
    assert problems.ok(), [str(e) for e in problems.errors]
    config.launcher.slurm.qos = "a\nb"
    check_strings(config, problems)
    assert [str(e).split(" holds")[0] for e in problems.errors] == ["launcher.slurm.qos"]


def test_every_number_is_finite_and_fits_64_bits_ranged_or_not() -> None:
    """An infinite learning rate or 2**70 of anything is a typo that failed in the job; a NaN or an infinity a range
    refuses is named once, by its range."""
    config = _config()
    config.actor.optimizer.lr = math.inf  # a range with no upper bound: inf holds it
    config.gconfig.top_k = 2**70  # no declared range
    config.rollout.request_timeout = math.nan  # ranged: its range names it
    problems = Problems()
    check_ranges(config, problems)
    assert sorted(str(e).splitlines()[0] for e in problems.errors) == [
        "actor.optimizer.lr must be a finite number (got inf)",
        "gconfig.top_k is too large (got 1180591620717411303424)", "rollout.request_timeout must be positive (got nan)"]


SEEDS = ("seed", "vllm.seed", "sglang.random_seed", "reasoning_gym.seed", "reasoning_gym.valid_seed")


@pytest.mark.parametrize("path", SEEDS)
@pytest.mark.parametrize("bad", [-1, 2**32])
def test_a_seed_is_what_numpy_accepts(path: str, bad: int) -> None:
    """numpy's np.random.seed (which vLLM and SGLang call with their seed at start) takes 0 .. 2**32-1 only, and
    default_rng no negative seed: a seed outside failed the servers' start in the job; the range refuses it."""
    config = _config()
    set_field(config, path, bad)
    problems = Problems()
    check_ranges(config, problems)
    assert [str(e) for e in problems.errors] == [f"{path} must be between 0 and 4294967295 (got {bad})\n"
                                                 f"  fix: e.g. {path}={get_field(_config(), path)}"]
    set_field(config, path, 2**32 - 1)
    check_ranges(config, edge := Problems())
    assert edge.ok(), [str(e) for e in edge.errors]


def test_the_numbers_of_a_name_to_number_mapping_are_finite_too() -> None:
    """reward.fns' weights and reward.timeouts' seconds are numbers of the schema ({name: number}): a NaN weight made
    every reward NaN in the job. A negative weight is a penalty (TRL's reward_weights take one too): accepted. A
    mapping passed on as given (vllm.extra_args) is its tool's to judge."""
    config = _config()
    config.reward.fns = {"math": math.nan, "exact_match": -1.0}
    config.reward.timeouts = {"math": math.inf}
    config.vllm.extra_args = {"some_flag": math.nan}
    problems = Problems()
    check_ranges(config, problems)
    assert [str(e) for e in problems.errors] == [
        "reward.fns['math'] must be a finite number (got nan)\n  fix: give reward.fns['math'] a finite value",
        "reward.timeouts['math'] must be a finite number (got inf)\n  fix: give reward.timeouts['math'] a finite value"]


def test_a_nan_task_weight_is_named_once(tmp_path: Any) -> None:
    from rlkit.jobs.validate import validate

    config = config_from_mapping({**BASE, "cluster": {"fileroot": str(tmp_path)}},
                                 ["train_dataset.path=reasoning-gym", "reward.fn=reasoning_gym",
                                  "reasoning_gym.tasks={basic_arithmetic: nan, leg_counting: -1}"])
    text = "\n".join(str(e) for e in validate(config).problems.errors)
    assert text.count("reasoning_gym.tasks['basic_arithmetic']") == 2, text  # the message and its fix line
    assert "reasoning_gym.tasks['basic_arithmetic'] must be a finite number (got nan)" in text
    assert "reasoning_gym.tasks['leg_counting'] has weight -1.0: a task's weight must be positive" in text


def test_a_reward_mix_whose_every_weight_is_zero_is_refused(tmp_path: Any) -> None:
    """Every reward 0: nothing to learn from, found only after a whole job. One non-zero weight is enough."""
    from rlkit.jobs.validate import validate

    def errors(fns: str, *more: str) -> str:
        config = config_from_mapping({**BASE, "cluster": {"fileroot": str(tmp_path)}},
                                     ["train_dataset.path=reasoning-gym", "reasoning_gym.tasks={leg_counting: 1}",
                                      f"reward.fns={fns}", *more])
        return "\n".join(str(e) for e in validate(config).problems.errors)

    refused = errors("{reasoning_gym: 0, exact_match: 0}")
    assert "every weight of reward.fns is 0 (reasoning_gym, exact_match)" in refused
    assert "every weight of reward.fns" not in errors("{reasoning_gym: 1, exact_match: 0}")
    # the length penalty still tells completions apart; distillation (rewards only logged at rl_coef 0) teaches
    assert "every weight of reward.fns" not in errors("{reasoning_gym: 0}", "actor.overlong_reward_penalty=true")
    assert "every weight of reward.fns" not in errors("{reasoning_gym: 0}", "type=distill")
