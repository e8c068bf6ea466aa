"""generate.score and generate.dataset.path reasoning-gym at submit: each mistake refused with its fix (reward.fn
none, a missing answer column, a reward model too big for the client step, a bad reasoning-gym task, a threshold
that is no number), through the real CLI with exit 2 and nothing written."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from rlkit.config.load import load_config
from rlkit.errors import ConfigError
from tests.conftest import CONFIGS, raise_problems, run_rlkit

DIGITS = "reward.fn=rlkit.tasks.digits:digits_reward"


def problems_of(generate_yaml: Path, *overrides: str) -> str:
    """Every problem of the config as submit reports them ("" when it is valid)."""
    try:
        raise_problems(load_config(generate_yaml, list(overrides)))
    except ConfigError as exc:
        return str(exc)  # the problems with their fixes
    return ""


@pytest.mark.parametrize(("overrides", "says"), [
    (("generate.score=true", "reward.fn=none"), "generate.score is on but reward.fn is none"),
    (("generate.score=true", "reward.fns={none: 1.0, exact_match: 1.0}", "reward.answer_key=id"),
     "generate.score is on but reward.fn is none"),
    (("generate.score=true",), "reward.fn math needs the answer column 'answer', which the generate.dataset.path "
                               "rows do not have (columns: prompt)"),
    (("generate.score=true", "reward.fn=nosuchmodule:fn"), "reward.fn"),
    (("generate.score=true", "reward.fn=reasoning_gym"), "reward.fn reasoning_gym scores rows generated from "
                                                         "reasoning-gym, but generate.dataset.path is"),
    (("generate.dataset.path=reasoning-gym:gcdd",), "did you mean gcd"),
    (("generate.dataset.path=reasoning-gym",), "generate.dataset.path is reasoning-gym but reasoning_gym.tasks is "
                                               "empty"),
    (("generate.output_file=summary.json",), "would overwrite rlkit's own 'summary.json'"),
])
def test_scoring_mistakes_are_refused(generate_yaml: Path, overrides: tuple[str, ...], says: str) -> None:
    assert says in problems_of(generate_yaml, *overrides)


def test_valid_scoring_configs_pass(generate_yaml: Path) -> None:
    assert problems_of(generate_yaml, "generate.score=true", DIGITS) == ""
    assert problems_of(generate_yaml, "generate.score=true", "reward.fns={exact_match: 1.0}",
                       "reward.answer_key=prompt", "generate.pass_threshold=0.5") == ""
    assert problems_of(generate_yaml, "generate.dataset.path=reasoning-gym:gcd", "generate.score=true",
                       "reward.fn=reasoning_gym") == ""
    assert problems_of(generate_yaml, "generate.dataset.path=reasoning-gym", "reasoning_gym.tasks={gcd: 1, lcm: 2}",
                       "generate.score=true", "reward.fns={reasoning_gym: 1.0, "
                       "'rlkit.rewards.reasoning_gym:answer_tag_reward': 0.1}") == ""
    assert problems_of(generate_yaml, "reward.fn=none") == ""  # not scored: the reward section is not read


def test_pass_threshold_must_be_a_number(generate_yaml: Path) -> None:
    with pytest.raises(ConfigError, match=r"wrong type for 'generate\.pass_threshold'.* could not be converted to "
                                          "Float"):
        load_config(generate_yaml, ["generate.pass_threshold=high"])
    assert "generate.pass_threshold must be a finite number (got nan)" in problems_of(
        generate_yaml, "generate.pass_threshold=nan")


def test_a_reward_model_must_fit_the_client_step(generate_yaml: Path, tmp_path: Path) -> None:
    rw = tmp_path / "rw-final"
    rw.mkdir()
    (rw / "rlkit_value_head.json").write_text(json.dumps({"kind": "reward"}))
    (rw / "tokenizer.json").write_text("{}")
    (rw / "config.json").write_text(json.dumps({"torch_dtype": "bfloat16"}))
    with open(rw / "model.safetensors", "wb") as f:
        f.truncate(600 * 2**20)  # sparse: 600 MB of bf16 weights, 1200 MB as float32
    scored = ["generate.score=true", "reward.fn=reward_model", f"reward.reward_model_path={rw}"]
    says = problems_of(generate_yaml, *scored, "launcher.client_mem=3000")
    assert "needs about 3248 MB on the client step's CPU" in says and "set launcher.client_mem to at least 3248" in says
    assert problems_of(generate_yaml, *scored, "launcher.client_mem=3248") == ""


def test_the_cli_refuses_scoring_with_no_reward_with_exit_2_and_writes_nothing(tmp_path: Path) -> None:
    env = {**os.environ, "RLKIT_DEMO_DIR": str(tmp_path), "RLKIT_HOME": str(tmp_path / "home")}
    (tmp_path / "prompts.jsonl").write_text(json.dumps({"prompt": "1+1="}) + "\n")
    result = run_rlkit("submit", str(CONFIGS / "generate-cpu-demo.yaml"), f"cluster.fileroot={tmp_path}/fileroot",
                       "reward.fn=none", "generate.score=true", env=env)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert "generate.score is on but reward.fn is none" in result.stderr
    assert not (tmp_path / "fileroot").exists() and not (tmp_path / "home").exists()


def test_the_prompt_column_is_checked_at_submit(generate_yaml: Path, tmp_path: Path) -> None:
    assert ("generate.dataset.path: rows have no column 'question' (columns: prompt)"
            in problems_of(generate_yaml, "generate.dataset.prompt_key=question"))
    gsm8k = tmp_path / "gsm8k.jsonl"  # GSM8K's rows, with prompt_key left at its default: read as the step reads them
    gsm8k.write_text(json.dumps({"question": "1+1?", "answer": "#### 2"}) + "\n")
    assert problems_of(generate_yaml, f"generate.dataset.path={gsm8k}") == ""
    query = tmp_path / "query.jsonl"
    query.write_text(json.dumps({"query": "1+1?", "answer": "2"}) + "\n")
    assert "rows have no column 'prompt' (columns: query, answer)" in problems_of(
        generate_yaml, f"generate.dataset.path={query}")
