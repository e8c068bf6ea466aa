"""M2PO (second-moment trust policy optimization, arXiv 2510.01161): drop the tokens whose behaviour importance
weight is most extreme until the second moment of the log weight is under a threshold.

As AReaL's `_apply_m2po_masking` (areal/trainer/ppo/actor.py at 4aef98d8): m2 = (log pi_behav - log pi_prox)^2 per
kept token; the fewest tokens of largest m2 are dropped such that the mean m2 of the rest is strictly below the
threshold, at least one token always kept. AReaL does it per micro-batch on each rank, before the loss, so the
loss's token-mean runs over the kept tokens; rlkit's caller (ppo_actor_loss) does the same.
"""

from __future__ import annotations

import torch
from torch import Tensor


def m2po_keep_mask(log_weight: Tensor, mask: Tensor, threshold: float) -> Tensor:
    """`mask` narrowed to the tokens M2PO keeps: the k smallest log_weight^2 of the masked tokens, k the largest
    count whose mean m2 is below `threshold` (the mean of the j smallest never falls as j grows), at least 1."""
    if not threshold > 0:
        raise ValueError(f"m2_threshold must be positive, got {threshold}")
    mask = mask.bool()
    m2 = log_weight.detach()[mask].float() ** 2
    n = m2.numel()
    if n == 0:
        return mask
    ascending, order = torch.sort(m2, stable=True)
    prefix_mean = ascending.cumsum(0) / torch.arange(1, n + 1, device=m2.device, dtype=m2.dtype)
    below = torch.nonzero(prefix_mean < threshold)
    keep = int(below[-1]) + 1 if below.numel() else 1
    kept = torch.zeros(n, dtype=torch.bool, device=mask.device)
    kept[order[:keep]] = True
    out = torch.zeros_like(mask)
    out[mask] = kept
    return out
