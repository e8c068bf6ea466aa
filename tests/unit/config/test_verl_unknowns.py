"""What `rlkit migrate run.sh` cannot know from a verl script (a GPU count from the environment, a name rlkit does not
allow, a warmup whose total verl counts at run time) is refused naming verl's key and the override that fixes it,
never a bare "required field" or a refusal of a key the user never wrote; with that override the run migrates."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlkit.config.names import name_like
from rlkit.config.verl.rules import verl_to_rlkit
from rlkit.errors import ConfigError
from rlkit.jobs import REGISTRY
from tests.conftest import run_rlkit
from tests.unit.config.test_verl_migrate import GRPO_SCRIPT

ENVIRONMENT_GPUS = "NNODES=${SLURM_JOB_NUM_NODES}\nexport NNODES\n"  # verl's gspo_trainer/test_gspo_3b_math.sh


def _script(tmp_path: Path, before: str, *replaced: tuple[str, str]) -> Path:
    """GRPO_SCRIPT with `before` among its assignments and each (old, new) of its command's words replaced."""
    text = GRPO_SCRIPT.replace("MODEL=Qwen", before + "MODEL=Qwen")
    for old, new in replaced:
        assert old in text
        text = text.replace(old, new)
    script = tmp_path / "run.sh"
    script.write_text(text)
    return script


def test_gpus_from_the_environment_are_refused_naming_verl_s_keys_and_the_override(
        tmp_path: Path, site: list[str]) -> None:
    """verl's test_gspo_3b_math.sh takes its node count from Slurm's environment: the run's GPU count cannot be
    known, and the refusal was rlkit's own "required field 'allocation_mode' is not set"."""
    script = _script(tmp_path, ENVIRONMENT_GPUS, ("trainer.nnodes=1", 'trainer.nnodes="${NNODES}"'),
                     ("trainer.n_gpus_per_node=8", "trainer.n_gpus_per_node=$GPUS"))
    done = run_rlkit("migrate", str(script), *site)
    assert done.returncode == 2 and "required field" not in done.stderr
    assert "error: trainer.nnodes '$SLURM_JOB_NUM_NODES' (in " in done.stderr  # $NNODES's value: Slurm's
    assert "are not a count here; nor is trainer.n_gpus_per_node '$GPUS': a shell variable's value is known only " \
           "where verl runs" in done.stderr and "fix: pass allocation_mode=... with cluster.n_nodes=" in done.stderr
    fixed = run_rlkit("migrate", str(script), *site, "allocation_mode=vllm:d4t2+fsdp:d8", "cluster.n_nodes=2",
                      "cluster.n_gpus_per_node=8")
    assert fixed.returncode == 0, fixed.stderr
    assert "allocation_mode: vllm:d4t2+fsdp:d8" in fixed.stdout


def test_a_name_rlkit_does_not_allow_is_refused_naming_verl_s_key_and_a_name_to_pass(
        tmp_path: Path, site: list[str]) -> None:
    """verl's run_qwen3_4b_grpo_vllm_1k_npu.sh sets trainer_experiment_name="qwen3_4b_grpo_8npu}" (bash keeps the
    `}`: the script's typo, read as bash reads it): the refusal named rlkit's trial_name only."""
    script = _script(tmp_path, 'name="qwen3_4b_grpo_8npu}"\n',
                     ('trainer.experiment_name="qwen2.5_3b-grpo"', "trainer.experiment_name=${name}"),
                     ("trainer.project_name='verl_grpo_gsm8k'", "trainer.project_name=$PROJECT"))
    done = run_rlkit("migrate", str(script), *site)
    assert done.returncode == 2
    assert "error: trainer.experiment_name 'qwen3_4b_grpo_8npu}' (in " in done.stderr
    assert "fix: pass trial_name=qwen3_4b_grpo_8npu (or another allowed name)" in done.stderr
    assert "error: trainer.project_name '$PROJECT' (in " in done.stderr and ": a shell variable rlkit left " \
           "unexpanded\n  fix: pass experiment_name=PROJECT" in done.stderr
    fixed = run_rlkit("migrate", str(script), *site, "trial_name=run_1", "experiment_name=x")
    assert fixed.returncode == 0, fixed.stderr


@pytest.mark.parametrize(("value", "near"), [("a}", "a"), ("$exp_name", "exp_name"), ("my run/2", "my_run_2"),
                                             ("}}", ""), ("x" * 80, "x" * 64), ("_a b_", "a_b")])
def test_the_name_offered_is_allowed(value: str, near: str) -> None:
    assert name_like(value) == near


def test_warmup_steps_without_a_total_say_how_verl_counts_it_and_the_override() -> None:
    """verl's megatron 96gb examples give lr_warmup_steps=10 and trainer.total_epochs, no total_training_steps:
    verl counts its total when it runs (batches of the loaded data x total_epochs), rlkit's job too (after its
    length filter), so no proportion can be written here; the message says so and names the override."""
    run = {"algorithm.adv_estimator": "grpo", "actor_rollout_ref.actor.optim.lr_warmup_steps": 10,
           "trainer.total_epochs": 10, "data.train_batch_size": 64}
    with pytest.raises(ConfigError) as refused:
        verl_to_rlkit(run, "t", REGISTRY.verl_estimators)
    said = str(refused.value)
    assert "trainer.total_training_steps is unset: verl counts the total when it runs" in said, said
    assert "actor.optimizer.warmup_steps_proportion=10/TOTAL" in str(refused.value.hint)
    mapping, _ = verl_to_rlkit(run, "t", REGISTRY.verl_estimators, {"actor.optimizer.warmup_steps_proportion"})
    assert "warmup_steps_proportion" not in mapping.get("actor", {}).get("optimizer", {})
    mapping, _ = verl_to_rlkit({**run, "trainer.total_training_steps": 40}, "t", REGISTRY.verl_estimators)
    assert mapping["actor"]["optimizer"]["warmup_steps_proportion"] == 0.25
