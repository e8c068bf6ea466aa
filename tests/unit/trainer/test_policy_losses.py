"""CISPO, GMPO and GPG (actor.policy_loss) compute verl's losses and their gradients.

The wanted values come from the definitions written out below as plain Python loops over the tokens (the loss and its
derivative in each token's log pi, derived by hand), independent of rlkit's tensors; one batch per loss is also
worked out by hand in the comments.
"""

from __future__ import annotations

import math
import random

import pytest
import torch

from rlkit.trainer.rl_math.losses import ppo_actor_loss

F64 = torch.float64


def _run(policy_loss: str, logp: list[list[float]], old: list[list[float]], adv: list[list[float]],
         mask: list[list[bool]], **kw: object) -> tuple[float, list[list[float]], dict[str, torch.Tensor]]:
    lp = torch.tensor(logp, dtype=F64, requires_grad=True)
    loss, stats = ppo_actor_loss(lp, torch.tensor(old, dtype=F64), torch.tensor(adv, dtype=F64),
                                 torch.tensor(mask), policy_loss=policy_loss, **kw)  # type: ignore[arg-type]
    loss.backward()
    assert lp.grad is not None
    return float(loss.detach()), lp.grad.tolist(), stats


def _close(got: list[list[float]], want: list[list[float]]) -> None:
    torch.testing.assert_close(torch.tensor(got, dtype=F64), torch.tensor(want, dtype=F64), atol=1e-12, rtol=0)


def _batch(seed: int, rows: int = 3, tokens: int = 7) -> tuple[list[list[float]], ...]:
    rng = random.Random(seed)
    old = [[-rng.uniform(0.1, 4.0) for _ in range(tokens)] for _ in range(rows)]
    logp = [[o + rng.uniform(-0.9, 0.9) for o in row] for row in old]  # ratios from 0.4 to 2.5: the clips bite
    adv = [[rng.choice([-1.0, 1.0]) * rng.uniform(0.1, 2.0)] * tokens for _ in range(rows)]  # one per sequence
    mask = [[rng.random() > 0.25 for _ in range(tokens)] for _ in range(rows)]
    mask[0][0] = True
    return logp, old, adv, mask  # type: ignore[return-value]


# --- CISPO ------------------------------------------------------------------------------------------------------

def _cispo(logp: list[list[float]], old: list[list[float]], adv: list[list[float]], mask: list[list[bool]],
           low: float, high: float, seq_mean: bool = False) -> tuple[float, list[list[float]]]:
    """-w A log pi, w = min(max(r, 1 - low), 1 + high) a constant: d/d log pi = -w A; token-mean (seq_mean: each
    sequence's token mean, then the mean over sequences)."""
    n_tok = sum(map(sum, mask))
    n_seq = sum(1 for m in mask if any(m))
    loss, grad = 0.0, []
    for lrow, orow, arow, mrow in zip(logp, old, adv, mask, strict=True):
        denom = (sum(mrow) * n_seq) if seq_mean else n_tok
        g = []
        for lp, o, a, m in zip(lrow, orow, arow, mrow, strict=True):
            w = min(max(math.exp(lp - o), 1 - low), 1 + high)
            loss += -w * a * lp / denom if m else 0.0
            g.append(-w * a / denom if m else 0.0)
        grad.append(g)
    return loss, grad


def test_cispo_by_hand() -> None:
    # r = e^0.5 = 1.6487 clipped to 1.2 (A = 1, log pi -1): -1.2 * 1 * -1 = 1.2; r = e^-0.1 = 0.904837 kept (A = 1,
    # log pi -2): -0.904837 * -2 = 1.809675; mean 1.5048374; gradients -1.2 / 2 and -0.904837 / 2
    loss, grad, stats = _run("cispo", [[-1.0, -2.0]], [[-1.5, -1.9]], [[1.0, 1.0]], [[True, True]], eps_clip=0.2)
    assert loss == pytest.approx((1.2 + 2 * math.exp(-0.1)) / 2, abs=1e-12)
    _close(grad, [[-0.6, -math.exp(-0.1) / 2]])
    assert float(stats["clip_fraction"]) == 0.5


@pytest.mark.parametrize(("low", "high", "mode"), [(0.2, 0.2, "token-mean"), (10.0, 0.2, "token-mean"),
                                                   (0.3, 0.28, "seq-mean-token-mean")])
def test_cispo_matches_its_definition_on_random_batches(low: float, high: float, mode: str) -> None:
    for seed in range(4):
        logp, old, adv, mask = _batch(seed)
        loss, grad, _ = _run("cispo", logp, old, adv, mask, eps_clip=low, eps_clip_higher=high, loss_agg_mode=mode)
        want_loss, want_grad = _cispo(logp, old, adv, mask, low, high, seq_mean=mode != "token-mean")
        assert loss == pytest.approx(want_loss, abs=1e-12)
        _close(grad, want_grad)


def test_a_clipped_token_keeps_its_gradient_under_cispo_not_under_ppo() -> None:
    """The point of CISPO: r = e^0.6 > 1.2 with A > 0 gets -1.2 A (one token: the mean is itself); PPO's gets 0."""
    args = ([[-1.0]], [[-1.6]], [[2.0]], [[True]])
    _close(_run("cispo", *args)[1], [[-2.4]])
    assert _run("ppo", *args)[1] == [[0.0]]


def test_cispo_takes_the_decoupled_weight() -> None:
    """With behav_logp the token's loss is times pi_prox / pi_behav (verl: its rollout IS weights; rlkit takes that
    weight in float32, hence 1e-6)."""
    logp, old, adv, mask = _batch(5)
    behav = [[o - 0.1 * (i % 3) for i, o in enumerate(row)] for row in old]
    loss, grad, _ = _run("cispo", logp, old, adv, mask, behav_logp=torch.tensor(behav, dtype=F64))
    n = sum(map(sum, mask))
    want = sum(-min(max(math.exp(lp - o), 0.8), 1.2) * math.exp(o - b) * a * lp / n
               for lr, orow, brow, arow, mrow in zip(logp, old, behav, adv, mask, strict=True)
               for lp, o, b, a, m in zip(lr, orow, brow, arow, mrow, strict=True) if m)
    assert loss == pytest.approx(want, abs=1e-6)
    assert grad[0][2] == pytest.approx(-min(max(math.exp(logp[0][2] - old[0][2]), 0.8), 1.2) * math.exp(0.2)
                                       * adv[0][2] / n if mask[0][2] else 0.0, abs=1e-6)


# --- GPG --------------------------------------------------------------------------------------------------------

def test_gpg_is_minus_a_log_pi_whatever_the_old_policy() -> None:
    logp, old, adv, mask = _batch(7)
    n = sum(map(sum, mask))
    want = sum(-a * lp / n for lr, ar, mr in zip(logp, adv, mask, strict=True)
               for lp, a, m in zip(lr, ar, mr, strict=True) if m)
    for shifted in (old, [[o + 3.0 for o in row] for row in old]):  # a ratio far off 1: no clip, no effect
        loss, grad, stats = _run("gpg", logp, shifted, adv, mask)
        assert loss == pytest.approx(want, abs=1e-12)
        _close(grad, [[-a / n if m else 0.0 for a, m in zip(ar, mr, strict=True)]
                      for ar, mr in zip(adv, mask, strict=True)])
        assert float(stats["clip_fraction"]) == 0.0


# --- GMPO -------------------------------------------------------------------------------------------------------

def _gmpo(logp: list[list[float]], old: list[list[float]], adv: list[list[float]], mask: list[list[bool]],
          low: float, high: float) -> tuple[float, list[list[float]]]:
    """Per sequence: x_t = log r_t, kept_t = min(x_t, clip(x_t)) for A_t > 0, max(...) for A_t < 0, 0 for A_t = 0;
    R = exp(mean kept), L = -mean(A) R; the loss is the mean of L over the sequences. d L / d log pi_t = -mean(A) R
    / n where the clip did not change x_t (its kept_t is x_t itself), else 0."""
    losses, grads = [], []
    for lrow, orow, arow, mrow in zip(logp, old, adv, mask, strict=True):
        idx = [t for t, m in enumerate(mrow) if m]
        kept, free = {}, {}
        for t in idx:
            x, a = lrow[t] - orow[t], arow[t]
            c = min(max(x, -low), high)
            kept[t] = 0.0 if a == 0 else (min(x, c) if a > 0 else max(x, c))
            free[t] = a != 0 and kept[t] == x
        n = len(idx)
        ratio = math.exp(sum(kept.values()) / n)
        mean_a = sum(arow[t] for t in idx) / n
        losses.append(-mean_a * ratio)
        grads.append([-mean_a * ratio / n if free.get(t) else 0.0 for t in range(len(lrow))])
    rows = len(losses)
    return sum(losses) / rows, [[g / rows for g in row] for row in grads]


def test_gmpo_by_hand() -> None:
    # row 1, A = 1: log r 0.5 -> 0.2 (clipped), -0.1 kept: R = e^0.05, L = -e^0.05; row 2, A = -2: 0.3 kept (the
    # clip is on the low side for A < 0), -0.6 -> -0.2: R = e^0.05, L = 2 e^0.05; loss (L1 + L2) / 2 = e^0.05 / 2.
    # Gradients: the unclipped tokens only, -mean(A) R / 2 tokens / 2 rows: -e^0.05 / 4 and 2 e^0.05 / 4
    loss, grad, stats = _run("gmpo", [[-1.0, -2.0], [-1.0, -2.0]], [[-1.5, -1.9], [-1.3, -1.4]],
                             [[1.0, 1.0], [-2.0, -2.0]], [[True, True], [True, True]], eps_clip=0.2,
                             loss_agg_mode="seq-mean-token-mean")
    e = math.exp(0.05)
    assert loss == pytest.approx(e / 2, abs=1e-12)
    _close(grad, [[0.0, -e / 4], [e / 2, 0.0]])
    assert float(stats["clip_fraction"]) == 0.5 and float(stats["importance_weight_mean"]) == pytest.approx(e)


@pytest.mark.parametrize(("low", "high"), [(0.4, 0.4), (0.2, 0.3)])
@pytest.mark.parametrize("mode", ["seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"])
def test_gmpo_matches_its_definition_on_random_batches(low: float, high: float, mode: str) -> None:
    """Every seq-mean mode gives GMPO's mean over sequences (verl's geo_mean reads no loss_agg_mode)."""
    for seed in range(4):
        logp, old, adv, mask = _batch(seed)
        loss, grad, _ = _run("gmpo", logp, old, adv, mask, eps_clip=low, eps_clip_higher=high, loss_agg_mode=mode,
                             loss_scale_factor=16)
        want_loss, want_grad = _gmpo(logp, old, adv, mask, low, high)
        assert loss == pytest.approx(want_loss, abs=1e-12)
        _close(grad, want_grad)


def test_gmpo_skips_an_empty_row_and_weights_by_the_geometric_mean_of_the_decoupled_weight() -> None:
    logp, old, adv, mask = _batch(11)
    mask[2] = [False] * len(mask[2])  # a row with no trained token (a dummy, a masked cut): not a sequence
    want, _ = _gmpo(logp[:2], old[:2], adv[:2], mask[:2], 0.2, 0.2)
    assert _run("gmpo", logp, old, adv, mask, loss_agg_mode="seq-mean-token-mean")[0] == pytest.approx(want, abs=1e-12)
    # behaviour 0.1 lower on every token of row 0, 0.3 lower on row 1: weights e^0.1 and e^0.3, their geometric means
    behav = [[o - 0.1 for o in old[0]], [o - 0.3 for o in old[1]], old[2]]
    rows = [_gmpo([logp[i]], [old[i]], [adv[i]], [mask[i]], 0.2, 0.2)[0] for i in range(2)]
    weighted, _, _ = _run("gmpo", logp, old, adv, mask, loss_agg_mode="seq-mean-token-mean",
                          behav_logp=torch.tensor(behav, dtype=F64))
    # (the weight is taken in float32: 1e-6)
    assert weighted == pytest.approx((rows[0] * math.exp(0.1) + rows[1] * math.exp(0.3)) / 2, abs=1e-6)


# --- what each loss refuses ---------------------------------------------------------------------------------------

def test_the_other_losses_refuse_what_belongs_to_ppos_clip() -> None:
    logp, old, adv, mask = _batch(1)
    with pytest.raises(ValueError, match="mean over sequences"):
        _run("gmpo", logp, old, adv, mask)  # token-mean
    for kw in ({"c_clip": 3.0}, {"importance_sampling_level": "sequence"}, {"sapo_taus": (1.0, 1.05)}):
        with pytest.raises(ValueError, match="replaces PPO's clip"):
            _run("cispo", logp, old, adv, mask, **kw)
    with pytest.raises(ValueError, match="must be one of"):
        _run("geo_mean", logp, old, adv, mask)
