"""gconfig.min_new_tokens and eval_gconfig.min_new_tokens (AReaL's key, an rlkit field): submit-time checks
(rlkit.checks.sampling), how the sampling settings carry it, and the request bodies of both backends (vLLM's
`min_tokens`, SGLang's `sampling_params.min_new_tokens`), sent only when it is above 0."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from rlkit.checks.sampling import validate_eval_min_new_tokens, validate_min_new_tokens
from rlkit.config.load import config_from_mapping
from rlkit.config.problems import Problems
from rlkit.config.schema.experiment import ExperimentConfig
from rlkit.errors import ConfigError, ConfigErrors
from rlkit.jobs.generate.step import sampling_params
from rlkit.jobs.validate import validate
from rlkit.servers.backend import SamplingParams
from rlkit.servers.sglang.backend import BACKEND as SGLANG
from rlkit.servers.vllm.backend import BACKEND as VLLM
from rlkit.trainer.evaluator import eval_sampling
from tests.unit.weights.test_weights_disk import run, server


def _config(*overrides: str) -> ExperimentConfig:
    data = {"experiment_name": "e", "trial_name": "t", "type": "grpo", "allocation_mode": "vllm:d1+fsdp:d1",
            "gconfig": {"n_samples": 4, "max_new_tokens": 16}}
    return config_from_mapping(data, list(overrides))


def _problems(config: ExperimentConfig) -> list[tuple[str, str | None]]:
    problems = Problems()
    validate_min_new_tokens(config, problems)
    validate_eval_min_new_tokens(config, problems)
    return [(str(e), e.hint) for e in problems.errors]


# --- submit-time checks -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("overrides", [
    [], ["gconfig.min_new_tokens=0"], ["gconfig.min_new_tokens=16"], ["eval_gconfig.min_new_tokens=16"],
    ["gconfig.min_new_tokens=16", "eval_gconfig.max_new_tokens=32"],
    ["gconfig.min_new_tokens=16", "eval_gconfig.max_new_tokens=8", "eval_gconfig.min_new_tokens=0"],
    ["gconfig.max_new_tokens=4", "eval_gconfig.max_new_tokens=32", "eval_gconfig.min_new_tokens=20",
     "gconfig.min_new_tokens=2"],
])
def test_counts_up_to_max_new_tokens_are_accepted(overrides: list[str]) -> None:
    assert _problems(_config(*overrides)) == []


@pytest.mark.parametrize(("overrides", "message", "hint"), [
    (["gconfig.min_new_tokens=-1"], "gconfig.min_new_tokens must be >= 0 (got -1; 0 is no minimum)",
     "e.g. gconfig.min_new_tokens=8, or gconfig.min_new_tokens=0"),
    (["gconfig.min_new_tokens=17"], "gconfig.min_new_tokens (17) exceeds gconfig.max_new_tokens (16): completions "
     "end at 16 tokens, short of the minimum",
     "lower gconfig.min_new_tokens to at most 16, or raise gconfig.max_new_tokens"),
    (["eval_gconfig.min_new_tokens=-3"], "eval_gconfig.min_new_tokens must be >= 0 (got -3; 0 is no minimum)",
     "e.g. eval_gconfig.min_new_tokens=8, or eval_gconfig.min_new_tokens=0, or null for gconfig.min_new_tokens"),
    (["eval_gconfig.min_new_tokens=17"], "eval_gconfig.min_new_tokens (17) exceeds gconfig.max_new_tokens (16), "
     "which eval_gconfig takes", "lower eval_gconfig.min_new_tokens to at most 16, or set eval_gconfig.max_new_tokens"),
    (["eval_gconfig.min_new_tokens=9", "eval_gconfig.max_new_tokens=8"],
     "eval_gconfig.min_new_tokens (9) exceeds eval_gconfig.max_new_tokens (8)",
     "lower eval_gconfig.min_new_tokens to at most 8, or raise eval_gconfig.max_new_tokens"),
    (["gconfig.min_new_tokens=9", "eval_gconfig.max_new_tokens=8"],
     "eval_gconfig takes gconfig.min_new_tokens (9), which exceeds eval_gconfig.max_new_tokens (8)",
     "set eval_gconfig.min_new_tokens to at most 8, or raise eval_gconfig.max_new_tokens"),
])
def test_a_bad_minimum_is_refused_with_its_fix(overrides: list[str], message: str, hint: str) -> None:
    found = _problems(_config(*overrides))
    assert len(found) == 1 and message in found[0][0] and found[0][1] == hint, found


def test_a_minimum_over_gconfigs_own_maximum_is_reported_once() -> None:
    """gconfig's two values break the bound; the evaluator inherits both and adds no second report."""
    assert len(_problems(_config("gconfig.min_new_tokens=20"))) == 1


@pytest.mark.parametrize("value", [True, "8", 2.5])
def test_a_minimum_that_is_not_a_whole_number_is_refused(value: object) -> None:
    """Values that bypass the loader's typing (a config built in Python) are still refused by the check."""
    config = _config()
    config.gconfig.min_new_tokens = value  # type: ignore[assignment]
    config.eval_gconfig.min_new_tokens = value  # type: ignore[assignment]
    found = _problems(config)
    assert [m.splitlines()[0] for m, _ in found] == [
        f"gconfig.min_new_tokens must be a whole number of tokens (got {value!r})",
        f"eval_gconfig.min_new_tokens must be a whole number of tokens (got {value!r})"]
    assert all(hint and "min_new_tokens=8" in hint for _, hint in found)


@pytest.mark.parametrize("value", ["true", "abc", "2.5"])
def test_the_loader_refuses_a_minimum_of_the_wrong_type_naming_the_field(value: str) -> None:
    with pytest.raises((ConfigError, ConfigErrors), match=r"gconfig\.min_new_tokens"):
        _config(f"gconfig.min_new_tokens={value}")


def test_validate_collects_the_minimums_problems_with_the_others() -> None:
    problems = validate(_config("gconfig.min_new_tokens=-1", "rollout.max_concurrent_rollouts=0")).problems
    found = [str(e) for e in problems.errors]
    assert any("gconfig.min_new_tokens must be >= 0" in m for m in found), found
    assert any("rollout.max_concurrent_rollouts" in m for m in found), found


# --- sampling settings ------------------------------------------------------------------------------------------

def test_the_sampling_settings_carry_the_minimum_and_the_evaluator_inherits_it() -> None:
    config = _config("gconfig.min_new_tokens=5")
    assert sampling_params(config).min_new_tokens == 5
    assert eval_sampling(config).min_new_tokens == 5, "None: gconfig's"
    assert eval_sampling(_config("gconfig.min_new_tokens=5", "eval_gconfig.min_new_tokens=0")).min_new_tokens == 0
    assert eval_sampling(_config("eval_gconfig.min_new_tokens=3")).min_new_tokens == 3
    assert SamplingParams().min_new_tokens == 0


# --- request bodies ---------------------------------------------------------------------------------------------

CHOICE = {"index": 0, "text": "7", "token_ids": [7], "logprobs": {"token_logprobs": [-0.5]}, "finish_reason": "stop"}
RESULT = {"text": "7", "output_ids": [7], "meta_info": {"output_token_logprobs": [[-0.5, 7, None]],
                                                          "finish_reason": {"type": "stop"}}}


def _bodies(backend: str, params: SamplingParams) -> dict[str, Any]:
    seen: list[dict[str, Any]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        seen.append(body)
        if backend == "vllm":
            return httpx.Response(200, json={"choices": [{**CHOICE, "index": i} for i in range(params.n)]})
        n = len(body["input_ids"]) if isinstance(body["input_ids"][0], list) else body["sampling_params"]["n"]
        return httpx.Response(200, json=[RESULT] * n if n > 1 else RESULT)

    impl = VLLM if backend == "vllm" else SGLANG
    run(httpx.MockTransport(handler), lambda c: impl.complete(c, server(backend), [1, 2], params))
    assert len(seen) == 1
    return seen[0]


def test_vllm_requests_carry_min_tokens_only_when_set() -> None:
    body = _bodies("vllm", SamplingParams(max_new_tokens=16, min_new_tokens=8))
    assert (body["min_tokens"], body["max_tokens"]) == (8, 16)
    assert "min_tokens" not in _bodies("vllm", SamplingParams(max_new_tokens=16)), "shape unchanged at 0"


def test_sglang_requests_carry_min_new_tokens_in_sampling_params_only_when_set() -> None:
    body = _bodies("sglang", SamplingParams(n=2, max_new_tokens=16, min_new_tokens=8))
    assert (body["sampling_params"]["min_new_tokens"], body["sampling_params"]["max_new_tokens"]) == (8, 16)
    seeded = _bodies("sglang", SamplingParams(n=2, max_new_tokens=16, min_new_tokens=8, seed=3))
    assert [p["min_new_tokens"] for p in seeded["sampling_params"]] == [8, 8], "every copy of a seeded batch"
    assert "min_new_tokens" not in _bodies("sglang", SamplingParams(max_new_tokens=16))["sampling_params"]
    assert "min_new_tokens" not in json.dumps(_bodies("sglang", SamplingParams(n=2, seed=3)))

