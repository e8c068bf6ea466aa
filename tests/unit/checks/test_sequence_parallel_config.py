"""actor.fsdp.ulysses_sp_size at submit (rlkit.checks.sequence_parallel): every problem named with its fix, exit 2 and
nothing written; the demo's tiny Qwen2 (2 heads, 1 KV head) is accepted at sp=2. Torch-free except the CLI run."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from rlkit.checks.sequence_parallel import validate_sequence_parallel
from rlkit.config.allocation import parse_allocation
from rlkit.config.load import config_from_mapping
from rlkit.config.problems import Problems
from rlkit.jobs import REGISTRY
from tests.conftest import CONFIGS, run_rlkit


def _model(directory: Path, **config: object) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config))
    return directory


def _problems(model: Path, *overrides: str, job: str = "grpo", allocation: str = "vllm:d1+fsdp:d2") -> list[str]:
    mapping = {"experiment_name": "e", "trial_name": "t", "type": job, "allocation_mode": allocation,
               "actor": {"path": str(model)}}
    config = config_from_mapping(mapping, list(overrides))
    problems = Problems()
    validate_sequence_parallel(config, REGISTRY.named(job), REGISTRY, parse_allocation(allocation), problems)
    return [" ".join(str(e).split()) for e in problems.errors]  # the message and its fix on one line


def test_sp_1_checks_nothing(tmp_path: Path) -> None:
    model = _model(tmp_path / "m", model_type="gemma", num_attention_heads=3, num_key_value_heads=3)
    assert _problems(model, "actor.mb_spec.packing=false", job="ppo", allocation="vllm:d1+fsdp:d3") == []


@pytest.mark.parametrize(("heads", "kv_heads"), [(2, 1), (4, 2), (8, 8), (16, 4)])
def test_heads_that_divide_or_kv_heads_that_repeat_are_accepted(tmp_path: Path, heads: int, kv_heads: int) -> None:
    model = _model(tmp_path / "m", model_type="qwen2", num_attention_heads=heads, num_key_value_heads=kv_heads)
    assert _problems(model, "actor.fsdp.ulysses_sp_size=2") == []


def test_every_problem_is_named_at_once(tmp_path: Path) -> None:
    model = _model(tmp_path / "m", model_type="gemma", num_attention_heads=6, num_key_value_heads=6)
    found = _problems(model, "actor.fsdp.ulysses_sp_size=4", "actor.mb_spec.packing=false", job="dpo",
                      allocation="fsdp:d6")
    assert len(found) == 6, found
    assert "job type dpo: its trainer does not split sequences yet" in found[0] and "set actor.fsdp.ulysses_sp_size=1" \
        in found[0] and "ppo" in found[0]
    assert "needs packed micro-batches" in found[1] and "fix: set actor.mb_spec.packing=true" in found[1]
    assert "does not divide the trainer's 6 GPUs" in found[2] and "use a multiple of 4 trainer GPUs" in found[2]
    assert "a 'gemma' model, whose attention rlkit's Ulysses does not serve" in found[3]
    assert "does not divide the model's 6 attention heads" in found[4]
    assert "the model's 6 KV heads: neither divides the other" in found[5]


def test_ppo_splits_when_the_critic_names_the_actors_sp_size(tmp_path: Path) -> None:
    model = _model(tmp_path / "m", model_type="qwen2", num_attention_heads=4, num_key_value_heads=2)
    both = ("actor.fsdp.ulysses_sp_size=2", "critic.fsdp.ulysses_sp_size=2")
    assert _problems(model, *both, job="ppo") == []
    [problem] = _problems(model, *both, "critic.mb_spec.packing=false", job="ppo")
    assert "critic.fsdp.ulysses_sp_size=2 needs packed micro-batches for the critic" in problem
    assert "fix: set critic.mb_spec.packing=true" in problem


@pytest.mark.parametrize(("actor", "critic"), [(2, 1), (1, 2), (4, 2)])
def test_ppo_refuses_a_critic_sp_size_other_than_the_actors(tmp_path: Path, actor: int, critic: int) -> None:
    model = _model(tmp_path / "m", model_type="qwen2", num_attention_heads=4, num_key_value_heads=4)
    [problem] = _problems(model, f"actor.fsdp.ulysses_sp_size={actor}", f"critic.fsdp.ulysses_sp_size={critic}",
                          job="ppo", allocation="vllm:d1+fsdp:d4")
    assert f"critic.fsdp.ulysses_sp_size={critic} differs from actor.fsdp.ulysses_sp_size={actor}" in problem
    assert f"fix: set critic.fsdp.ulysses_sp_size={actor}" in problem


def test_ppo_checks_a_critic_model_of_its_own(tmp_path: Path) -> None:
    actor = _model(tmp_path / "actor", model_type="qwen2", num_attention_heads=4, num_key_value_heads=2)
    critic = _model(tmp_path / "critic", model_type="gemma", num_attention_heads=4, num_key_value_heads=2)
    [problem] = _problems(actor, "actor.fsdp.ulysses_sp_size=2", "critic.fsdp.ulysses_sp_size=2",
                          f"critic.path={critic}", job="ppo")
    assert "critic.path is a 'gemma' model, whose attention rlkit's Ulysses does not serve" in problem


def test_kv_heads_that_neither_divide_nor_repeat_are_refused(tmp_path: Path) -> None:
    model = _model(tmp_path / "m", model_type="llama", num_attention_heads=12, num_key_value_heads=3)
    [problem] = _problems(model, "actor.fsdp.ulysses_sp_size=2")
    assert "the model's 3 KV heads: neither divides the other" in problem


@pytest.mark.parametrize("heads", ["four", None, 0, -2])
def test_a_hostile_config_json_is_named_not_a_traceback(tmp_path: Path, heads: object) -> None:
    model = _model(tmp_path / "m", model_type="qwen2", num_attention_heads=heads)
    [problem] = _problems(model, "actor.fsdp.ulysses_sp_size=2")
    assert "names no valid num_attention_heads" in problem


def test_the_submit_refuses_with_exit_2_and_writes_nothing(tiny_model_dir: Path, tmp_path: Path, rlkit_home: Path
                                                           ) -> None:
    demo = tmp_path / "demo"
    demo.mkdir()
    (demo / "tiny-model").symlink_to(tiny_model_dir)
    (demo / "digits.jsonl").write_text('{"prompt": "1+1", "answer": "2"}\n')
    env = {**os.environ, "RLKIT_DEMO_DIR": str(demo), "RLKIT_FILEROOT": str(tmp_path / "fileroot")}
    result = run_rlkit("submit", str(CONFIGS / "grpo-cpu-demo.yaml"), "actor.fsdp.ulysses_sp_size=4",
                       "actor.mb_spec.packing=false", env=env)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    for said in ("actor.fsdp.ulysses_sp_size=4 does not divide the trainer's 2 GPUs",
                 "actor.fsdp.ulysses_sp_size=4 does not divide the model's 2 attention heads",
                 "needs packed micro-batches"):
        assert said in " ".join(result.stderr.split()), result.stderr
    assert not (tmp_path / "fileroot").exists() and not rlkit_home.exists(), "nothing written"


def test_ppo_submit_refuses_a_critic_left_at_sp_1(tiny_model_dir: Path, tmp_path: Path, rlkit_home: Path) -> None:
    demo = tmp_path / "demo"
    demo.mkdir()
    (demo / "tiny-model").symlink_to(tiny_model_dir)
    (demo / "digits.jsonl").write_text('{"prompt": "1+1", "answer": "2"}\n')
    env = {**os.environ, "RLKIT_DEMO_DIR": str(demo), "RLKIT_FILEROOT": str(tmp_path / "fileroot")}
    result = run_rlkit("submit", str(CONFIGS / "ppo-cpu-demo.yaml"), "actor.fsdp.ulysses_sp_size=2", env=env)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    said = " ".join(result.stderr.split())
    assert "critic.fsdp.ulysses_sp_size=1 differs from actor.fsdp.ulysses_sp_size=2" in said, result.stderr
    assert "set critic.fsdp.ulysses_sp_size=2" in said, result.stderr
    assert not (tmp_path / "fileroot").exists() and not rlkit_home.exists(), "nothing written"
