"""The pair losses against numbers worked out by hand, their gradients' direction, and the reference cache."""

from __future__ import annotations

import math

import pytest
import torch

from rlkit.jobs.pairs.losses import ReferenceLogps, answer_logp_sums, by_pair, dpo_loss, rw_pairwise_loss


def softplus(x: float) -> float:
    """-log sigmoid(-x) = log(1 + e^x), written out (the hand-computed side of the checks)."""
    return math.log1p(math.exp(x))


def test_rw_loss_and_accuracy_by_hand() -> None:
    chosen, rejected = torch.tensor([2.0, 0.0, 5.0]), torch.tensor([1.0, 1.0, 5.0])  # margins 1, -1, 0
    loss, stats = rw_pairwise_loss(chosen, rejected)
    expected = [softplus(-1.0), softplus(1.0), math.log(2.0)]
    assert loss.item() == pytest.approx(sum(expected) / 3, rel=1e-6)
    assert stats["accuracy"].item() == pytest.approx(1 / 3)  # a tie is not counted as right
    assert stats["margin"].item() == pytest.approx(0.0)
    assert stats["chosen_score"].item() == pytest.approx(7 / 3)
    summed, _ = rw_pairwise_loss(chosen, rejected, reduction="sum")
    assert summed.item() == pytest.approx(sum(expected), rel=1e-6)


def test_rw_gradient_pushes_chosen_up_and_rejected_down() -> None:
    chosen = torch.tensor([0.3, -1.0], requires_grad=True)
    rejected = torch.tensor([0.5, 2.0], requires_grad=True)
    rw_pairwise_loss(chosen, rejected)[0].backward()
    assert chosen.grad is not None and rejected.grad is not None
    assert (chosen.grad < 0).all() and (rejected.grad > 0).all()
    assert torch.allclose(chosen.grad, -rejected.grad)


def test_dpo_loss_rewards_and_accuracy_by_hand() -> None:
    # policy - reference: chosen +1, rejected -1 (pair 0); chosen -0.5, rejected +0.5 (pair 1)
    pc, pr = torch.tensor([-1.0, -3.5]), torch.tensor([-3.0, -2.5])
    rc, rr = torch.tensor([-2.0, -3.0]), torch.tensor([-2.0, -3.0])
    loss, stats = dpo_loss(pc, pr, rc, rr, beta=0.5)
    logits = [0.5 * (1 - -1), 0.5 * (-0.5 - 0.5)]  # 1.0, -0.5
    assert loss.item() == pytest.approx((softplus(-logits[0]) + softplus(-logits[1])) / 2, rel=1e-6)
    assert stats["rewards/chosen"].item() == pytest.approx((0.5 + -0.25) / 2)
    assert stats["rewards/rejected"].item() == pytest.approx((-0.5 + 0.25) / 2)
    assert stats["rewards/margin"].item() == pytest.approx((1.0 + -0.5) / 2)
    assert stats["rewards/accuracy"].item() == pytest.approx(0.5)


def test_dpo_label_smoothing_mixes_in_the_flipped_label() -> None:
    zero = torch.tensor([0.0])
    loss, _ = dpo_loss(torch.tensor([1.0]), torch.tensor([-1.0]), zero, zero, beta=0.5, label_smoothing=0.1)  # logit 1
    assert loss.item() == pytest.approx(0.9 * softplus(-1.0) + 0.1 * softplus(1.0), rel=1e-6)


def test_dpo_raising_the_chosen_log_prob_lowers_the_loss() -> None:
    pc = torch.tensor([-4.0, -2.0], requires_grad=True)
    pr = torch.tensor([-3.0, -2.5], requires_grad=True)
    ref = torch.tensor([-3.0, -3.0], requires_grad=True)
    loss, _ = dpo_loss(pc, pr, ref, ref, beta=0.1)
    loss.backward()
    assert pc.grad is not None and pr.grad is not None
    assert (pc.grad < 0).all() and (pr.grad > 0).all()
    assert ref.grad is None  # the frozen reference gets no gradient
    with torch.no_grad():
        raised, _ = dpo_loss(pc + 0.5, pr, ref, ref, beta=0.1)
        lowered_rejected, _ = dpo_loss(pc, pr - 0.5, ref, ref, beta=0.1)
    assert raised.item() < loss.item() and lowered_rejected.item() < loss.item()


def test_answer_sums_and_pair_layout() -> None:
    logp = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -0.5, -9.0], [-4.0, -1.0, -1.0], [-2.0, -2.0, -2.0]])
    mask = torch.tensor([[False, True, True], [True, True, False], [False, False, True], [True, True, True]])
    sums = answer_logp_sums(logp, mask)
    assert sums.tolist() == [-5.0, -1.0, -1.0, -6.0]
    chosen, rejected = by_pair(sums)
    assert chosen.tolist() == [-5.0, -1.0] and rejected.tolist() == [-1.0, -6.0]


def test_reference_cache_computes_each_pair_once_and_round_trips() -> None:
    cache = ReferenceLogps()
    assert cache.missing([3, 7]) == [3, 7]
    cache.put([3, 7], torch.tensor([-1.5, -2.0]), torch.tensor([-3.0, -4.25]))
    assert cache.missing([7, 9, 3]) == [9]
    chosen, rejected = cache.get([7, 3])
    assert chosen.tolist() == [-2.0, -1.5] and rejected.tolist() == [-4.25, -3.0]
    with pytest.raises(KeyError, match="pair 9"):
        cache.get([3, 9])
    again = ReferenceLogps.from_state(cache.state())
    assert len(again) == 2 and again.get([3])[1].tolist() == [-3.0]
