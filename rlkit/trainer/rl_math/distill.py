"""On-policy distillation's math (job type distill): the per-token reverse KL to a teacher as advantages, and the
top-k forward KL with a tail bucket as a loss term.

Why the reverse KL enters as an advantage, not as a loss term. The objective is KL(pi || pi_T) over the student's own
completions, estimated on each sampled token y_t by k_t = log pi(y_t) - log pi_T(y_t) (the k1 estimator: its mean over
samples of pi is the KL). Its gradient is E_pi[sum_t (sum_{s>=t} k_s) grad log pi(y_t)] (the score-function term; the
term E_pi[grad log pi] is 0). Differentiating a loss `mean(logp - teacher_logp)` directly gives only
sum_t grad log pi(y_t), whose expectation is 0: the teacher would never enter the gradient. So the KL is a reward:
token t gets the advantage -coef * sum_{s>=t} discount^(s-t) k_s (Thinking Machines' on-policy distillation and
Tinker use discount 0: each token's own KL; cosmos-rl's kl_discount_factor is the discount), and the student's
clipped PPO surrogate (rlkit.trainer.rl_math.losses) turns advantages into the gradient, its ratio covering the
staleness of asynchronous rollouts as it does for GRPO. k_t uses the student's log-prob before the update (the
recomputed proximal log-prob, else the servers' behaviour log-prob), held constant.

The top-k forward KL (AReaL's distillation_topk / distillation_add_tail, cosmos-rl's top_k with jsd_beta 0) is a
direct loss: sum_{k in topk_T} p_T(k) (log p_T(k) - log pi(k)), plus with the tail bucket the same for the mass
outside the teacher's top-k on both sides (1 - sum_k p_T(k), 1 - sum_k pi(k)); without it both distributions are
renormalised over the teacher's top-k. Here the teacher's probabilities weigh the student's log-probs at fixed
tokens, so differentiating the loss itself is right. `is_clip` (AReaL's) weighs each token by min(pi / pi_behav,
is_clip) (no gradient through the weight) for rollouts a few versions old.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

_TAIL_FLOOR = 1e-6  # the tail's mass never below this: log 0 would make the term infinite where the top-k holds all


def reverse_kl_advantages(student_logp: Sequence[float], teacher_logp: Sequence[float], *, coef: float,
                          discount: float, mask: Sequence[int] | None = None) -> tuple[list[float], list[float]]:
    """(advantages, per-token KL k_t) of one completion: advantage_t = -coef * sum_{s>=t} discount^(s-t) k_s over
    the sampled tokens (`mask` 1; inserted tokens of an episode get 0 and add nothing)."""
    n = len(student_logp)
    if len(teacher_logp) != n or (mask is not None and len(mask) != n):
        raise ValueError(f"student ({n}), teacher ({len(teacher_logp)}) and mask "
                         f"({'none' if mask is None else len(mask)}) cover different numbers of tokens")
    kl = [(s - t) if (mask is None or mask[i]) else 0.0
          for i, (s, t) in enumerate(zip(student_logp, teacher_logp, strict=True))]
    advantages = [0.0] * n
    running = 0.0
    for i in range(n - 1, -1, -1):
        running = kl[i] + discount * running
        advantages[i] = -coef * running if (mask is None or mask[i]) else 0.0
    return advantages, kl


def topk_forward_kl(student_logp: Tensor, teacher_logp: Tensor, mask: Tensor, *, add_tail: bool,
                    weight: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """(mean over `mask`'s tokens of the per-token forward KL over the teacher's top-k, the per-token KL detached).

    `student_logp`, `teacher_logp`: [B, T, K] log-probs of the teacher's top-k tokens at each position (the student's
    with gradient); `mask`: [B, T] bool; `weight`: [B, T] per-token weights (is_clip), no gradient."""
    if student_logp.shape != teacher_logp.shape or student_logp.shape[:2] != mask.shape:
        raise ValueError(f"shapes differ: student {tuple(student_logp.shape)}, teacher {tuple(teacher_logp.shape)}, "
                         f"mask {tuple(mask.shape)}")
    s, t = student_logp.float(), teacher_logp.float().detach()
    if add_tail:
        s = _with_tail(s)
        t = _with_tail(t)
    else:
        s = s - torch.logsumexp(s, dim=-1, keepdim=True)
        t = t - torch.logsumexp(t, dim=-1, keepdim=True)
    per_token = (t.exp() * (t - s)).sum(dim=-1)
    if weight is not None:
        per_token = per_token * weight.detach()
    kept = mask.bool()
    loss = torch.where(kept, per_token, 0.0).sum() / kept.sum().clamp(min=1)
    return loss, per_token.detach()


def _with_tail(logp: Tensor) -> Tensor:
    """[..., K] log-probs -> [..., K+1]: the last bucket holds the mass outside the K tokens."""
    inside = torch.logsumexp(logp, dim=-1, keepdim=True).clamp(max=0.0)
    tail = torch.log((-torch.expm1(inside)).clamp(min=_TAIL_FLOOR))
    return torch.cat([logp, tail], dim=-1)


def is_clip_weight(logp: Tensor, behav_logp: Tensor, is_clip: float | None) -> Tensor | None:
    """min(pi / pi_behav, is_clip) per token, no gradient; None without is_clip."""
    if is_clip is None:
        return None
    return torch.exp((logp.detach() - behav_logp).clamp(max=20.0)).clamp(max=is_clip)
