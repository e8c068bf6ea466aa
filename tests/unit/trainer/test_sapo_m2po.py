"""SAPO's soft gate and M2PO's second-moment mask compute what AReaL computes (actor.use_sapo_loss, m2_threshold).

Sources of the numbers: "hand" values are worked out in the comment beside them; "AReaL's output" values were
produced once by running AReaL's `sapo_loss_fn` (areal/utils/functional/functional.py) and `_apply_m2po_masking`
(areal/trainer/ppo/actor.py) at commit 4aef98d8 on the inputs below in float64, and are hard-coded here; `_areal_*`
below re-derive AReaL's formulas independently (plain Python loops, AReaL's suffix scan rather than rlkit's prefix
means) to compare on random tensors.
"""

from __future__ import annotations

import math
import random

import pytest
import torch

from rlkit.trainer.rl_math.losses import ppo_actor_loss
from rlkit.trainer.rl_math.m2po import m2po_keep_mask
from rlkit.trainer.rl_math.sapo import sapo_gate

F64 = torch.float64
OLD = torch.tensor([[-1.0, -0.7, -2.0], [-0.4, -1.3, -0.9]], dtype=F64)
LOG_RATIO = torch.tensor([[0.0, 0.2, -0.3], [0.5, -0.1, 0.0]], dtype=F64)
ADV = torch.tensor([[1.0, 1.0, -1.0], [-2.0, -2.0, 0.0]], dtype=F64)
MASK = torch.tensor([[True, True, True], [True, True, False]])


def _sapo(level: str = "token", taus: tuple[float, float] = (1.0, 1.05), log_ratio: torch.Tensor = LOG_RATIO,
          adv: torch.Tensor = ADV, mask: torch.Tensor = MASK) -> tuple[float, torch.Tensor, dict[str, torch.Tensor]]:
    old = OLD if log_ratio.shape == OLD.shape else torch.full_like(log_ratio, -1.0)
    logp = (old + log_ratio).requires_grad_(True)
    loss, stats = ppo_actor_loss(logp, old, adv, mask, importance_sampling_level=level,  # type: ignore[arg-type]
                                 sapo_taus=taus)
    loss.backward()
    assert logp.grad is not None
    return float(loss.detach()), logp.grad, stats


# --- SAPO -----------------------------------------------------------------------------------------------------

def test_gate_by_hand() -> None:
    ratio = torch.tensor([1.0, math.exp(0.2), math.exp(-0.3), 1.0], dtype=F64)
    gate = sapo_gate(ratio, torch.tensor([1.0, 1.0, -1.0, 0.0], dtype=F64), 1.0, 1.05)
    # r = 1: (4 / tau) * sigmoid(0) = 2 / tau; e^0.2 = 1.2214028, 4 * sigmoid(0.2214028) = 4 * 0.5551257;
    # e^-0.3 = 0.7408182, tau_neg: (4 / 1.05) * sigmoid(1.05 * -0.2591818) = 3.8095238 * 0.4323816; A = 0: tau_neg
    assert gate.tolist() == pytest.approx([2.0, 2.2205028, 1.6471680, 2 / 1.05], abs=1e-6)


@pytest.mark.parametrize(("level", "loss", "grad", "gate"), [
    ("token", 1.221009291548476, [[-0.2, -0.24131123207535132, 0.14545387967562154],
                                  [0.5885407326083214, 0.3610330652610808, 0.0]], 2.041372268567167),
    ("sequence", 1.306694516453931, [[-0.06446375066099941] * 3, [0.4820192014121679] * 2 + [0.0]],
     2.0304005837542323),
])  # AReaL's output (sapo_loss_fn, tau_pos 1, tau_neg 1.05; gate: its sapo_soft_gate's mean over the mask)
def test_sapo_loss_and_gradient_are_areals(level: str, loss: float, grad: list[list[float]], gate: float) -> None:
    ours, ours_grad, stats = _sapo(level)
    assert ours == pytest.approx(loss, abs=1e-12)
    torch.testing.assert_close(ours_grad, torch.tensor(grad, dtype=F64), atol=1e-12, rtol=0)
    assert float(stats["sapo_soft_gate"]) == pytest.approx(gate, abs=1e-12)
    assert float(stats["clip_fraction"]) == 0.0, "SAPO never clips"


def _areal_sapo_token(log_ratio: list[float], adv: list[float], mask: list[bool], taus: tuple[float, float]
                      ) -> tuple[float, list[float]]:
    """AReaL's token-level SAPO re-derived: loss = -sum over the mask of (4/tau) sigmoid(tau (r - 1)) A / n; its
    derivative in log pi is -A 4 s (1 - s) r / n (s the sigmoid; tau cancels)."""
    n = max(1, sum(mask))
    loss, grad = 0.0, []
    for x, a, m in zip(log_ratio, adv, mask, strict=True):
        tau = taus[0] if a > 0 else taus[1]
        r = math.exp(x)
        s = 1 / (1 + math.exp(-tau * (r - 1)))
        loss += -(4 / tau) * s * a / n if m else 0.0
        grad.append(-a * 4 * s * (1 - s) * r / n if m else 0.0)
    return loss, grad


def test_sapo_matches_an_independent_derivation_on_random_tokens() -> None:
    rng = random.Random(3)
    for _ in range(5):
        lr = [rng.uniform(-1.5, 1.5) for _ in range(12)]
        adv = [rng.choice([-1.0, 1.0]) * rng.uniform(0, 3) for _ in range(12)]
        mask = [rng.random() > 0.2 for _ in range(12)]
        taus = (rng.uniform(0.2, 4), rng.uniform(0.2, 4))
        loss, grad, _ = _sapo("token", taus, torch.tensor([lr], dtype=F64), torch.tensor([adv], dtype=F64),
                              torch.tensor([mask]))
        want_loss, want_grad = _areal_sapo_token(lr, adv, mask, taus)
        assert loss == pytest.approx(want_loss, abs=1e-12)
        assert grad[0].tolist() == pytest.approx(want_grad, abs=1e-12)


def test_on_policy_gradient_is_the_policy_gradient_for_any_tau() -> None:
    """At r = 1 the gate's slope is exactly 1 (4 * tau/4 / tau): d loss / d log pi = -A / n."""
    for taus in ((0.1, 0.1), (1.0, 1.05), (30.0, 7.0)):
        _, grad, _ = _sapo("token", taus, torch.zeros(2, 3, dtype=F64))
        torch.testing.assert_close(grad, torch.where(MASK, -ADV / 5, 0.0), atol=1e-12, rtol=0)


def test_a_small_tau_gives_the_unclipped_surrogate_and_a_large_one_stops_off_policy_tokens() -> None:
    """tau -> 0: the gate is 2/tau + (r - 1) + O(tau^2), so the gradient tends to the unclipped -r A / n (no trust
    region); tau large: sech^2(tau (r - 1) / 2) -> 0 for every r != 1, a harder stop than PPO's clip."""
    _, small, _ = _sapo("token", (1e-4, 1e-4))
    torch.testing.assert_close(small, torch.where(MASK, -LOG_RATIO.exp() * ADV / 5, 0.0), atol=1e-8, rtol=0)
    _, large, _ = _sapo("token", (200.0, 200.0))
    off_policy = MASK & (LOG_RATIO != 0)
    assert large[off_policy].abs().max() < 1e-7 and large[0, 0] == pytest.approx(-0.2)


def test_sapo_refuses_what_it_replaces() -> None:
    with pytest.raises(ValueError, match="neither c_clip nor behav_logp"):
        ppo_actor_loss(OLD, OLD, ADV, MASK, sapo_taus=(1.0, 1.05), c_clip=3.0)
    with pytest.raises(ValueError, match="neither c_clip nor behav_logp"):
        ppo_actor_loss(OLD, OLD, ADV, MASK, sapo_taus=(1.0, 1.05), behav_logp=OLD)
    with pytest.raises(ValueError, match="must be positive"):
        sapo_gate(OLD, ADV, 0.0, 1.0)


# --- M2PO -----------------------------------------------------------------------------------------------------

W = torch.tensor([0.1, -0.5, 0.05, 0.3, 0.0], dtype=F64)  # m2 = 0.01, 0.25, 0.0025, 0.09, 0


@pytest.mark.parametrize(("threshold", "kept"), [
    (0.1, [1, 1, 1, 1, 1]),  # mean of all five: 0.3525 / 5 = 0.0705 < 0.1: untouched
    (0.04, [1, 0, 1, 1, 1]),  # drop 0.25 (|w| 0.5): 0.1025 / 4 = 0.0256 < 0.04
    (0.02, [1, 0, 1, 0, 1]),  # then 0.09 (|w| 0.3): 0.0125 / 3 = 0.0042 < 0.02
    (1e-9, [0, 0, 0, 0, 1]),  # only the exact 0 is under 1e-9
])  # hand; the same masks are AReaL's output
def test_m2po_masks_the_largest_log_weights_first(threshold: float, kept: list[int]) -> None:
    assert m2po_keep_mask(W, torch.ones(5, dtype=torch.bool), threshold).int().tolist() == kept


def test_m2po_keeps_the_smallest_token_when_every_one_is_over() -> None:
    """AReaL keeps one token rather than none (0.25 and 0.36 are both over 0.01)."""
    assert m2po_keep_mask(torch.tensor([0.5, -0.6]), torch.ones(2, dtype=torch.bool), 0.01).tolist() == [True, False]


def test_m2po_ignores_padding_and_an_empty_mask() -> None:
    w = torch.tensor([[0.1, 9.0, 0.05], [0.3, 0.0, 7.0]], dtype=F64)
    mask = torch.tensor([[True, False, True], [True, True, False]])  # the 9 and the 7 are padding
    assert m2po_keep_mask(w, mask, 0.04).tolist() == mask.tolist()  # 0.1025 / 4 < 0.04
    empty = torch.zeros(2, 3, dtype=torch.bool)
    assert not m2po_keep_mask(w, empty, 0.04).any()


def _areal_m2po(w: list[float], mask: list[bool], threshold: float) -> list[bool]:
    """AReaL's scan re-derived: sort the kept tokens' m2 descending, drop the first k for the least k whose remaining
    mean is below the threshold (all but one when there is none)."""
    idx = sorted((i for i, m in enumerate(mask) if m), key=lambda i: -w[i] ** 2)
    m2 = [w[i] ** 2 for i in idx]
    k = next((k for k in range(len(m2)) if sum(m2[k:]) / (len(m2) - k) < threshold), len(m2) - 1)
    dropped = set(idx[:k])
    return [m and i not in dropped for i, m in enumerate(mask)]


def test_m2po_matches_areals_scan_on_random_batches() -> None:
    gen = torch.Generator().manual_seed(0)
    for threshold in (0.001, 0.01, 0.04, 0.2):
        w = torch.randn(40, generator=gen, dtype=F64) * 0.3
        mask = torch.rand(40, generator=gen) > 0.2
        ours = m2po_keep_mask(w, mask, threshold)
        assert ours.tolist() == _areal_m2po(w.tolist(), mask.tolist(), threshold)
        if ours.sum() > 1:
            assert float((w[ours] ** 2).mean()) < threshold


def test_m2po_in_the_loss_is_the_decoupled_loss_over_the_kept_tokens() -> None:
    """As AReaL: the mask narrows loss_mask first, so the token-mean's denominator is the kept tokens."""
    behav = OLD - torch.tensor([[0.1, -0.5, 0.05], [0.3, 0.0, 0.0]], dtype=F64)  # m2: 0.01 0.25 0.0025 0.09 0
    logp = OLD + LOG_RATIO
    loss, stats = ppo_actor_loss(logp, OLD, ADV, MASK, behav_logp=behav, m2_threshold=0.04)
    kept = MASK.clone()
    kept[0, 1] = False
    want, _ = ppo_actor_loss(logp, OLD, ADV, kept, behav_logp=behav)
    assert float(loss) == pytest.approx(float(want), abs=1e-12)
    assert float(stats["m2po_masked_fraction"]) == pytest.approx(0.2)  # 1 of 5 tokens
    untouched, stats = ppo_actor_loss(logp, OLD, ADV, MASK, behav_logp=behav, m2_threshold=0.1)
    assert float(untouched) == float(ppo_actor_loss(logp, OLD, ADV, MASK, behav_logp=behav)[0])
    assert float(stats["m2po_masked_fraction"]) == 0.0
    empty, stats = ppo_actor_loss(logp, OLD, ADV, torch.zeros_like(MASK), behav_logp=behav, m2_threshold=0.04)
    assert float(empty) == 0.0 and float(stats["m2po_masked_fraction"]) == 0.0  # a rank's dummy micro-batch
    with pytest.raises(ValueError, match="M2PO needs behav_logp"):
        ppo_actor_loss(logp, OLD, ADV, MASK, m2_threshold=0.04)
