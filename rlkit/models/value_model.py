"""Scalar-head models over a Hugging Face causal-LM backbone: a reward model (job type rw: the score at a sequence's
last token) and the PPO critic (a value per token).

Both are transformers' `AutoModelForTokenClassification` with one label: the backbone at `model.model` (decoder
layers at `model.model.layers`, so sharded_load.shard_model shards it like the policy) and a linear `score`
head giving one number per token. AutoModelForSequenceClassification also exists for these models, but it finds
the last token by looking for the first pad token, which is wrong for models whose end-of-sequence token is also
their pad token (Qwen2.5 base models); reading the per-token scores at a position the batch knows avoids that.

Loading a causal-LM checkpoint keeps its backbone, drops its LM head and adds a head drawn from a fixed seed (the
same on every rank and for every rank count); loading a saved value model keeps its head. Saved models
(rlkit.trainer.value_model.save_value_model) are a complete Hugging Face directory (safetensors weights, config.json
naming the token-classification class, tokenizer) plus `rlkit_value_head.json`, which says what the scores mean.
Here, below rewards and the trainer: a GRPO reward (`reward.fn: reward_model`) scores with it as rw trains it.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from rlkit.models.packing import PackedRows, packed_forward
from rlkit.models.source import SCRATCH_SEED, model_config

HEAD_SEED = 0


def load_value_model(path: str | Path, *, dtype: torch.dtype = torch.float32, attn_impl: str = "sdpa",
                     head_seed: int = HEAD_SEED, disable_dropout: bool = False, from_scratch: bool = False,
                     meta: bool = False) -> nn.Module:
    """A one-label token-classification model from `path` (a causal LM or a saved value model), no dropout on the
    head (values and scores must not depend on the training mode); with `disable_dropout` none anywhere, with
    `from_scratch` the architecture of `path` with random weights, with `meta` its skeleton on the meta device
    (rlkit.models.source) in the real build's mode, its fresh head drawn on the CPU first (`meta_head`)."""
    from transformers import AutoModelForTokenClassification

    config = model_config(str(path), disable_dropout=disable_dropout)
    config.num_labels = 1
    config.classifier_dropout = 0.0
    if meta:
        with torch.device("meta"):
            model = AutoModelForTokenClassification.from_config(config, dtype=dtype, attn_implementation=attn_impl)
        meta_head(model, head_seed)
        if not from_scratch:
            model.eval()  # from_pretrained's mode
        missing = False
    elif from_scratch:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(SCRATCH_SEED)
            model = AutoModelForTokenClassification.from_config(config, dtype=dtype, attn_implementation=attn_impl)
        missing = True
    else:  # transformers draws the missing head from the process's RNG (then replaced): leave the RNG as it was,
        with torch.random.fork_rng(devices=[]):  # as on the ranks that build the meta skeleton only
            model, info = AutoModelForTokenClassification.from_pretrained(
                path, config=config, dtype=dtype, attn_implementation=attn_impl, output_loading_info=True)
        missing = any(key.startswith("score.") for key in info["missing_keys"])
    if missing:
        init_head(model, head_seed)
    model.config.architectures = [type(model).__name__]  # what a save writes (it was the causal LM's)
    return model


def meta_head(model: nn.Module, seed: int) -> None:
    """The meta skeleton's head drawn as a fresh head is (`init_head`) on the CPU, then moved to the meta device:
    every rank's sharded build takes those values where the checkpoint has no head (rlkit.trainer.fresh_params),
    so no rank builds the whole model for a head of a few thousand numbers."""
    head = model.score
    assert isinstance(head, nn.Linear), f"expected a linear score head, got {type(head).__name__}"
    with torch.random.fork_rng(devices=[]):  # nn.Linear draws its own init from the process's RNG (then replaced)
        model.score = nn.Linear(head.in_features, head.out_features, bias=head.bias is not None,
                                dtype=head.weight.dtype, device="cpu")
    init_head(model, seed)
    model.score.to(torch.device("meta"))


def init_head(model: nn.Module, seed: int) -> None:
    """A fresh head: weights ~ N(0, 1/(hidden + 1)), bias 0, drawn from `seed` alone (identical on every rank)."""
    head = model.score
    assert isinstance(head, nn.Linear), f"expected a linear score head, got {type(head).__name__}"
    generator = torch.Generator().manual_seed(seed)
    std = 1.0 / math.sqrt(head.in_features + 1)
    with torch.no_grad():
        weight = torch.randn(head.weight.shape, generator=generator, dtype=torch.float32) * std
        head.weight.copy_(weight.to(head.weight.dtype))
        if head.bias is not None:
            head.bias.zero_()


def token_values(model: nn.Module, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
    """[B, L] float32: the head's output at every token (right-padded batch; padding positions are meaningless). The
    rows run packed into one when the model packs (rlkit.models.packing), the values come back padded."""
    def read(out: Any, rows: PackedRows | None) -> Tensor:
        values = out.logits.squeeze(-1).float()
        return values if rows is None else rows.unpack(values)

    return packed_forward(model, input_ids, attention_mask, read)


def last_token_scores(values: Tensor, last_index: Tensor) -> Tensor:
    """[B] each sequence's score: its [B, L] per-token output at `last_index` (the sequence's last real token)."""
    return values.gather(1, last_index.long().unsqueeze(1)).squeeze(1)
