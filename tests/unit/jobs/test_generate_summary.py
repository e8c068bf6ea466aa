"""generate.score's summary (rlkit.jobs.generate.summary): pass@k against a brute-force count over subsets, the
pass threshold, a mix's functions, reasoning-gym tasks, failed calls counted; the scored lines of a run
(rlkit.jobs.generate.step._complete_all with real reward workers); and the headline `rlkit status` shows."""

from __future__ import annotations

import asyncio
import io
import json
from itertools import combinations
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from omegaconf import OmegaConf

from rlkit.cli.status import generated_headline
from rlkit.config.schema.experiment import ExperimentConfig
from rlkit.jobs.generate.scoring import CompletionScorer
from rlkit.jobs.generate.step import _complete_all
from rlkit.jobs.generate.summary import describe, pass_at_k, pass_ks, summarize, write_summary
from rlkit.servers.backend import Completion


def brute_pass_at_k(passed: list[bool], k: int) -> float:
    """The fraction of the k-subsets of the completions holding at least one that passes."""
    subsets = list(combinations(passed, k))
    return sum(any(s) for s in subsets) / len(subsets)


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 6])
def test_pass_at_k_is_the_fraction_of_k_subsets_with_a_pass(n: int) -> None:
    for c in range(n + 1):
        passed = [True] * c + [False] * (n - c)
        for k in range(1, n + 1):
            assert pass_at_k(n, c, k) == pytest.approx(brute_pass_at_k(passed, k)), (n, c, k)


def test_the_reported_ks_are_powers_of_two_and_n() -> None:
    assert pass_ks(1) == [1]
    assert pass_ks(4) == [1, 2, 4]
    assert pass_ks(6) == [1, 2, 4, 6]
    assert pass_ks(8) == [1, 2, 4, 8]
    with pytest.raises(ValueError, match="1 <= k <= n"):
        pass_at_k(3, 1, 4)


def _record(rewards: list[float], **extra: Any) -> dict[str, Any]:
    return {"index": 0, "completions": [{"text": "", "reward": r} for r in rewards], **extra}


def test_summary_of_a_small_run_and_its_threshold() -> None:
    records = [_record([1.0, 0.0, 0.0]), _record([0.5, 0.5, 1.0]), _record([0.0, 0.0, 0.0])]
    counts = {"reward_calls": 9, "failed_calls": 0, "timed_out_calls": 0}
    s = summarize(records, n_samples=3, threshold=1.0, counts=counts)
    assert (s["prompts"], s["completions"]) == (3, 9)
    assert s["reward_mean"] == pytest.approx(3.0 / 9)
    assert s["mean_at_n"] == pytest.approx((1 / 3 + 2 / 3 + 0) / 3)
    # brute force per prompt: passes [1 of 3], [1 of 3], [0 of 3]
    expected = {k: (2 * brute_pass_at_k([True, False, False], k) + 0) / 3 for k in (1, 2, 3)}
    assert s["pass_at_k"] == pytest.approx({str(k): v for k, v in expected.items()})
    assert set(s["pass_at_k"]) == {"1", "2", "3"}
    # a lower threshold counts the 0.5s as passes: the second prompt passes on all three
    low = summarize(records, n_samples=3, threshold=0.5, counts=counts)
    assert low["pass_at_k"]["1"] == pytest.approx((1 / 3 + 1 + 0) / 3)
    assert low["pass_at_k"]["3"] == pytest.approx(2 / 3)
    assert "tasks" not in s and "functions" not in s


def test_a_mix_reports_each_function_and_failures_are_counted() -> None:
    records = [{"completions": [
        {"reward": 0.5, "rewards": {"digits": 1.0, "brevity": 0.0}},
        {"reward": 0.0, "rewards": {"digits": 0.0, "brevity": 0.0}, "reward_error": "brevity: boom"},
    ]}]
    counts = {"reward_calls": 2, "failed_calls": 1, "timed_out_calls": 0,
              "functions": {"digits": {"weight": 0.5, "failed_calls": 0, "timed_out_calls": 0},
                            "brevity": {"weight": 0.5, "failed_calls": 1, "timed_out_calls": 0}}}
    s = summarize(records, n_samples=2, threshold=1.0, counts=counts)
    assert s["functions"]["digits"] == {"weight": 0.5, "failed_calls": 0, "timed_out_calls": 0, "mean": 0.5}
    assert s["functions"]["brevity"]["mean"] == 0.0 and s["functions"]["brevity"]["failed_calls"] == 1
    assert (s["failed_completions"], s["failed_calls"]) == (1, 1)
    assert s["pass_at_k"] == {"1": 0.0, "2": 0.0}
    text = "\n".join(describe(s))
    assert "1 failed and 0 timed-out reward calls" in text and "function brevity (weight 0.5)" in text


def test_reasoning_gym_tasks_get_their_own_score() -> None:
    records = [_record([1.0, 0.0], task="gcd"), _record([1.0, 1.0], task="lcm"), _record([0.0, 0.0], task="gcd"),
               {"completions": [{"reward": 0.75, "rewards": {"reasoning_gym": 0.5, "answer_tag_reward": 1.0}}],
                "task": "lcm"}]
    s = summarize(records, n_samples=2, threshold=1.0, counts={})
    assert s["tasks"]["gcd"] == {"completions": 4, "reward_mean": 0.25}
    assert s["tasks"]["lcm"]["reward_mean"] == pytest.approx((1 + 1 + 0.5) / 3)  # the task's own score in a mix


def test_the_summary_is_written_whole_and_status_shows_its_headline(tmp_path: Path) -> None:
    s = summarize([_record([1.0, 0.0])], n_samples=2, threshold=1.0,
                  counts={"reward_calls": 2, "failed_calls": 0, "timed_out_calls": 1})
    write_summary(tmp_path / "summary.json", s)
    assert json.loads((tmp_path / "summary.json").read_text()) == s
    assert [p.name for p in tmp_path.iterdir()] == ["summary.json"]
    line = generated_headline(tmp_path / "summary.json")
    assert line.startswith("1 prompts, 2 completions: mean reward 0.500  pass@1 0.500  pass@2 1.000"), line
    assert "0 failed and 1 timed-out reward calls" in line
    (tmp_path / "summary.json").write_text(json.dumps({"pass_at_k": {"1": "[red]x"}, "prompts": "y" * 5000}))
    assert len(generated_headline(tmp_path / "summary.json")) <= 400  # hostile: cut, never a traceback
    assert generated_headline(tmp_path / "none.json") == ""


class _Pool:
    """ServerPool's interface: each prompt's completions are its own token ids, repeated."""

    async def complete(self, prompt: list[int], params: Any) -> tuple[Any, list[Completion]]:
        return SimpleNamespace(index=0), [Completion(text=f"t{i}", token_ids=prompt, logprobs=[0.0] * len(prompt),
                                                     finish_reason="length") for i in range(2)]

    async def aclose(self) -> None:
        pass


def test_each_line_gains_the_reward_the_runner_gave_its_decoded_text() -> None:
    config = OmegaConf.to_object(OmegaConf.structured(ExperimentConfig(
        experiment_name="e", trial_name="t", allocation_mode="vllm:d1")))
    assert isinstance(config, ExperimentConfig)
    config.reward.fns = {"rlkit.tasks.digits:digits_reward": 1.0, "exact_match": 0.5}  # no answer column: fails
    config.reward.num_workers = 1
    rows = [{"prompt": "a", "task": "gcd"}, {"prompt": "b"}]
    prompts = [[1, 2], [3]]
    decode = {(1, 2): "12", (3,): "x"}
    scorer = CompletionScorer(config)
    out = io.StringIO()
    try:
        asyncio.run(_complete_all(_Pool(), prompts, None, rows, "prompt", out,  # type: ignore[arg-type]
                                  (scorer, ["a", "b"], lambda ids: decode[tuple(ids)])))
        counts = scorer.counts()
    finally:
        scorer.close()
    lines = {r["index"]: r for r in map(json.loads, out.getvalue().splitlines())}
    assert lines[0]["task"] == "gcd" and "task" not in lines[1]
    for i, digits in ((0, 1.0), (1, 0.0)):
        for c in lines[i]["completions"]:
            assert c["rewards"] == {"digits_reward": digits, "exact_match": 0.0}
            assert c["reward"] == digits and c["reward_error"].startswith("exact_match: ") and "answer" in c[
                "reward_error"]
    assert counts["reward_calls"] == 4 and counts["failed_calls"] == 4 and counts["timed_out_calls"] == 0
    assert counts["functions"]["exact_match"]["failed_calls"] == 4
    assert counts["functions"]["digits_reward"] == {"fn": "rlkit.tasks.digits:digits_reward", "weight": 1.0,
                                                    "failed_calls": 0, "timed_out_calls": 0}


def test_a_reasoning_gym_dataset_is_the_held_out_rows_generated_in_the_job() -> None:
    from rlkit.jobs.generate.step import _rows
    from rlkit.tasks.reasoning_gym import generate_rows

    config = OmegaConf.to_object(OmegaConf.structured(ExperimentConfig(
        experiment_name="e", trial_name="t", allocation_mode="vllm:d1")))
    assert isinstance(config, ExperimentConfig)
    config.generate.dataset.path = "reasoning-gym:gcd"
    config.reasoning_gym.valid_size, config.reasoning_gym.size = 3, 50
    rows = _rows(config)
    assert len(rows) == 3 and {r["task"] for r in rows} == {"gcd"} and rows[0]["prompt"][-1]["role"] == "user"
    assert rows == generate_rows(config.reasoning_gym, "reasoning-gym:gcd", valid=True)  # valid_seed's rows
    assert rows != generate_rows(config.reasoning_gym, "reasoning-gym:gcd", valid=False)[:3]


@pytest.mark.parametrize("fns", [{"exact_match": 1.0},  # no answer column in the rows: fails on every call
                                 {"rlkit.tasks.digits:digits_reward": 1.0, "exact_match": 0.5},  # one of a mix
                                 {"rlkit.tasks.digits:digits_reward": 1.0}])  # fine
def test_a_reward_function_that_failed_on_every_call_fails_the_run_after_its_summary(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], fns: dict[str, float]) -> None:
    """A run whose reward function failed on every call writes its output and summary (the counts say why), then
    fails without a retry (exit 78) naming the function, its error and what to check: its 0.0 scores would
    otherwise read as the model's (a mix too: a function that never scored skews the mix, as training stops)."""
    from rlkit.errors import FatalStepError
    from rlkit.jobs.generate.step import _summarize
    from rlkit.step_contract import NO_RETRY_EXIT
    from rlkit.trials.paths import TrialPaths

    config = OmegaConf.to_object(OmegaConf.structured(ExperimentConfig(
        experiment_name="e", trial_name="t", type="generate", allocation_mode="vllm:d1")))
    assert isinstance(config, ExperimentConfig)
    config.reward.fns, config.reward.num_workers = fns, 1
    paths = TrialPaths(tmp_path)
    output = tmp_path / "generated.jsonl"
    scorer = CompletionScorer(config)
    try:
        with open(output, "w") as out:
            asyncio.run(_complete_all(_Pool(), [[1, 2]], None, [{"prompt": "a"}], "prompt", out,  # type: ignore[arg-type]
                                      (scorer, ["a"], lambda ids: "12")))
    finally:
        scorer.close()
    if "exact_match" not in fns:
        _summarize(paths, output, config, scorer)
        assert json.loads(paths.summary.read_text())["failed_calls"] == 0
        return
    with pytest.raises(FatalStepError) as raised:
        _summarize(paths, output, config, scorer)
    said = str(raised.value)
    assert raised.value.exit_code == NO_RETRY_EXIT
    assert "the reward function exact_match (reward.fns) failed on all 2 of its calls, each scored 0.0" in said, said
    assert "answer" in said and "reward.answer_key='answer'" in said, said  # its error, and what to check
    assert f"completions are kept in {output}" in said and "not the model's" in said
    assert json.loads(paths.summary.read_text())["failed_calls"] == 2  # written first
    assert "WARNING: 2 of " in capsys.readouterr().out
