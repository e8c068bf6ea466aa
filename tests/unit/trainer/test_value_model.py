"""The scalar-head model on the tiny model: built from a causal LM like the policy, per-token outputs, the score at
each sequence's last real token, a head identical for every load, and a save that reloads to the same outputs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from rlkit.models.value_model import last_token_scores, load_value_model, token_values
from rlkit.trainer.value_model import HEAD_NOTE, save_value_model


@pytest.fixture(scope="module")
def model(tiny_model_dir: Path) -> nn.Module:
    return load_value_model(tiny_model_dir).eval()


def test_a_causal_lm_becomes_a_one_label_token_classifier_fsdp_can_shard(model: nn.Module) -> None:
    assert type(model).__name__ == "Qwen2ForTokenClassification"
    assert isinstance(model.model.layers, nn.ModuleList)  # what sharded_load.shard_model wraps layer by layer
    assert model.score.out_features == 1 and model.dropout.p == 0.0
    assert not hasattr(model, "lm_head")


def test_the_fresh_head_is_the_same_on_every_load(model: nn.Module, tiny_model_dir: Path) -> None:
    torch.manual_seed(1234)  # the global RNG must not matter (ranks may differ in it)
    again = load_value_model(tiny_model_dir)
    assert torch.equal(again.score.weight, model.score.weight) and torch.equal(again.score.bias, model.score.bias)
    assert model.score.weight.abs().sum() > 0 and model.score.bias.abs().sum() == 0


def test_shapes_and_last_token_scores_ignore_padding(model: nn.Module) -> None:
    short, long = [5, 6, 7], [5, 6, 7, 8, 9, 10]
    ids = torch.tensor([[*short, 0, 0, 0], long])
    mask = torch.tensor([[1, 1, 1, 0, 0, 0], [1] * 6])
    with torch.no_grad():
        values = token_values(model, ids, mask)
        alone = token_values(model, torch.tensor([short]), torch.ones(1, 3, dtype=torch.long))
    assert values.shape == (2, 6) and values.dtype == torch.float32
    scores = last_token_scores(values, mask.sum(1) - 1)
    assert scores.shape == (2,)
    assert scores[0].item() == pytest.approx(alone[0, 2].item(), abs=1e-5)  # the padded row's own last token
    assert scores[1].item() == values[1, 5].item()


def test_save_and_reload_round_trip(model: nn.Module, tiny_model_dir: Path, tmp_path: Path) -> None:
    with torch.no_grad():
        model.score.weight.add_(0.5)  # a trained head, not the seeded one, must come back
    out = save_value_model(model.state_dict(), model.config, tiny_model_dir, tmp_path / "rw", kind="reward")
    assert (out / "model.safetensors").is_file() and (out / "tokenizer.json").is_file()
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["Qwen2ForTokenClassification"] and len(config["id2label"]) == 1
    assert json.loads((out / HEAD_NOTE).read_text())["kind"] == "reward" and not (tiny_model_dir / HEAD_NOTE).exists()
    reloaded = load_value_model(out).eval()
    ids = torch.tensor([[5, 6, 7, 8]])
    mask = torch.ones_like(ids)
    with torch.no_grad():
        assert torch.equal(token_values(reloaded, ids, mask), token_values(model, ids, mask))
    assert torch.equal(reloaded.score.weight, model.score.weight)
