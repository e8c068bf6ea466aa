"""Where packing pays (rlkit.models.packing, rlkit.models.packed_attention) on the tiny model: sdpa packs without a
dense mask (its attention runs on the padded layout, the same log-probs and gradients as padded, through gradient
checkpointing's recompute too), a micro-batch without padding runs as it is, and eager attention packs only the
micro-batches the cost model finds cheaper, said once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from rlkit.models.packed_attention import PACKED_SDPA
from rlkit.models.packing import dense_packing_pays, packs, rows_for, set_packing
from rlkit.trainer.engine import load_causal_lm
from rlkit.trainer.head_logprobs import model_token_logprobs


def _batch(lengths: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    longest = max(lengths)
    ids = torch.randint(1, 500, (len(lengths), longest), generator=torch.Generator().manual_seed(0))
    return ids, (torch.arange(longest)[None] < torch.tensor(lengths)[:, None]).long()


def _step(model: nn.Module, ids: torch.Tensor, mask: torch.Tensor, packing: bool
          ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    set_packing(model, packing)
    model.zero_grad(set_to_none=True)
    logp, _ = model_token_logprobs(model, ids, mask, chunk_tokens=8)
    weights = torch.linspace(-1.0, 2.0, logp.numel()).view_as(logp) * mask[:, 1:]  # real tokens only, as losses do
    (logp * weights).sum().backward()
    set_packing(model, True)
    return logp.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("checkpointing", [False, True])
def test_sdpa_packs_without_a_dense_mask_and_equals_padded(tiny_model_dir: Path, checkpointing: bool,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    model = load_causal_lm(str(tiny_model_dir), dtype=torch.float32, attn_impl="sdpa", disable_dropout=True)
    if checkpointing:  # backward recomputes each layer after the packed forward has returned
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    assert packs(model) and model.config._attn_implementation == PACKED_SDPA
    ids, mask = _batch([5, 40, 37, 12, 30, 3])
    want, want_grads = _step(model, ids, mask, packing=False)
    calls: list[tuple[tuple[int, ...], bool]] = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def spy(query: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        calls.append((tuple(query.shape[:1]) + tuple(query.shape[2:3]), kwargs.get("attn_mask") is None))
        return sdpa(query, *args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    got, got_grads = _step(model, ids, mask, packing=True)
    monkeypatch.undo()
    layers = model.config.num_hidden_layers
    assert calls == [((6, 40), True)] * layers * (2 if checkpointing else 1)  # the padded layout, no mask at all
    trained = mask[:, 1:].bool()
    assert float((got - want)[trained].abs().max()) < 1e-5
    assert got_grads.keys() == want_grads.keys() and len(got_grads) > 20
    for name, grad in want_grads.items():
        error = float((got_grads[name] - grad).abs().max() / grad.abs().max().clamp(min=1e-12))
        assert error < 1e-5, f"{name}: {error:.3g}"


def test_a_micro_batch_without_padding_runs_as_it_is(tiny_model_dir: Path) -> None:
    model = load_causal_lm(str(tiny_model_dir), dtype=torch.float32, attn_impl="sdpa", disable_dropout=True)
    ids, mask = _batch([9, 9, 9])
    assert rows_for(model, ids, mask) is None
    assert rows_for(model, *_batch([9, 4, 9])) is not None


def test_eager_packs_only_what_the_cost_model_finds_cheaper(tiny_model_dir: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    model = load_causal_lm(str(tiny_model_dir), dtype=torch.float32, attn_impl="eager", disable_dropout=True)
    skewed, even = [5, 40, 37, 12, 100, 90, 3, 64], [300] * 15 + [280]
    # tokens x 2 x parameters + layers x (4 x hidden + 256 x heads) x tokens^2, packed against padded
    assert dense_packing_pays(model, skewed) and not dense_packing_pays(model, even)
    assert rows_for(model, *_batch(skewed)) is not None
    assert rows_for(model, *_batch(even)) is None
    assert rows_for(model, *_batch(skewed)) is not None
    out = capsys.readouterr().out
    assert "only where that costs less than padding" in out
    assert out.count("runs packed: the cost model") == 1 and out.count("runs padded: the cost model") == 1
    ids, mask = _batch(skewed)
    want, _ = _step(model, ids, mask, packing=False)
    got, _ = _step(model, ids, mask, packing=True)
    assert float((got - want)[mask[:, 1:].bool()].abs().max()) < 1e-5
