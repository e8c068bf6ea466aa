"""The per-step log-prob mismatch check (rlkit.trainer.mismatch) and what shows it: which samples count, per-server
sums, the threshold and its message, the metrics, the comparison temperature, progress.json -> `rlkit status`."""

from __future__ import annotations

import io
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from rich.console import Console

from rlkit.cli.status import TrialDetail, TrialRow, print_detail
from rlkit.config.load import config_from_mapping, load_config
from rlkit.config.schema.experiment import ExperimentConfig
from rlkit.errors import ConfigError
from rlkit.jobs.grpo.fault_corrupt import NOISE, perturbed
from rlkit.jobs.grpo.rank0 import logprob_mismatch_warn
from rlkit.servers.sampled_logprobs import sampled_logprob_meaning
from rlkit.trainer import mismatch
from rlkit.trainer.mismatch import ServerMismatch, compared_indices, comparison_temperature, measure, merge
from rlkit.types import Sample
from tests.conftest import raise_problems

M = mismatch.METRIC


def sample(server: int, version: int, behav: list[float], *, dummy: bool = False) -> Sample:
    return Sample(prompt_ids=[1, 2], completion_ids=[5] * len(behav), behav_logp=behav, reward=0.0, version=version,
                  finished=True, group=0, dummy=dummy, server=server)


# server 0 at version 3: two samples; server 1 at version 3: one; an older sample of server 1; an unknown server
BATCH = [sample(0, 3, [-1.0, -2.0]), sample(1, 3, [-0.5]), sample(0, 3, [-3.0]), sample(1, 2, [-9.0, -9.0]),
         sample(-1, 3, [-1.0]), sample(0, 3, [-1.0], dummy=True)]
TRAINER = {0: [-1.1, -2.0], 1: [-0.2], 2: [-3.05], 3: [-1.0, -1.0], 4: [-5.0], 5: [-7.0]}


def test_only_real_samples_of_a_known_server_at_the_trainers_version_count() -> None:
    assert compared_indices(BATCH, 3) == [0, 1, 2]
    assert compared_indices(BATCH, 2) == [3]
    assert compared_indices(BATCH, 4) == []


def test_measure_sums_per_server_over_the_counted_samples() -> None:
    got = measure(BATCH, TRAINER, 3)
    assert sorted(got) == [0, 1]
    zero, one = got[0], got[1]
    assert zero.tokens == 3 and zero.abs_sum == pytest.approx(0.1 + 0.0 + 0.05)
    assert zero.max == pytest.approx(0.1) and zero.mean == pytest.approx(0.05)
    assert (one.tokens, one.abs_sum, one.max) == (1, pytest.approx(0.3), pytest.approx(0.3))
    # the older sample (|diff| 8 per token), the unknown server and the dummy are not in it


def test_measure_takes_only_the_samples_this_rank_has() -> None:
    got = measure(BATCH, {1: TRAINER[1], 3: TRAINER[3]}, 3)
    assert list(got) == [1] and got[1].tokens == 1


def test_measure_refuses_misaligned_log_probs() -> None:
    with pytest.raises(ValueError, match="sample 0: 1 trainer log-probs for 2 server ones"):
        measure(BATCH, {0: [-1.0]}, 3)


def test_merge_adds_the_ranks_parts() -> None:
    rank0 = measure(BATCH, {0: TRAINER[0], 1: TRAINER[1]}, 3)
    rank1 = measure(BATCH, {2: TRAINER[2]}, 3)
    merged = merge([rank0, rank1, {}])
    assert merged == measure(BATCH, TRAINER, 3)
    assert list(merge([{1: ServerMismatch(1, 1, 0.1, 0.1)}, {0: ServerMismatch(0, 1, 0.2, 0.2)}])) == [0, 1]


def test_metrics_overall_and_per_server() -> None:
    got = mismatch.metrics(measure(BATCH, TRAINER, 3))
    assert got[f"{M}_tokens"] == 4
    assert got[f"{M}_mean"] == pytest.approx((0.15 + 0.3) / 4)
    assert got[f"{M}_max"] == pytest.approx(0.3)
    assert got[f"{M}_mean/server0"] == pytest.approx(0.05) and got[f"{M}_mean/server1"] == pytest.approx(0.3)
    assert got[f"{M}_max/server0"] == pytest.approx(0.1) and got[f"{M}_tokens/server1"] == 1


def test_no_compared_token_logs_a_zero_count_and_no_mean() -> None:
    assert mismatch.metrics(measure(BATCH, TRAINER, 7)) == {f"{M}_tokens": 0.0}


def test_a_server_over_the_threshold_is_named_with_address_and_version() -> None:
    per_server = measure(BATCH, TRAINER, 3)
    lines = mismatch.warnings(per_server, threshold=0.1, version=3, addresses={0: "n1:8000", 1: "n2:8001"})
    assert lines == ["server 1 (n2:8001) log-probs differ from the trainer's by 0.3 (max 0.3) at version 3 over 1 "
                     "tokens; threshold actor.logprob_mismatch_warn=0.1. The server may not serve the weights of its "
                     "version: see its log (rlkit logs TRIAL --step server-1)"]
    assert len(mismatch.warnings(per_server, threshold=0.01, version=3, addresses={})) == 2
    assert "server 0 (address unknown)" in mismatch.warnings(per_server, threshold=0.01, version=3, addresses={})[0]
    assert mismatch.warnings(per_server, threshold=0.3, version=3, addresses={}) == []  # not over: equal


def test_comparison_temperature() -> None:
    # raw log-probs (vLLM's default) are at temperature 1 whatever the sampling temperature and truncation
    assert comparison_temperature("raw", 0.7, top_p=0.9, top_k=20) == 1.0
    # those of the sampling distribution at its temperature, but not reproducible after top-p/top-k truncation
    assert comparison_temperature("temperature", 0.7, top_p=1.0, top_k=-1) == 0.7
    assert comparison_temperature("temperature", 0.7, top_p=0.9, top_k=-1) is None
    assert comparison_temperature("temperature", 0.7, top_p=1.0, top_k=50) is None
    assert comparison_temperature("logits", 1.0, top_p=1.0, top_k=-1) is None


@pytest.mark.parametrize(("overrides", "meaning"), [
    ((), "raw"),
    (("vllm.extra_args={logprobs-mode: processed_logprobs}",), "temperature"),
    (("vllm.extra_args={logprobs_mode: raw_logits}",), "logits"),
    (("allocation_mode=sglang:d1+fsdp:d1",), "temperature"),
    # SGLang's launch removes SGLANG_RETURN_ORIGINAL_LOGPROB from the server's environment: never raw
    (("allocation_mode=sglang:d1+fsdp:d1", "launcher.inference_server_env_vars=SGLANG_RETURN_ORIGINAL_LOGPROB=1"),
     "temperature"),
])
def test_what_the_servers_log_probs_mean(overrides: tuple[str, ...], meaning: str) -> None:
    assert sampled_logprob_meaning(config(*overrides)) == meaning


def config(*overrides: str) -> ExperimentConfig:
    base: dict[str, Any] = {"experiment_name": "e", "trial_name": "t", "type": "grpo",
                            "allocation_mode": "vllm:d1+fsdp:d1"}
    return config_from_mapping(base, list(overrides), source="test")


def test_warn_threshold_default_by_dtype_and_explicit() -> None:
    assert logprob_mismatch_warn(config("vllm.dtype=float32", "actor.dtype=float32")) == 1e-2
    assert logprob_mismatch_warn(config("vllm.dtype=bfloat16", "actor.dtype=float32")) == 0.1
    assert logprob_mismatch_warn(config("actor.logprob_mismatch_warn=0.5", "vllm.dtype=float32",
                                        "actor.dtype=float32")) == 0.5


@pytest.mark.parametrize("value", ["0", "-0.1"])
def test_a_threshold_that_is_not_positive_is_refused(grpo_yaml: Path, value: str) -> None:
    raise_problems(load_config(grpo_yaml))
    says = f"actor.logprob_mismatch_warn must be positive or null \\(got {float(value)}"
    with pytest.raises(ConfigError, match=says):
        raise_problems(load_config(grpo_yaml, [f"actor.logprob_mismatch_warn={value}"]))


def test_perturbed_weights_differ_and_keep_ties() -> None:
    gen = torch.Generator().manual_seed(1)
    embed = torch.randn(8, 4, generator=gen)
    state = {"model.embed_tokens.weight": embed, "lm_head.weight": embed.clone(), "scale": torch.ones(1),
             "steps": torch.tensor([3])}
    out = perturbed(state, {"lm_head.weight": "model.embed_tokens.weight"}, seed=5)
    assert torch.equal(out["lm_head.weight"], out["model.embed_tokens.weight"])
    change = (out["model.embed_tokens.weight"] - embed).std() / embed.std()
    assert float(change) == pytest.approx(NOISE, rel=0.5)  # NOISE x the tensor's std
    assert torch.equal(out["scale"], state["scale"]) and torch.equal(out["steps"], state["steps"])
    assert torch.equal(perturbed(state, {}, seed=5)["model.embed_tokens.weight"], out["model.embed_tokens.weight"])


def test_status_shows_the_last_warning() -> None:
    line = mismatch.warnings({1: ServerMismatch(1, 4, 2.0, 0.9)}, threshold=0.01, version=7,
                             addresses={1: "node2:8001"})[0]
    detail = TrialDetail(TrialRow("demo/t", "12", "RUNNING", "1:00", "node[1-4]", "now", "/x", "8/25", "0.5"),
                         "None", "", [], mismatch_warning=line)
    out = io.StringIO()
    print_detail(Console(file=out, width=300), detail)
    assert f"last log-prob mismatch warning: {line}" in out.getvalue()
    assert math.isclose(ServerMismatch(1, 4, 2.0, 0.9).mean, 0.5)
