"""Per-token KL estimators (Schulman's k1/k2/k3) with the clamps AReaL and verl apply.

`kl_estimate(logp, base)` estimates KL(p || base) from log-probs of tokens sampled from p, as AReaL's
`KLEstimator` (areal/utils/data.py at 4aef98d8): k1 = log r, k2 = (log r)^2 / 2, k3 = exp(-log r) - 1 + log r with
log r = logp - base, then clamped to [-clamp, clamp] (AReaL: 10). The log-ratio is first bounded to +-20 (verl's
k3 does the same) so exp cannot overflow and the clamp's zero gradient never meets an infinite one; for a clamp
under 19 this changes no value.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

KLEstimator = Literal["k1", "k2", "k3"]
ESTIMATORS = ("k1", "k2", "k3")
_LOG_RATIO_BOUND = 20.0


def kl_estimate(logp: Tensor, base_logp: Tensor, estimator: str = "k1", *,
                clamp: float | None = 10.0) -> tuple[Tensor, Tensor]:
    """The per-token estimate and a bool tensor of where the clamp changed it."""
    log_ratio = logp.float() - base_logp.float()
    if estimator == "k1":
        kl = log_ratio
    elif estimator == "k2":
        kl = 0.5 * log_ratio.square()
    elif estimator == "k3":
        bounded = log_ratio.clamp(-_LOG_RATIO_BOUND, _LOG_RATIO_BOUND)
        kl = torch.expm1(-bounded) + bounded
    else:
        raise ValueError(f"unknown KL estimator {estimator!r} (expected k1, k2 or k3)")
    if clamp is None:
        return kl, torch.zeros_like(kl, dtype=torch.bool)
    clamped = kl.clamp(-clamp, clamp)
    return clamped, (kl.detach().abs() > clamp)
