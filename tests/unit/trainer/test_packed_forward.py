"""Packed forwards (rlkit.models.packing) on the tiny model: the use_cache trap, packed equals padded for log-probs
and a value model's outputs, the head seeing real tokens only, and the fallback of a model that cannot pack."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from rlkit.models.packing import pack_rows, packs, set_packing
from rlkit.models.value_model import load_value_model, token_values
from rlkit.trainer.engine import load_causal_lm
from rlkit.trainer.head_logprobs import model_token_logprobs
from rlkit.trainer.rl_math.losses import next_token_logprobs


@pytest.fixture(scope="module")
def model(tiny_model_dir: Path) -> nn.Module:
    return load_causal_lm(str(tiny_model_dir), dtype=torch.float32, attn_impl="sdpa", disable_dropout=True)


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(1, 500, (3, 12), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, 7:] = 0
    mask[2, 4:] = 0
    return ids, mask


def _padded(model: nn.Module, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    set_packing(model, False)
    try:
        return model_token_logprobs(model, ids, mask, chunk_tokens=0)[0].detach()
    finally:
        set_packing(model, True)


def test_the_use_cache_trap_attends_across_rows_and_the_fix_does_not(model: nn.Module) -> None:
    ids, mask = _batch()
    want = _padded(model, ids, mask)
    rows = pack_rows(ids, mask)
    assert rows is not None
    trained = mask[:, 1:].bool()
    with torch.no_grad():
        for use_cache, wrong in ((None, True), (False, False)):
            kwargs = {} if use_cache is None else {"use_cache": use_cache}  # None: the model's default (a cache)
            out = model(input_ids=rows.input_ids, position_ids=rows.position_ids, **kwargs)
            got = rows.unpack_next(next_token_logprobs(out.logits, rows.input_ids, 1.0))
            error = float((got - want)[trained].abs().max())
            first_row = float((got - want)[0][trained[0]].abs().max())
            assert first_row < 1e-5  # the first row has nothing before it either way
            assert (error > 0.05) if wrong else (error < 1e-5), f"use_cache={use_cache}: {error}"


@pytest.mark.parametrize("chunk", [0, 4])
def test_packed_logprobs_equal_padded_and_padding_is_zero(model: nn.Module, chunk: int) -> None:
    ids, mask = _batch()
    set_packing(model, False)
    want, want_entropy = model_token_logprobs(model, ids, mask, chunk_tokens=chunk, with_entropy=True)
    set_packing(model, True)
    got, entropy = model_token_logprobs(model, ids, mask, chunk_tokens=chunk, with_entropy=True)
    got, want = got.detach(), want.detach()
    assert packs(model)
    trained = mask[:, 1:].bool()
    assert entropy is not None and want_entropy is not None
    assert float((got - want)[trained].abs().max()) < 1e-5
    assert float((entropy - want_entropy)[trained].abs().max()) < 1e-5
    assert float(got[~trained].abs().max()) == 0.0


def test_the_head_sees_only_real_tokens_when_packed(model: nn.Module) -> None:
    ids, mask = _batch()
    head = model.get_output_embeddings()
    seen: list[int] = []
    own = head.forward
    head.forward = lambda hidden: (seen.append(hidden.shape[:-1].numel()), own(hidden))[1]
    try:
        assert packs(model)  # probed before the count
        model_token_logprobs(model, ids, mask, chunk_tokens=0)
    finally:
        del head.forward
    assert seen == [int(mask.sum())]  # 12 + 7 + 4 = 23 real tokens, not 3 x 12


def test_packed_values_equal_padded(tiny_model_dir: Path) -> None:
    value_model = load_value_model(tiny_model_dir, attn_impl="sdpa", disable_dropout=True)
    ids, mask = _batch()
    with torch.no_grad():
        got = token_values(value_model, ids, mask)
        set_packing(value_model, False)
        want = token_values(value_model, ids, mask)
    assert float((got - want)[mask.bool()].abs().max()) < 1e-5


class LeakyAttention(nn.Module):
    """A model that takes position_ids but lets every token see every earlier one (no packed-sequence masking)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(32, 4)

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor | None = None, **_: object) -> object:
        hidden = self.embed(input_ids).cumsum(dim=1)  # a running sum over the whole row
        return type("Out", (), {"logits": hidden})()


def test_a_model_that_cannot_pack_runs_padded_and_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    leaky = LeakyAttention()
    assert not packs(leaky)
    assert "micro-batches run padded" in capsys.readouterr().out
    assert not packs(leaky)  # probed once
    assert capsys.readouterr().out == ""


def test_pack_rows_refuses_what_is_not_right_padding() -> None:
    ids = torch.ones((2, 4), dtype=torch.long)
    assert pack_rows(ids, torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]])) is None  # left padding
    assert pack_rows(ids, torch.tensor([[0, 0, 0, 0], [1, 1, 1, 1]])) is None  # an empty row
    rows = pack_rows(ids, torch.tensor([[1, 1, 0, 0], [1, 1, 1, 0]]))
    assert rows is not None and rows.position_ids.tolist() == [[0, 1, 0, 1, 2]]
