"""`rlkit migrate` of verl's optimizer, evaluation-sampling and off-policy keys (rlkit.config.verl.learning): they
were "unknown" (exit 0) or left at rlkit's defaults, so a migrated run trained with other betas, warmup, weight decay
and learning rate than verl's, or from another reward, under the same name. Now each is moved (verl's default written
where the run relies on it), or refused naming why, and an unknown key among the algorithm's knobs is refused."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rlkit.config.verl.rules import verl_to_rlkit
from rlkit.config.verl.source import read_script
from rlkit.errors import ConfigError
from rlkit.jobs import REGISTRY
from rlkit.launch.submit import prepare
from tests.unit.config.test_verl_migrate import GRPO_SCRIPT, _migrated, _said

OPTIM = "actor_rollout_ref.actor.optim"
VAL = "actor_rollout_ref.rollout.val_kwargs"


def _script(*lines: str) -> str:
    """verl's GRPO example with `lines` (key=value) added, the made-up knob it tests taken out."""
    return GRPO_SCRIPT.replace("    actor_rollout_ref.actor.made_up_knob=3 \\\n",
                               "".join(f"    {line} \\\n" for line in lines))


def _config(tmp_path: Path, site: list[str], *lines: str) -> tuple[Any, dict[str, str]]:
    script = tmp_path / "run.sh"
    script.write_text(_script(*lines))
    text = _migrated(script, site)
    clean = tmp_path / "clean.yaml"
    clean.write_text(text)
    return prepare(clean, [], dry_run=True).config, _said(text)


def _mapping(*lines: str) -> dict[str, object]:
    mapping, _ = verl_to_rlkit(read_script(_script(*lines), "t").leaves, "t", REGISTRY.verl_estimators)
    return mapping


def test_the_optimizer_s_knobs_and_verl_s_defaults_move(tmp_path: Path, site: list[str]) -> None:
    config, said = _config(tmp_path, site, f"{OPTIM}.betas=[0.9,0.98]", f"{OPTIM}.lr_warmup_steps=10",
                           f"{OPTIM}.lr_warmup_steps_ratio=0.5", f"{OPTIM}.lr_scheduler_type=cosine",
                           "trainer.total_training_steps=40")
    opt = config.actor.optimizer
    assert (opt.beta1, opt.beta2, opt.eps) == (0.9, 0.98, 1e-8)
    assert (opt.warmup_steps_proportion, opt.lr_scheduler_type) == (0.25, "cosine")  # 10 of 40 steps
    assert "lr_warmup_steps is set and wins" in said[f"{OPTIM}.lr_warmup_steps_ratio"]
    # left unset, verl's defaults: weight decay 0.01, betas (0.9, 0.999), no warmup
    config, said = _config(tmp_path, site)
    opt = config.actor.optimizer
    assert (opt.weight_decay, opt.beta1, opt.beta2, opt.warmup_steps_proportion) == (0.01, 0.9, 0.999, 0.0)
    assert said[f"{OPTIM}.weight_decay"] == "moved to actor.optimizer.weight_decay as 0.01, verl's default"


def test_validation_sampling_moves_greedy_by_default(tmp_path: Path, site: list[str]) -> None:
    config, said = _config(tmp_path, site)
    ev = config.eval_gconfig
    assert (ev.greedy, ev.n_samples) == (True, 1)  # verl validates greedily, once per prompt
    assert "verl validates greedily by default" in said[f"{VAL}.do_sample"]
    config, _ = _config(tmp_path, site, f"{VAL}.do_sample=True", f"{VAL}.temperature=0.6", f"{VAL}.top_p=0.95",
                        f"{VAL}.n=4")
    ev = config.eval_gconfig
    assert (ev.greedy, ev.temperature, ev.top_p, ev.n_samples) == (False, 0.6, 0.95, 4)


@pytest.mark.parametrize(("line", "says"), [
    (f"{OPTIM}.lr_warmup_steps=10", "lr_warmup_steps 10 (t): rlkit's warmup is a fraction"),
    (f"{OPTIM}.optimizer=SGD", f"{OPTIM}.optimizer 'SGD' (t): not built"),
    (f"{OPTIM}.made_up=1", f"{OPTIM}.made_up 1 (t): not a verl key rlkit's key map knows, in a section whose keys"),
    ("algorithm.rollout_correction.rollout_is=token", "rollout importance-sampling correction is not rlkit's"),
    ("algorithm.use_pf_ppo=True", "PF-PPO's reweighting"),
    ("actor_rollout_ref.rollout.multi_turn.enable=True", "multi-turn tool rollouts are not rlkit's"),
    ("data.apply_chat_template_kwargs.reasoning_effort=medium", "the chat template's arguments change the prompts"),
    ("actor_rollout_ref.model.override_config.max_position_embeddings=32768", "overrides of the model's config"),
])
def test_keys_that_change_learning_and_rlkit_lacks_are_refused(line: str, says: str) -> None:
    with pytest.raises(ConfigError) as info:
        _mapping(line)
    assert says in str(info.value)


def test_defaults_and_infrastructure_are_left_out_and_an_unknown_elsewhere_stays_unknown() -> None:
    _, fates = verl_to_rlkit(read_script(_script(
        "algorithm.rollout_correction.rollout_is=null", "algorithm.rollout_correction.rollout_is_threshold=2.0",
        "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2", "global_profiler.tool=nsys",
        "actor_rollout_ref.rollout.engine_kwargs.vllm.disable_mm_preprocessor_cache=True",
        "actor_rollout_ref.actor.use_torch_compile=False", "trainer.made_up=1"), "t").leaves, "t",
        REGISTRY.verl_estimators)
    said = {f.key: f.fate for f in fates}
    threshold = said["algorithm.rollout_correction.rollout_is_threshold"]
    assert threshold.startswith("left out (algorithm.rollout_correction.rollout_is and")
    assert said["actor_rollout_ref.actor.megatron.tensor_model_parallel_size"].startswith("left out (Megatron's")
    assert said["global_profiler.tool"] == "left out (verl's profiler)"
    assert said["actor_rollout_ref.rollout.engine_kwargs.vllm.disable_mm_preprocessor_cache"].startswith("left out")
    assert said["actor_rollout_ref.actor.use_torch_compile"] == "left out (a kernel choice)"
    assert said["trainer.made_up"].startswith("unknown: ")


def test_dapo_s_group_filter_is_refused_unless_the_user_takes_rlkit_s_dynamic_sampling() -> None:
    """verl's DAPO filter (algorithm.filter_groups) refills the batch with new groups; rlkit's dynamic_sampling drops
    the flat ones and trains on fewer: it was an unknown key (dropped, the run trained on flat groups too), now
    refused, or left out for the user's actor.dynamic_sampling override; off (verl's default), left out."""
    lines = ("algorithm.filter_groups.enable=True", "algorithm.filter_groups.metric=acc",
             "algorithm.filter_groups.max_num_gen_batches=10")
    with pytest.raises(ConfigError) as info:
        _mapping(*lines)
    said = " ".join(str(info.value).split())
    assert "algorithm.filter_groups.enable True (t): verl's DAPO filter refills the batch" in said
    assert "pass actor.dynamic_sampling=true" in said and "metric" not in said
    leaves = read_script(_script(*lines), "t").leaves
    _, fates = verl_to_rlkit(leaves, "t", REGISTRY.verl_estimators, {"actor.dynamic_sampling"})
    fate = {f.key: f.fate for f in fates}
    assert fate["algorithm.filter_groups.enable"].endswith("your actor.dynamic_sampling override is used)")
    assert fate["algorithm.filter_groups.metric"] == "left out (with algorithm.filter_groups.enable)"
    _, fates = verl_to_rlkit(read_script(_script("algorithm.filter_groups.enable=False",
                                                 "algorithm.filter_groups.metric=acc"), "t").leaves, "t",
                             REGISTRY.verl_estimators)
    assert {f.key: f.fate for f in fates}["algorithm.filter_groups.metric"] == \
        "left out (filter_groups.enable is false, verl's default)"


def test_megatron_s_lr_decay_style_is_rlkit_s_schedule() -> None:
    """verl's megatron optim config names the schedule lr_decay_style (constant its default, written by verl's
    run_qwen3moe-30b_megatron_96gb.sh): it was refused as a key rlkit's map does not know. Linear and cosine decay
    to lr 0 by the run's last step as rlkit's do; a min_lr or lr_decay_steps of megatron's is not rlkit's."""
    for style in ("constant", "linear", "cosine"):
        mapping = _mapping(f"{OPTIM}.lr_decay_style={style}")
        assert mapping["actor"]["optimizer"]["lr_scheduler_type"] == style  # type: ignore[index]
    for other in (f"{OPTIM}.lr_decay_style=inverse_square_root", f"{OPTIM}.lr_decay_style=cosine "
                                                                 f"{OPTIM}.lr_decay_steps=100",
                  f"{OPTIM}.lr_decay_style=linear {OPTIM}.lr_scheduler_type=cosine"):
        with pytest.raises(ConfigError, match="lr_decay_style"):
            _mapping(*other.split())
