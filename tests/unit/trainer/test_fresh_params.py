"""rlkit.trainer.fresh_params with slice_plan on a LoRA actor's meta skeleton (one process): each base entry read from
the checkpoint under its own name (peft's prefix and `.base_layer.` dropped, tied embeddings once), the adapter
drawn by the meta build itself with exactly the full build's values, and a reason (the full build) where the
checkpoint lacks a base weight or nothing drew the adapter. The sharded build on 1 and 2 ranks, bitwise against
today's, is test_sharded_load's."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from torch import nn

from rlkit.config.schema.actor import ActorConfig
from rlkit.trainer.checkpoint_slices import slice_plan
from rlkit.trainer.engine import lora_causal_lm, value_head_model
from rlkit.trainer.fresh_params import FreshCapture, checkpoint_names
from tests.helpers.checkpoint_variants import checkpoint_variant

META = torch.device("meta")


def lora_actor(path: Path) -> ActorConfig:
    return ActorConfig(path=str(path), dtype="float32", attn_impl="sdpa", use_lora=True, lora_rank=4, lora_alpha=8,
                       target_modules=["q_proj", "v_proj"])


def captured_skeleton(path: Path) -> tuple[nn.Module, dict[str, torch.Tensor]]:
    with FreshCapture() as capture:
        skeleton = lora_causal_lm(lora_actor(path), META)
    return skeleton, capture.values(skeleton)


@pytest.mark.parametrize("tied", [False, True])
def test_a_lora_skeleton_reads_its_base_under_the_checkpoints_names_and_draws_the_adapter_as_the_full_build(
        tied: bool, tiny_model_dir: Path, tied_model_dir: Path) -> None:
    path = tied_model_dir if tied else tiny_model_dir
    skeleton, fresh = captured_skeleton(path)
    full = lora_causal_lm(lora_actor(path), torch.device("cpu"))
    adapter = {name: tensor for name, tensor in full.state_dict().items() if ".lora_" in name}
    layers = full.config.num_hidden_layers
    assert sorted(fresh) == sorted(adapter) and len(adapter) == 4 * layers  # q_proj and v_proj: A and B
    assert all(torch.equal(fresh[name], adapter[name]) and fresh[name].dtype == adapter[name].dtype for name in fresh)
    assert any(value.abs().sum() > 0 for value in fresh.values())  # A is drawn, not zeros

    plan = slice_plan(skeleton, str(path), fresh)
    assert isinstance(plan, list), plan
    keys = {entry.name: entry.key for entry in plan}
    head = {"base_model.model.lm_head.weight"} if tied else set()  # tied: the embedding's entry, read once
    assert sorted(set(keys) | set(fresh) | head) == sorted(skeleton.state_dict()) and not set(keys) & set(fresh)
    assert keys["base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight"] == \
        "model.layers.0.self_attn.q_proj.weight"
    assert keys["base_model.model.model.layers.0.self_attn.k_proj.weight"] == "model.layers.0.self_attn.k_proj.weight"
    assert ("base_model.model.lm_head.weight" in keys) != tied
    assert list(keys.values()).count("model.embed_tokens.weight") == 1
    base, mapped = checkpoint_names(skeleton)
    with safe_open(str(path / "model.safetensors"), framework="pt") as handle:
        stored = set(handle.keys())
    assert base is skeleton.get_base_model()
    assert {key for name, key in mapped.items() if name not in fresh} == stored | {"lm_head.weight"}


def test_a_lora_base_weight_the_checkpoint_lacks_or_an_adapter_nothing_drew_says_why(tiny_model_dir: Path,
                                                                                     tmp_path: Path) -> None:
    skeleton, fresh = captured_skeleton(tiny_model_dir)
    missing = "model.layers.0.self_attn.q_proj.bias"
    out = checkpoint_variant(tiny_model_dir, tmp_path / "m", lambda t: {k: v for k, v in t.items() if k != missing})
    assert slice_plan(skeleton, str(out), fresh) == \
        "base_model.model.model.layers.0.self_attn.q_proj.base_layer.bias: 0 checkpoint tensors"
    got = slice_plan(skeleton, str(tiny_model_dir))  # no values drawn: A and B are in no checkpoint
    assert isinstance(got, str) and "lora_A.default.weight: 0 checkpoint tensors" in got, got


def test_a_plain_model_keeps_its_own_names_and_a_meta_build_draws_nothing(tiny_model_dir: Path) -> None:
    from rlkit.models.source import build_causal_lm

    with FreshCapture() as capture:
        model = build_causal_lm(str(tiny_model_dir), dtype=torch.float32, attn_impl="sdpa", meta=True)
    assert capture.values(model) == {}
    base, mapped = checkpoint_names(model)
    assert base is model and all(key == name for key, name in mapped.items()) and len(mapped) > 20


def value_actor(path: Path) -> ActorConfig:
    return ActorConfig(path=str(path), dtype="float32", attn_impl="sdpa")


def test_a_value_skeleton_draws_the_full_builds_head_and_drops_only_the_lm_head(tiny_model_dir: Path,
                                                                               tmp_path: Path) -> None:
    with FreshCapture() as capture:
        skeleton = value_head_model(value_actor(tiny_model_dir), META)
    fresh = capture.values(skeleton)
    full = value_head_model(value_actor(tiny_model_dir), torch.device("cpu"))
    assert sorted(fresh) == ["score.bias", "score.weight"] and all(value.device.type == "cpu"
                                                                   for value in fresh.values())
    assert all(torch.equal(fresh[name], full.state_dict()[name]) for name in fresh)
    assert fresh["score.weight"].abs().sum() > 0 and not skeleton.training and not full.training
    plan = slice_plan(skeleton, str(tiny_model_dir), fresh)
    assert isinstance(plan, list) and {entry.key for entry in plan} == set(full.state_dict()) - set(fresh), plan
    # a key outside the backbone is the causal LM's head, dropped; one inside it is a name that is off
    extra = checkpoint_variant(tiny_model_dir, tmp_path / "m", lambda t: {**t, "model.extra.weight": torch.zeros(2)})
    assert slice_plan(skeleton, str(extra), fresh) == "the model has no model.extra.weight"
    assert slice_plan(skeleton, str(tiny_model_dir)) == \
        "score.weight: 0 checkpoint tensors; score.bias: 0 checkpoint tensors"  # no head drawn: in no checkpoint
