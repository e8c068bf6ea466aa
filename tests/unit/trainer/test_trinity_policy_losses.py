"""The Trinity-RFT policy losses `rlkit migrate` moves (rlkit.config.trinity_loss) compute, in rlkit's actor loss, the
value and gradient Trinity-RFT's do; SAPO, which it refuses, does not.

Trinity-RFT's losses are written out below from their definitions (trinity/algorithm/policy_loss_fn: cispo, gspo,
ppo with fallback_to_policy_gradient, sapo), on [B, T] tensors with one advantage per sequence, as GRPO's.
"""

from __future__ import annotations

import torch
from torch import Tensor

from rlkit.trainer.rl_math.losses import ppo_actor_loss

F64 = torch.float64


def _batch(seed: int = 0) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(4, 6, generator=g, dtype=F64) * 3 - 0.1
    logp = old + (torch.rand(4, 6, generator=g, dtype=F64) - 0.5) * 1.6  # ratios from 0.45 to 2.2: the clips bite
    adv = ((torch.rand(4, 1, generator=g, dtype=F64) - 0.5) * 4).expand(4, 6).clone()
    mask = torch.rand(4, 6, generator=g) > 0.3
    mask[:, 0] = True
    return logp, old, adv, mask


def _mean(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    m = mask.to(x.dtype)
    return (x * m).sum() / m.sum() if dim is None else (x * m).sum(dim) / m.sum(dim)


def _grad(fn: object, logp: Tensor) -> tuple[Tensor, Tensor]:
    lp = logp.clone().requires_grad_(True)
    loss = fn(lp)  # type: ignore[operator]
    loss.backward()
    assert lp.grad is not None
    return loss.detach(), lp.grad


def _rlkit(logp: Tensor, old: Tensor, adv: Tensor, mask: Tensor, **kw: object) -> tuple[Tensor, Tensor]:
    return _grad(lambda lp: ppo_actor_loss(lp, old, adv, mask, **kw)[0], logp)  # type: ignore[arg-type]


def test_cispo_is_trinitys_cispo() -> None:
    """-A sg(clip(r, 1 - low, 1 + high)) log pi, token-mean, at Trinity-RFT's defaults (1.0, 0.28) and others."""
    logp, old, adv, mask = _batch(1)
    for low, high in ((1.0, 0.28), (0.2, 0.3)):
        def trinity(lp: Tensor, low: float = low, high: float = high) -> Tensor:
            weight = torch.exp(lp - old).clamp(1 - low, 1 + high).detach()
            return _mean(-adv * weight * lp, mask)

        want = _grad(trinity, logp)
        got = _rlkit(logp, old, adv, mask, policy_loss="cispo", eps_clip=low, eps_clip_higher=high)
        torch.testing.assert_close(got, want, atol=1e-12, rtol=0)
        clipped = ppo_actor_loss(logp, old, adv, mask, policy_loss="cispo", eps_clip=low, eps_clip_higher=high)[1]
        assert 0 < float(clipped["clip_fraction"]) < 1


def test_gspo_is_trinitys_gspo_token_with_one_advantage_a_sequence() -> None:
    """GSPO-token: each token's ratio exp(log pi - sg(log pi) + sg(mean log-ratio of its sequence)), PPO's clip, the
    mean over each sequence's tokens, then over the sequences: rlkit's sequence ratio with seq-mean-token-mean."""
    logp, old, adv, mask = _batch(2)
    low, high = 0.05, 0.08

    def trinity(lp: Tensor) -> Tensor:
        seq = _mean(lp - old, mask, dim=-1).detach().unsqueeze(-1)
        ratio = torch.exp(lp - lp.detach() + seq)
        per_token = torch.maximum(-adv * ratio, -adv * ratio.clamp(1 - low, 1 + high))
        return _mean(per_token, mask, dim=-1).mean()

    want = _grad(trinity, logp)
    kw = {"importance_sampling_level": "sequence", "loss_agg_mode": "seq-mean-token-mean", "eps_clip": low,
          "eps_clip_higher": high}
    got = _rlkit(logp, old, adv, mask, **kw)
    torch.testing.assert_close(got, want, atol=1e-12, rtol=0)
    clipped = ppo_actor_loss(logp, old, adv, mask, **kw)[1]["clip_fraction"]  # type: ignore[arg-type]
    assert 0 < float(clipped) < 1  # some sequences clipped, some not: both branches compared


def test_ppos_policy_gradient_fallback_has_gpgs_gradient() -> None:
    """fallback_to_policy_gradient: the ratio exp(log pi - sg(log pi)) is 1 (PPO's clip and dual clip 3 then change
    nothing), so the gradient is -A grad log pi / tokens: rlkit's gpg (the loss's value differs, not its gradient)."""
    logp, old, adv, mask = _batch(3)

    def trinity(lp: Tensor) -> Tensor:
        ratio = torch.exp((lp - lp.detach()).clamp(-20, 20))
        clipped = torch.maximum(-adv * ratio, -adv * ratio.clamp(0.8, 1.2))
        dual = torch.where(adv < 0, torch.minimum(-adv * 3.0, clipped), clipped)
        return _mean(dual, mask)

    _, want = _grad(trinity, logp)
    _, got = _rlkit(logp, old, adv, mask, policy_loss="gpg")
    torch.testing.assert_close(got, want, atol=1e-12, rtol=0)


def test_trinitys_sapo_is_not_rlkits() -> None:
    """Trinity-RFT's sapo, -A sg(gate(r)) log pi, has the gradient 2/tau x -A grad log pi at r = 1 where rlkit's
    use_sapo_loss (the gate differentiated) has the policy gradient itself: why rlkit migrate refuses it."""
    logp, _, adv, mask = _batch(4)
    old = logp.clone()  # r = 1 on every token
    tau_pos, tau_neg = 1.0, 1.05

    def trinity(lp: Tensor) -> Tensor:
        tau = torch.where(adv > 0, tau_pos, tau_neg)
        gate = torch.sigmoid(tau * (torch.exp(lp - old) - 1)) * 4 / tau
        return _mean(-adv * gate.detach() * lp, mask)

    _, want = _grad(trinity, logp)
    _, got = _rlkit(logp, old, adv, mask, sapo_taus=(tau_pos, tau_neg))
    tau = torch.where(adv > 0, tau_pos, tau_neg)
    torch.testing.assert_close(want, got * 2 / tau, atol=1e-12, rtol=0)
    assert not torch.allclose(want, got)
