"""Hand-computed cases for on-policy distillation's math (rlkit.trainer.rl_math.distill): the reverse-KL advantages
(Tinker's per-token -(log p_student - log p_teacher), cosmos-rl's discounted sum) and the top-k forward KL with and
without AReaL's tail bucket."""

from __future__ import annotations

import math

import pytest
import torch

from rlkit.trainer.rl_math.distill import is_clip_weight, reverse_kl_advantages, topk_forward_kl


def test_reverse_kl_advantage_is_minus_the_tokens_own_log_ratio_without_discount() -> None:
    adv, kl = reverse_kl_advantages([-0.2, -1.1, -0.7], [-0.1, -1.4, -0.4], coef=1.0, discount=0.0)
    assert kl == pytest.approx([-0.1, 0.3, -0.3])
    assert adv == pytest.approx([0.1, -0.3, 0.3])  # a token the teacher likes more than the student is pushed up


def test_discount_adds_later_tokens_kl_and_coef_scales() -> None:
    # k = [-0.1, 0.3, -0.3]; discount 0.5: returns -0.1 + 0.5*(0.3 + 0.5*-0.3) = -0.025, 0.3 - 0.15 = 0.15, -0.3
    adv, _ = reverse_kl_advantages([-0.2, -1.1, -0.7], [-0.1, -1.4, -0.4], coef=2.0, discount=0.5)
    assert adv == pytest.approx([0.05, -0.3, 0.6])


def test_inserted_tokens_get_no_advantage_and_add_no_kl() -> None:
    adv, kl = reverse_kl_advantages([-0.2, -5.0, -0.7], [-0.1, -0.1, -0.4], coef=1.0, discount=1.0, mask=[1, 0, 1])
    assert kl == pytest.approx([-0.1, 0.0, -0.3])
    assert adv == pytest.approx([0.4, 0.0, 0.3])


def test_lengths_must_agree() -> None:
    with pytest.raises(ValueError, match="different numbers of tokens"):
        reverse_kl_advantages([0.0], [0.0, 0.0], coef=1.0, discount=0.0)


def _lp(*probs: float) -> torch.Tensor:
    return torch.tensor([[[math.log(p) for p in probs]]], dtype=torch.float64)


def test_topk_forward_kl_with_the_tail_bucket_by_hand() -> None:
    teacher, student = _lp(0.6, 0.3), _lp(0.2, 0.5)  # tails 0.1 and 0.3
    expected = 0.6 * math.log(0.6 / 0.2) + 0.3 * math.log(0.3 / 0.5) + 0.1 * math.log(0.1 / 0.3)
    loss, per_token = topk_forward_kl(student, teacher, torch.tensor([[True]]), add_tail=True)
    assert float(loss) == pytest.approx(expected, abs=1e-6)
    assert float(per_token[0, 0]) == pytest.approx(expected, abs=1e-6)


def test_topk_forward_kl_without_the_tail_renormalises_both_over_the_topk() -> None:
    teacher, student = _lp(0.6, 0.3), _lp(0.2, 0.5)  # over the top-2: 2/3, 1/3 and 2/7, 5/7
    expected = (2 / 3) * math.log((2 / 3) / (2 / 7)) + (1 / 3) * math.log((1 / 3) / (5 / 7))
    loss, _ = topk_forward_kl(student, teacher, torch.tensor([[True]]), add_tail=False)
    assert float(loss) == pytest.approx(expected, abs=1e-6)


def test_topk_forward_kl_is_a_mean_over_the_mask_and_zero_for_equal_distributions() -> None:
    same = _lp(0.5, 0.25).repeat(1, 3, 1)
    other = torch.cat([_lp(0.5, 0.25), _lp(0.1, 0.1), _lp(0.5, 0.25)], dim=1)
    mask = torch.tensor([[True, False, True]])
    loss, _ = topk_forward_kl(other, same, mask, add_tail=True)
    assert float(loss) == pytest.approx(0.0, abs=1e-6)  # the differing position is masked out
    weight = torch.tensor([[2.0, 1.0, 0.5]], dtype=torch.float64)
    kl = 0.5 * math.log(0.5 / 0.1) + 0.25 * math.log(0.25 / 0.1) + 0.25 * math.log(0.25 / 0.8)
    loss, _ = topk_forward_kl(other, same, torch.tensor([[False, True, False]]), add_tail=True, weight=weight)
    assert float(loss) == pytest.approx(kl, abs=1e-6)


def test_topk_forward_kl_gradient_moves_the_student_toward_the_teacher() -> None:
    student = _lp(0.2, 0.5).clone().requires_grad_(True)
    loss, _ = topk_forward_kl(student, _lp(0.6, 0.3), torch.tensor([[True]]), add_tail=True)
    loss.backward()
    assert student.grad is not None and float(student.grad[0, 0, 0]) < 0  # raise the token the teacher prefers


def test_is_clip_weight_bounds_the_ratio() -> None:
    logp, behav = torch.tensor([[0.0, -1.0]]), torch.tensor([[-2.0, -1.0]])
    assert is_clip_weight(logp, behav, None) is None
    torch.testing.assert_close(is_clip_weight(logp, behav, 2.0), torch.tensor([[2.0, 1.0]]))
