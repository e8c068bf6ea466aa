"""AReaL's actor.disable_dropout and actor.init_from_scratch (rlkit.models.source): the model the trainer
builds has no dropout left, or starts from the same random weights on every rank; init_from_scratch is refused
where other parts load actor.path's weights."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from rlkit.config.load import load_config
from rlkit.jobs.validate import validate
from rlkit.models.source import build_causal_lm
from rlkit.models.value_model import load_value_model


@pytest.fixture
def dropout_model(tiny_model_dir: Path, tmp_path: Path) -> Path:
    """The tiny model with attention dropout 0.5 in its config.json."""
    model = tmp_path / "dropout-model"
    shutil.copytree(tiny_model_dir, model)
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "attention_dropout": 0.5}))
    return model


def _two_training_forwards(model: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    model.train()
    ids = torch.arange(1, 17).unsqueeze(0)
    return model(input_ids=ids).logits, model(input_ids=ids).logits


def test_disable_dropout_makes_training_forwards_deterministic(dropout_model: Path) -> None:
    kept = build_causal_lm(str(dropout_model), dtype=torch.float32, attn_impl="eager")
    first, second = _two_training_forwards(kept)
    assert not torch.equal(first, second), "the model's own dropout is active in training mode"
    off = build_causal_lm(str(dropout_model), dtype=torch.float32, attn_impl="eager", disable_dropout=True)
    assert off.config.attention_dropout == 0.0
    first, second = _two_training_forwards(off)
    assert torch.equal(first, second)
    assert all(torch.equal(a, b) for a, b in zip(kept.state_dict().values(), off.state_dict().values(), strict=True))
    value = load_value_model(dropout_model, attn_impl="eager", disable_dropout=True).train()
    ids = torch.arange(1, 17).unsqueeze(0)
    assert torch.equal(value(input_ids=ids).logits, value(input_ids=ids).logits)


def test_init_from_scratch_is_random_yet_the_same_everywhere(tiny_model_dir: Path) -> None:
    pretrained = build_causal_lm(str(tiny_model_dir), dtype=torch.float32, attn_impl="sdpa")
    torch.manual_seed(1)
    scratch = build_causal_lm(str(tiny_model_dir), dtype=torch.float32, attn_impl="sdpa", from_scratch=True)
    torch.manual_seed(2)  # another rank's RNG state: the start does not depend on it
    again = build_causal_lm(str(tiny_model_dir), dtype=torch.float32, attn_impl="sdpa", from_scratch=True)
    names = [n for n, _ in pretrained.named_parameters()]
    weights = dict(pretrained.named_parameters())
    assert [n for n, _ in scratch.named_parameters()] == names, "the same architecture"
    assert all(torch.equal(p, q) for p, q in zip(scratch.parameters(), again.parameters(), strict=True))
    differ = [n for n, p in scratch.named_parameters() if not torch.equal(p, weights[n]) and p.std() > 0]
    assert len(differ) >= len(names) // 2, "random, not actor.path's weights"
    value = load_value_model(tiny_model_dir, from_scratch=True)
    assert all(torch.equal(p, q) for p, q in zip(value.parameters(), load_value_model(tiny_model_dir, from_scratch=True)
                                                  .parameters(), strict=True))


def test_init_from_scratch_is_refused_where_actor_path_weights_are_loaded_elsewhere(grpo_yaml: Path) -> None:
    errors = [str(e) for e in validate(load_config(grpo_yaml, ["actor.init_from_scratch=true"])).problems.errors]
    assert any("actor.init_from_scratch with job type grpo: its servers start from actor.path's weights" in e
               for e in errors), errors
    assert not any("init_from_scratch" in str(e) for e in validate(load_config(grpo_yaml)).problems.errors)


def test_the_trainers_model_factories_read_the_fields(dropout_model: Path) -> None:
    """The actor's factory (and the critic's engine view) pass the settings down to the model build."""
    from rlkit.config.schema.actor import ActorConfig
    from rlkit.config.schema.critic import CriticConfig
    from rlkit.jobs.ppo.critic import critic_engine_config
    from rlkit.trainer.engine import actor_model_factory

    actor = ActorConfig(path=str(dropout_model), attn_impl="eager", gradient_checkpointing=False, disable_dropout=True)
    model = actor_model_factory(actor)(actor, torch.device("cpu"))
    assert model.config.attention_dropout == 0.0
    kept = ActorConfig(path=str(dropout_model), attn_impl="eager", gradient_checkpointing=False)
    assert actor_model_factory(kept)(kept, torch.device("cpu")).config.attention_dropout == 0.5
    critic = critic_engine_config(CriticConfig(disable_dropout=True), kept)
    assert critic.disable_dropout and not critic.init_from_scratch
