"""gconfig.greedy and eval_gconfig.greedy (AReaL's key, an rlkit field): greedy decoding sends temperature 0 (top_p
and top_k neutral) whatever the temperature says, the same way for generate, the GRPO/PPO rollouts and the
evaluator (rlkit.servers.sampling); the submit-time checks (rlkit.checks.sampling) refuse it for the
rollouts a trainer learns from and take it for generate and the evaluation."""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import Any

import pytest

from rlkit.checks.sampling import GREEDY_FIX, validate_eval_greedy, validate_greedy
from rlkit.config.areal.accept import AcceptedKey
from rlkit.config.areal.keys import TABLES
from rlkit.config.load import compose, config_from_mapping, typed_config
from rlkit.config.problems import Problems
from rlkit.config.schema.experiment import ExperimentConfig
from rlkit.errors import ConfigError, ConfigErrors
from rlkit.jobs import REGISTRY
from rlkit.jobs.generate import step as generate
from rlkit.jobs.grpo import rank0 as grpo_rank0
from rlkit.jobs.validate import validate
from rlkit.servers.backend import SamplingParams
from rlkit.servers.sampling import sampling_params
from rlkit.trainer.evaluator import eval_sampling
from tests.unit.servers.test_min_new_tokens import _bodies

GENERATE = {"experiment_name": "e", "trial_name": "t", "type": "generate", "allocation_mode": "vllm:d1",
            "gconfig": {"n_samples": 1, "max_new_tokens": 16, "temperature": 0.8, "top_p": 0.9, "top_k": 20}}
GRPO = {"experiment_name": "e", "trial_name": "t", "type": "grpo", "allocation_mode": "vllm:d1+fsdp:d1",
        "gconfig": {"n_samples": 4, "max_new_tokens": 16, "temperature": 0.8, "top_p": 0.9, "top_k": 20}}
GREEDY = (0.0, 1.0, -1)


def _config(data: dict[str, Any], *overrides: str) -> ExperimentConfig:
    return config_from_mapping(json.loads(json.dumps(data)), list(overrides))


def _sampling(params: SamplingParams) -> tuple[float, float, int]:
    return params.temperature, params.top_p, params.top_k


def _problems(config: ExperimentConfig, *, trains_on_rollouts: bool) -> list[tuple[str, str | None]]:
    problems = Problems()
    validate_greedy(config, problems, trains_on_rollouts=trains_on_rollouts)
    validate_eval_greedy(config, problems)
    return [(str(e).splitlines()[0], e.hint) for e in problems.errors]


# --- request settings -------------------------------------------------------------------------------------------

def test_greedy_generate_requests_go_at_temperature_0_whatever_the_temperature_says() -> None:
    config = _config(GENERATE, "gconfig.greedy=true")
    params = generate.sampling_params(config)
    assert _sampling(params) == GREEDY
    assert (params.n, params.max_new_tokens) == (1, 16), "the other settings are kept"
    assert _sampling(generate.sampling_params(_config(GENERATE))) == (0.8, 0.9, 20), "off: as given"
    assert _config(GENERATE).gconfig.greedy is False, "off by default"


def test_the_evaluation_inherits_greedy_and_may_set_its_own() -> None:
    assert _sampling(eval_sampling(_config(GRPO))) == (0.8, 0.9, 20)
    own = _config(GRPO, "eval_gconfig.greedy=true", "eval_gconfig.n_samples=1", "eval_gconfig.temperature=1.2")
    assert _sampling(eval_sampling(own)) == GREEDY and eval_sampling(own).n == 1
    assert _sampling(sampling_params(own)) == (0.8, 0.9, 20), "the rollouts still sample"
    inherited = _config(GENERATE, "gconfig.greedy=true")  # None: gconfig's
    assert inherited.eval_gconfig.greedy is None and _sampling(eval_sampling(inherited)) == GREEDY
    off = _config(GENERATE, "gconfig.greedy=true", "eval_gconfig.greedy=false", "eval_gconfig.temperature=0.5")
    assert _sampling(eval_sampling(off)) == (0.5, 0.9, 20), "eval_gconfig.greedy=false samples"


def test_the_three_request_builders_share_the_one_helper() -> None:
    """generate, the GRPO/PPO rollouts and the evaluator build their requests with rlkit.servers.sampling."""
    assert "request_sampling(config)" in inspect.getsource(generate.sampling_params)
    assert "sampling_params(config, evaluation=True)" in inspect.getsource(eval_sampling)
    source = inspect.getsource(grpo_rank0.Rank0.__init__)
    assert "params=sampling_params(config)" in source and "SamplingParams(" not in source


@pytest.mark.parametrize("backend", ["vllm", "sglang"])
def test_greedy_requests_carry_temperature_0(backend: str) -> None:
    body = _bodies(backend, generate.sampling_params(_config(GENERATE, "gconfig.greedy=true")))
    sent = body if backend == "vllm" else body["sampling_params"]
    assert (sent["temperature"], sent["top_p"], sent["top_k"]) == GREEDY


# --- submit-time checks -----------------------------------------------------------------------------------------

@pytest.mark.parametrize(("data", "overrides"), [
    (GENERATE, ["gconfig.greedy=true"]),
    (GENERATE, ["gconfig.greedy=false", "gconfig.n_samples=4"]),
    (GRPO, []),
    (GRPO, ["gconfig.greedy=false"]),
    (GRPO, ["eval_gconfig.greedy=true", "eval_gconfig.n_samples=1"]),
    (GRPO, ["eval_gconfig.greedy=false"]),
    (GRPO, ["eval_gconfig.greedy=null"]),
])
def test_greedy_is_accepted_for_generate_and_the_evaluation(data: dict[str, Any], overrides: list[str]) -> None:
    config = _config(data, *overrides)
    assert _problems(config, trains_on_rollouts=config.type != "generate") == []


@pytest.mark.parametrize("job", ["grpo", "ppo"])
def test_greedy_rollouts_of_a_group_are_refused_with_the_fix(job: str) -> None:
    config = _config(GRPO, f"type={job}", "gconfig.greedy=true")
    [(message, hint)] = _problems(config, trains_on_rollouts=True)
    assert message.startswith(f"gconfig.greedy is true, but job type {job} trains on groups of actor.group_size=4 "
                              "completions per prompt: greedy decoding makes every completion of a group the same")
    assert hint == GREEDY_FIX == "set gconfig.greedy=false, or use eval_gconfig.greedy for evaluation"


def test_greedy_rollouts_of_one_completion_are_refused_too() -> None:
    """A PPO group of 1 does not compare completions, but the trainer learns from them at gconfig.temperature
    (which it requires > 0): greedy rollouts are never trained on."""
    config = _config(GRPO, "type=ppo", "gconfig.n_samples=1", "actor.group_size=1", "gconfig.greedy=true")
    [(message, hint)] = _problems(config, trains_on_rollouts=True)
    assert "job type ppo trains on its rollouts" in message and hint == GREEDY_FIX


def test_validate_refuses_greedy_grpo_among_the_other_problems_and_takes_greedy_generate(tmp_path: Path) -> None:
    found = [(str(e), e.hint) for e in validate(_config(GRPO, "gconfig.greedy=true",
                                                        "rollout.max_concurrent_rollouts=0")).problems.errors]
    assert any("gconfig.greedy is true, but job type grpo" in m and h == GREEDY_FIX for m, h in found), found
    assert any("rollout.max_concurrent_rollouts" in m for m, _ in found), found
    found = [str(e) for e in validate(_config(GENERATE, "gconfig.greedy=true")).problems.errors]
    assert not any("greedy" in m for m in found), found


@pytest.mark.parametrize(("data", "overrides", "message", "hint"), [
    (GENERATE, ["gconfig.greedy=true", "gconfig.n_samples=3"],
     "gconfig.greedy is true with gconfig.n_samples=3: greedy decoding gives one completion per prompt",
     "set gconfig.n_samples=1, or gconfig.greedy=false to sample"),
    (GRPO, ["eval_gconfig.greedy=true"],
     "the evaluation eval_gconfig.greedy is true, with gconfig.n_samples=4, which eval_gconfig takes",
     "set eval_gconfig.n_samples=1, or eval_gconfig.greedy=false to sample"),
    (GENERATE, ["gconfig.greedy=true", "eval_gconfig.n_samples=2"],
     "the evaluation takes gconfig.greedy (true), with eval_gconfig.n_samples=2",
     "set eval_gconfig.n_samples=1, or eval_gconfig.greedy=false to sample"),
])
def test_greedy_with_several_completions_per_prompt_is_refused(data: dict[str, Any], overrides: list[str],
                                                               message: str, hint: str) -> None:
    """vLLM refuses n > 1 at temperature 0, and the copies would be the same completion."""
    [(found, found_hint)] = _problems(_config(data, *overrides), trains_on_rollouts=False)
    assert found.startswith(message) and found_hint == hint, found


def test_greedy_that_is_not_a_bool_is_refused() -> None:
    """Values that bypass the loader's typing (a config built in Python) are still refused by the check."""
    config = _config(GENERATE)
    config.gconfig.greedy = "yes"  # type: ignore[assignment]
    config.eval_gconfig.greedy = 1  # type: ignore[assignment]
    assert _problems(config, trains_on_rollouts=False) == [
        ("gconfig.greedy must be true or false (got 'yes')",
         "e.g. gconfig.greedy=true for greedy decoding, or gconfig.greedy=false to sample"),
        ("eval_gconfig.greedy must be true, false or null (got 1)",
         "e.g. eval_gconfig.greedy=true for greedy evaluation, or null for gconfig.greedy")]


@pytest.mark.parametrize("override", ["gconfig.greedy=abc", "gconfig.greedy=null", "gconfig.greedy=[1]",
                                      "eval_gconfig.greedy=abc"])
def test_the_loader_refuses_greedy_of_the_wrong_type_naming_the_field(override: str) -> None:
    with pytest.raises((ConfigError, ConfigErrors), match=r"gconfig\.greedy"):
        _config(GENERATE, override)


# --- AReaL configs ----------------------------------------------------------------------------------------------

def _compose(data: dict[str, Any], overrides: list[str] | None = None
             ) -> tuple[Problems, list[AcceptedKey], ExperimentConfig | None]:
    problems = Problems()
    accepted: list[AcceptedKey] = []
    cfg = compose(data, list(overrides or []), source="test.yaml", problems=problems, accepted=accepted,
                  job_types=REGISTRY)
    return problems, accepted, typed_config(cfg) if cfg is not None and problems.ok() else None


def test_greedy_is_no_longer_an_areal_key_with_a_rule() -> None:
    assert "greedy" not in TABLES["gconfig"] and "greedy" not in TABLES["eval_gconfig"]


def test_an_areal_generate_config_with_greedy_true_is_a_greedy_job() -> None:
    """AReaL style: no type (the config can only be a generate job), greedy with a temperature that says otherwise."""
    data = {"experiment_name": "e", "trial_name": "t", "allocation_mode": "vllm:d1", "actor": {"path": "/m"},
            "gconfig": {"n_samples": 1, "greedy": True, "temperature": 1.0}}
    problems, accepted, config = _compose(data)
    assert problems.ok(), [str(e) for e in problems.errors]
    assert config is not None and config.type == "generate" and config.gconfig.greedy is True
    assert not any("greedy" in a.key for a in accepted), "a field: honoured, not listed"
    assert _sampling(generate.sampling_params(config)) == GREEDY
    assert not any("greedy" in str(e) for e in validate(config).problems.errors)


def test_an_areal_grpo_config_with_a_greedy_evaluation_is_accepted() -> None:
    data = {**json.loads(json.dumps(GRPO)), "eval_gconfig": {"greedy": True, "n_samples": 1}}
    problems, accepted, config = _compose(data)
    assert problems.ok(), [str(e) for e in problems.errors]
    assert config is not None and config.eval_gconfig.greedy is True and config.gconfig.greedy is False
    assert not any("greedy" in a.key for a in accepted)
    assert _problems(config, trains_on_rollouts=True) == []
    assert _sampling(eval_sampling(config)) == GREEDY and _sampling(sampling_params(config)) == (0.8, 0.9, 20)
