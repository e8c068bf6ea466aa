"""The engine-facing losses of rw, dpo and the critic on the tiny model: units, sums and the answer log-probs of a
padded batch equal to those of each sequence alone."""

from __future__ import annotations

import copy
import math
from pathlib import Path

import pytest
import torch
from torch import nn

from rlkit.jobs.pairs.batch import pack_pairs
from rlkit.jobs.pairs.data import Pair
from rlkit.jobs.pairs.loss_fns import DPOLoss, answer_logps, fill_reference, rw_loss_fn
from rlkit.jobs.pairs.losses import ReferenceLogps
from rlkit.jobs.ppo.critic import CriticLoss, state_values
from rlkit.models.value_model import load_value_model

PAIRS = [Pair(3, (10, 11, 12), (20, 21), (30,)), Pair(8, (13,), (22, 23, 24), (31, 32))]


@pytest.fixture(scope="module")
def policy(tiny_model_dir: Path) -> nn.Module:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def value_model(tiny_model_dir: Path) -> nn.Module:
    return load_value_model(tiny_model_dir).eval()


def test_answer_logps_of_a_padded_batch_match_each_sequence_alone(policy: nn.Module) -> None:
    batch = pack_pairs(PAIRS, pad_id=0)
    with torch.no_grad():
        sums = answer_logps(policy, batch)
        for row, (pair, side) in enumerate((p, s) for p in PAIRS for s in ("chosen", "rejected")):
            ids = torch.tensor([pair.sequence(side)[0]])
            logp = torch.log_softmax(policy(input_ids=ids).logits[0, :-1].float(), -1)
            prompt = len(pair.prompt_ids)
            alone = sum(logp[prompt - 1 + j, t].item() for j, t in enumerate(pair.answer(side)))
            assert sums[row].item() == pytest.approx(alone, abs=1e-4)


def test_dpo_loss_fn_starts_at_log_2_per_pair_and_reads_the_cache(policy: nn.Module) -> None:
    batch = pack_pairs(PAIRS, pad_id=0)
    cache = ReferenceLogps()
    fill_reference(copy.deepcopy(policy), batch, cache)
    assert cache.missing([3, 8]) == []
    loss, units, stats = DPOLoss(cache, beta=0.1)(policy, batch)
    assert units == 2 and loss.item() == pytest.approx(2 * math.log(2), abs=1e-5)
    assert stats["rewards/margin"] == pytest.approx(0.0, abs=1e-6)
    with pytest.raises(KeyError):
        DPOLoss(ReferenceLogps(), beta=0.1)(policy, batch)


def test_rw_loss_fn_sums_over_pairs(value_model: nn.Module) -> None:
    batch = pack_pairs(PAIRS, pad_id=0)
    loss, units, stats = rw_loss_fn(value_model, batch)
    assert units == 2 and loss.item() == pytest.approx(2 * stats["loss"], rel=1e-5)
    loss.backward()
    assert value_model.score.weight.grad is not None
    value_model.zero_grad(set_to_none=True)


def test_critic_values_align_with_next_token_positions(value_model: nn.Module) -> None:
    ids = torch.tensor([[5, 6, 7, 8], [5, 6, 0, 0]])
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])
    loss_mask = torch.tensor([[False, True, True], [True, False, False]])
    with torch.no_grad():
        values = state_values(value_model, ids, mask)
        loss, units, stats = CriticLoss(eps_clip=0.2)(value_model, ids, mask, values, values + 1.0, loss_mask)
    assert values.shape == (2, 3) and units == 3
    assert loss.item() == pytest.approx(3 * 0.5) and stats["clip_fraction"] == 0.0
