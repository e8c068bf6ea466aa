"""Decoupled PPO's proximal log-probs without their forward pass (actor.prox_logp_method loglinear), and how far that
approximation is from the recomputed ones (metrics); pure, on [B, T] tensors.

As AReaL (compute_prox_logp_approximations in areal/trainer/ppo/actor.py at 4aef98d8): the proximal policy is taken
to be one weight version behind the trainer's (`current_version`), and each sampled token's log-prob is interpolated
in log space between the behaviour policy's (the server's, at the token's own version) and the training forward's
(detached):  alpha = (current - 1 - v) / (current - v), clamped to [0, 1], 0 where v >= current or the token was not
sampled (v < 0). So a token sampled at the trainer's version or one behind keeps its behaviour log-prob, and one k
versions behind gets (k - 1) / k of the way to the current policy. The version does not move within a step, so every
minibatch gets the same alpha (after the first optimizer step the training forward is no longer the step's start).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from rlkit.trainer.sampled_tokens import token_versions
from rlkit.types import Sample

# the exponent of an importance weight in the metrics is clamped as the loss clamps its log-ratio (verl's 20)
_MAX_LOG_RATIO = 20.0
_EPS = 1e-8  # relative error: |error| / (|recomputed| + eps), AReaL's


def version_lists(samples: Sequence[Sample]) -> dict[int, list[float]]:
    """Per sample (index in `samples`), each completion token's weight version, as floats: placed in a micro-batch
    like log-probs (rlkit.trainer.sample_forward.aligned)."""
    return {i: [float(v) for v in token_versions(s)] for i, s in enumerate(samples)}


def loglinear_alpha(versions: Tensor, current_version: int) -> Tensor:
    """Per token, the weight of the current policy in the interpolation (float32); `versions` holds each token's
    weight version, negative where no server sampled it (prompt, inserted, padding)."""
    behind = current_version - versions.to(torch.float32)
    interpolated = (versions >= 0) & (behind > 0)
    alpha = torch.where(interpolated, (behind - 1) / behind.clamp(min=1), 0.0)
    return alpha.clamp(0.0, 1.0)


def loglinear_proximal(behav_logp: Tensor, logp: Tensor, versions: Tensor, current_version: int) -> Tensor:
    """The approximated proximal log-probs: behav + alpha * (logp - behav), without gradient through `logp`."""
    return _interpolate(behav_logp, logp, loglinear_alpha(versions, current_version))


def _interpolate(behav_logp: Tensor, logp: Tensor, alpha: Tensor) -> Tensor:
    return behav_logp + alpha.to(behav_logp.dtype) * (logp.detach() - behav_logp)


def _masked_mean(x: Tensor, mask: Tensor) -> Tensor:
    return torch.where(mask, x.float(), 0.0).sum() / mask.sum().clamp(min=1)


def _weight(numerator: Tensor, denominator: Tensor) -> Tensor:
    return torch.exp((numerator - denominator).clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO))


def approximation_errors(recomputed: Tensor, approx: Tensor, behav_logp: Tensor, logp: Tensor,
                         mask: Tensor) -> dict[str, Tensor]:
    """Token means over `mask` of how far `approx` (loglinear) is from the `recomputed` proximal log-probs, in
    log-probs and in the two importance weights it feeds (pi_prox / pi_behav, pi_theta / pi_prox), and, as the
    baseline, how far the behaviour log-probs themselves are (AReaL's 'rollout' approximation)."""
    logp = logp.detach()
    diff = recomputed - approx
    return {
        "loglinear_abs_error": _masked_mean(diff.abs(), mask),
        "loglinear_rel_error": _masked_mean(diff.abs() / (recomputed.abs() + _EPS), mask),
        "loglinear_squared_error": _masked_mean(diff * diff, mask),
        "loglinear_behave_imp_weight_abs_error": _masked_mean(
            (_weight(recomputed, behav_logp) - _weight(approx, behav_logp)).abs(), mask),
        "loglinear_importance_weight_abs_error": _masked_mean(
            (_weight(logp, recomputed) - _weight(logp, approx)).abs(), mask),
        "rollout_abs_error": _masked_mean((recomputed - behav_logp).abs(), mask),
    }


def stat_names(method: str) -> tuple[str, ...]:
    """The statistics `proximal_logp` returns for `method` (every rank reduces the same keys)."""
    if method == "loglinear":
        return ("loglinear_alpha",)
    if method == "metrics":
        return ("loglinear_alpha", "loglinear_abs_error", "loglinear_rel_error", "loglinear_squared_error",
                "loglinear_behave_imp_weight_abs_error", "loglinear_importance_weight_abs_error", "rollout_abs_error")
    return ()


def proximal_logp(method: str, recomputed: Tensor | None, behav_logp: Tensor, logp: Tensor, versions: Tensor,
                  current_version: int | None, mask: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
    """The proximal log-probs the decoupled loss uses under `method` (loglinear: the approximation; metrics: the
    `recomputed` ones) and the statistics `stat_names(method)` (token means over `mask`, detached).
    `current_version`: the version of the weights being trained (None: the algorithm never said, a bug)."""
    if method not in ("loglinear", "metrics"):
        raise ValueError(f"prox_logp_method must be loglinear or metrics here, got {method!r}")
    if current_version is None:
        raise RuntimeError(f"prox_logp_method {method} needs the trained weights' version, which the algorithm did "
                           "not set (PPOActor.current_version)")
    alpha = loglinear_alpha(versions, current_version)
    approx = _interpolate(behav_logp, logp, alpha)
    stats = {"loglinear_alpha": _masked_mean(alpha, mask)}
    if method == "loglinear":
        return approx, stats
    if recomputed is None:
        raise ValueError("prox_logp_method metrics needs the recomputed proximal log-probs")
    with torch.no_grad():
        stats.update(approximation_errors(recomputed, approx, behav_logp, logp, mask))
    return recomputed, stats
