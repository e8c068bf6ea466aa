"""`rlkit migrate` of verl's keys on what a run's prompts are made of and what its reward adds
(rlkit.config.verl.inputs, rlkit.config.verl.overlong, the router replay of rlkit.config.verl.learning), and of the keys
after a `$((...))` (rlkit.config.verl.source): each was "unknown", left out or unread with exit 0, so a vision-language
run became a text-only one, a MoE run lost its router replay, prompts verl cut were dropped, and DAPO's overlong
penalty was dropped from the reward. Now each is refused naming why, or moved (DAPO's penalty, checked against verl's
formula for many lengths), or left out saying why nothing learned changes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from rlkit.config.verl.rules import verl_to_rlkit
from rlkit.config.verl.source import read_script
from rlkit.errors import ConfigError
from rlkit.jobs import REGISTRY
from rlkit.launch.submit import prepare
from rlkit.trainer.rl_math.advantages import overlong_penalty
from tests.conftest import run_rlkit
from tests.unit.config.test_verl_learning import _config, _mapping, _script
from tests.unit.config.test_verl_migrate import _migrated, _said

KW = "+reward_model.reward_kwargs"
DAPO = ("reward_model.reward_manager=dapo", f"{KW}.overlong_buffer_cfg.enable=True",
        f"{KW}.overlong_buffer_cfg.penalty_factor=1.0", f"{KW}.overlong_buffer_cfg.log=False")


def _fates(*lines: str, script: str | None = None) -> dict[str, str]:
    leaves = read_script(script or _script(*lines), "t").leaves
    _, fates = verl_to_rlkit(leaves, "t", REGISTRY.verl_estimators)
    return {f.key: f.fate for f in fates}


def _refused(*lines: str, script: str | None = None) -> str:
    with pytest.raises(ConfigError) as info:
        verl_to_rlkit(read_script(script or _script(*lines), "t").leaves, "t", REGISTRY.verl_estimators)
    return " ".join(str(info.value).split())


def test_a_vision_language_run_exits_2_saying_rlkit_trains_text_only(tmp_path: Path, site: list[str]) -> None:
    """verl's geo3k scripts name the rows' image column (data.image_key): migrated, the run trained on the text."""
    script = tmp_path / "run.sh"
    script.write_text(_script("data.image_key=images"))
    refused = run_rlkit("migrate", str(script), *site)
    said = " ".join(refused.stderr.split())
    assert refused.returncode == 2 and refused.stdout == "" and "Traceback" not in refused.stderr, refused.stderr
    assert "data.image_key 'images'" in said and "rlkit trains text-only models" in said
    assert "if the rows hold no images or videos (a text-only run), remove it" in said


@pytest.mark.parametrize("line", ["data.video_key=videos", "data.image_patch_size=28",
                                  "data.return_multi_modal_inputs=False",
                                  "actor_rollout_ref.actor.freeze_vision_tower=True"])
def test_every_multimodal_key_is_refused(line: str) -> None:
    assert "a vision-language run" in _refused(line)


def test_a_whole_verl_config_s_multimodal_defaults_are_left_out_and_its_choices_refused() -> None:
    """A Hydra dump of a text-only run writes data.image_key: images and the rest of verl's defaults; a script's key
    is its own choice (verl's geo3k scripts write image_key=images): refused there."""
    leaves = {"algorithm.adv_estimator": "grpo", "data.image_key": "images", "data.video_key": "videos",
              "data.image_patch_size": 14, "data.return_multi_modal_inputs": True}
    _, fates = verl_to_rlkit(leaves, "t", REGISTRY.verl_estimators, whole_config=True)
    said = {f.key: f.fate for f in fates}
    assert all(said[key].startswith("left out (verl's default, which a whole config file writes") for key in leaves
               if key.startswith("data."))
    for key, value in (("data.image_key", "image"), ("data.image_patch_size", 28)):
        with pytest.raises(ConfigError) as info:
            verl_to_rlkit({**leaves, key: value}, "t", REGISTRY.verl_estimators, whole_config=True)
        assert f"{key} {value!r} (t): a vision-language run" in str(info.value)
    with pytest.raises(ConfigError):
        verl_to_rlkit(leaves, "t", REGISTRY.verl_estimators)  # a script's keys: refused


def test_a_critic_warmup_is_refused_and_its_default_left_out() -> None:
    """verl updates the actor only from step critic_warmup on (ray_trainer.py fit): dropped, the actor trained
    from the first step."""
    assert "verl trains only the critic for the first critic_warmup steps" in _refused("trainer.critic_warmup=10")
    assert _fates("trainer.critic_warmup=0")["trainer.critic_warmup"].startswith("left out (0: verl's default")


def test_a_text_model_s_vision_tower_switch_left_at_false_is_left_out() -> None:
    fate = _fates("actor_rollout_ref.actor.freeze_vision_tower=False")["actor_rollout_ref.actor.freeze_vision_tower"]
    assert fate.startswith("left out (false: verl's default")


def test_moe_router_replay_is_refused_and_its_recorder_alone_left_out() -> None:
    """verl's R2/R3 fix each token's experts in the training forwards (verl/workers/actor/megatron_actor.py)."""
    said = _refused("actor_rollout_ref.actor.router_replay.mode=R3")
    assert "actor_rollout_ref.actor.router_replay.mode 'R3' (t): verl's MoE router replay" in said
    assert "set it disabled" in said
    assert "router_replay.mode '$MODE'" in _refused("actor_rollout_ref.actor.router_replay.mode=$MODE")
    fates = _fates("actor_rollout_ref.actor.router_replay.mode=disabled",
                   "actor_rollout_ref.actor.router_replay.record_file=/r.pt",
                   "actor_rollout_ref.ref.router_replay.mode=R2",
                   "actor_rollout_ref.rollout.enable_rollout_routing_replay=True")
    assert fates["actor_rollout_ref.actor.router_replay.mode"] == "left out (disabled: verl's default, off)"
    for key in ("actor_rollout_ref.actor.router_replay.record_file", "actor_rollout_ref.ref.router_replay.mode",
                "actor_rollout_ref.rollout.enable_rollout_routing_replay"):
        assert fates[key].startswith("left out ("), (key, fates[key])


def _truncating(truncation: str, filtered: str) -> str:
    return _script().replace("data.truncation='error'", f"data.truncation={truncation}") \
        .replace("data.filter_overlong_prompts=True", f"data.filter_overlong_prompts={filtered}")


@pytest.mark.parametrize("side", ["left", "right", "middle"])
def test_a_prompt_verl_truncates_and_rlkit_drops_is_refused(side: str) -> None:
    said = _refused(script=_truncating(side, "False"))
    assert f"data.truncation '{side}' (t): verl keeps" in said and "rlkit drops such prompts" in said
    assert "set data.filter_overlong_prompts=True to drop them as rlkit does" in said


def test_truncation_that_never_cuts_a_prompt_is_left_out() -> None:
    # verl's filter drops the long prompts first, as rlkit does
    assert "data.filter_overlong_prompts drops every prompt" in _fates(script=_truncating("left", "True"))[
        "data.truncation"]
    # error: a run verl completes has no prompt over the limit
    assert _fates(script=_truncating("error", "False"))["data.truncation"].startswith("left out (error: verl stops")
    assert "not one of verl's truncations" in _refused(script=_truncating("sideways", "False"))


def _verl_dapo_reward(score: float, length: int, *, max_resp_len: int, buffer: int, factor: float) -> float:
    """verl's DAPO reward of a response of `length` tokens, from its definition
    (verl/experimental/reward_loop/reward_manager/dapo.py DAPORewardManager.run_single)."""
    expected_len = max_resp_len - buffer
    exceed_len = length - expected_len
    return score + min(-exceed_len / buffer * factor, 0)


@pytest.mark.parametrize(("max_resp_len", "buffer", "factor", "longest", "converted"), [
    (1024, 256, 1.0, 1024, False),  # verl's DAPO scripts: max_resp_len is data.max_response_length
    (900, 256, 0.5, 1024, True),  # the penalty starts at 644 and grows past 0.5 by the longest response
    (1100, 256, 2.0, 1024, True),  # starts at 844: never reaches the full factor
])
def test_dapo_s_overlong_penalty_migrates_to_rlkit_s_with_the_same_reward_at_every_length(
        tmp_path: Path, site: list[str], max_resp_len: int, buffer: int, factor: float, longest: int,
        converted: bool) -> None:
    """Through `rlkit migrate` and rlkit's own penalty function: the migrated run's reward equals verl's for every
    response length up to data.max_response_length (rlkit.config.verl.overlong)."""
    script = _script("reward_model.reward_manager=dapo", f"{KW}.overlong_buffer_cfg.enable=True",
                     f"{KW}.overlong_buffer_cfg.len={buffer}", f"{KW}.overlong_buffer_cfg.penalty_factor={factor}",
                     f"{KW}.overlong_buffer_cfg.log=False", f"{KW}.max_resp_len={max_resp_len}")
    path = tmp_path / "run.sh"
    path.write_text(script.replace("data.max_response_length=1024", f"data.max_response_length={longest}"))
    config, said = _config_of(tmp_path, site, path)
    actor = config.actor
    assert actor.overlong_reward_penalty and config.gconfig.max_new_tokens == longest
    lengths = [0, 1, 500, 643, 644, 645, 700, 767, 768, 769, 843, 844, 900, 1000, 1023, 1024]
    for score in (1.0, 0.0, -1.0):
        ours = overlong_penalty(torch.full((len(lengths),), score, dtype=torch.float64), torch.tensor(lengths),
                                max_new_tokens=config.gconfig.max_new_tokens, overlong_tokens=actor.overlong_tokens,
                                overlong_penalty_factor=actor.overlong_penalty_factor)
        theirs = [_verl_dapo_reward(score, n, max_resp_len=max_resp_len, buffer=buffer, factor=factor)
                  for n in lengths]
        assert ours.tolist() == pytest.approx(theirs, abs=1e-12)
    fate = said["reward_model.reward_kwargs.overlong_buffer_cfg.len"]
    assert fate.startswith("moved to actor.overlong_tokens") and ("converted" in fate) == converted


def _config_of(tmp_path: Path, site: list[str], script: Path) -> tuple[Any, dict[str, str]]:
    text = _migrated(script, site)
    clean = tmp_path / "clean.yaml"
    clean.write_text(text)
    return prepare(clean, [], dry_run=True).config, _said(text)


def test_dapo_s_penalty_off_or_out_of_reach_or_under_another_manager_is_left_out(tmp_path: Path,
                                                                                  site: list[str]) -> None:
    config, said = _config(tmp_path, site, *DAPO, f"{KW}.overlong_buffer_cfg.len=256", f"{KW}.max_resp_len=2000")
    assert not config.actor.overlong_reward_penalty  # it starts at 1744, past the longest response (1024)
    assert "no response reaches DAPO's penalty" in said["reward_model.reward_kwargs.overlong_buffer_cfg.enable"]
    naive = [line.replace("=dapo", "=naive") for line in DAPO]
    config, said = _config(tmp_path, site, *naive, f"{KW}.overlong_buffer_cfg.len=256", f"{KW}.max_resp_len=1024")
    assert not config.actor.overlong_reward_penalty
    assert "dapo reward manager only" in said["reward_model.reward_kwargs.overlong_buffer_cfg.enable"]


def test_dapo_s_penalty_with_values_rlkit_cannot_read_is_refused() -> None:
    said = _refused("reward_model.reward_manager=dapo", f"{KW}.overlong_buffer_cfg.enable=$enable_overlong_buffer")
    assert "overlong_buffer_cfg.enable '$enable_overlong_buffer' (t): not true or false" in said
    said = _refused(*DAPO, f"{KW}.overlong_buffer_cfg.len=$overlong_buffer_len", f"{KW}.max_resp_len=4096")
    assert "overlong_buffer_cfg.len '$overlong_buffer_len' (t): not a whole number > 0" in said
    said = _refused("reward_model.reward_manager=${reward_manager}", *DAPO[1:])  # verl's gspo scripts
    assert "reward_model.reward_manager '$reward_manager' (t): not a name rlkit can read" in said
    said = _refused(*DAPO, f"{KW}.overlong_buffer_cfg.len=256")
    assert "max_resp_len None (t): not a whole number > 0, which verl's dapo manager needs" in said


def test_the_data_and_reward_knobs_that_change_what_is_learned_are_refused() -> None:
    assert "verl trains on that many rows drawn at random" in _refused("data.train_max_samples=1000")
    said = _refused("data.gen_batch_size=1024")  # the script's train_batch_size is 512
    assert "data.gen_batch_size 1024 (t): verl's loader draws this many prompts" in said
    assert "set data.train_batch_size=1024" in said
    said = _refused("reward_model.reward_loop_source=importlib", "reward_model.reward_loop_module_path=/m.py",
                    "reward_model.reward_loop_class_name=Mine")
    assert "a reward manager class of your own" in said and "reward_loop_module_path" not in said.split("(t)")[0]
    said = _refused("reward_manager.source=importlib", "reward_manager.name=Mine", "reward_manager.module.path=/m.py")
    assert "reward_manager.source 'importlib' (t): a reward manager class of your own" in said
    fates = _fates("reward_manager.name=dapo", f"{KW}.overlong_buffer_cfg.enable=False")  # verl's newer name
    assert fates["reward_model.reward_kwargs.overlong_buffer_cfg.enable"] == "left out (false: no overlong penalty)"
    fates = _fates("data.train_max_samples=-1", "data.val_max_samples=100", "data.gen_batch_size=512",
                   "data.seed=7", "reward_model.sandbox_fusion.url=http://sandbox")
    assert all(fates[k].startswith("left out (") for k in ("data.train_max_samples", "data.val_max_samples",
                                                           "data.gen_batch_size", "data.seed",
                                                           "reward_model.sandbox_fusion.url")), fates


def test_a_reward_function_name_without_its_file_keeps_verl_s_default_scorer() -> None:
    """custom_reward_function.name alone (verl reads it only with a path) was moved to reward.fn as the name."""
    mapping = _mapping("custom_reward_function.name=compute_score")
    assert mapping["reward"]["fn"] == "math"  # type: ignore[index]


def test_keys_after_an_arithmetic_expansion_are_read(tmp_path: Path, site: list[str]) -> None:
    """verl's scripts write `max_num_batched_tokens=$((max_prompt_length + max_response_length))`: its parentheses
    ended the command there, and every key after it went unread (dropped, exit 0)."""
    config, said = _config(tmp_path, site, "actor_rollout_ref.rollout.max_num_batched_tokens=$((a + b))",
                           "actor_rollout_ref.actor.optim.lr=3e-6", "actor_rollout_ref.rollout.temperature=0.7")
    assert (config.actor.optimizer.lr, config.gconfig.temperature) == (3e-6, 0.7)
    assert said["actor_rollout_ref.rollout.max_num_batched_tokens"].startswith("left out (vLLM's option")
    script = tmp_path / "run.sh"
    script.write_text(_script("actor_rollout_ref.rollout.max_num_batched_tokens=$((a + b))", "data.image_key=images"))
    refused = run_rlkit("migrate", str(script), *site)
    assert refused.returncode == 2 and "data.image_key 'images'" in refused.stderr, refused.stderr
    script.write_text(_script("actor_rollout_ref.rollout.max_num_batched_tokens=$((a + b))"))
    assert "#   $((a + b)) in actor_rollout_ref.rollout.max_num_batched_tokens" in _migrated(script, site)
