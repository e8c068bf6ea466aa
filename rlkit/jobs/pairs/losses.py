"""Losses on preference pairs (pure torch): the reward model's pairwise loss and DPO's, with their metrics, and the
cache that keeps the frozen reference's log-probs of every pair after they were computed once.

Both losses read one number per sequence: a reward model's score at the sequence's last token, and for DPO the
sum of the answer tokens' log-probs (`answer_logp_sums`). Inputs are [B] tensors, one entry per pair.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor

Reduction = Literal["mean", "sum"]


def _reduce(losses: Tensor, reduction: Reduction) -> Tensor:
    return losses.sum() if reduction == "sum" else losses.mean()


def answer_logp_sums(logp: Tensor, loss_mask: Tensor) -> Tensor:
    """[N] summed log-probs of each sequence's answer tokens, from [N, L-1] token log-probs and the answer mask."""
    return torch.where(loss_mask, logp.float(), 0.0).sum(dim=-1)


def by_pair(per_sequence: Tensor) -> tuple[Tensor, Tensor]:
    """[2B] values in the pair layout (chosen, rejected, chosen, ...) -> ([B] chosen, [B] rejected)."""
    pairs = per_sequence.view(-1, 2)
    return pairs[:, 0], pairs[:, 1]


def rw_pairwise_loss(chosen_scores: Tensor, rejected_scores: Tensor, *, reduction: Reduction = "mean"
                     ) -> tuple[Tensor, dict[str, Tensor]]:
    """-log sigmoid(r_chosen - r_rejected) per pair (Bradley-Terry); metrics (detached means over the pairs):
    accuracy (chosen scored strictly higher), the mean scores and their margin."""
    chosen, rejected = chosen_scores.float(), rejected_scores.float()
    margin = chosen - rejected
    losses = -F.logsigmoid(margin)
    with torch.no_grad():
        stats = {"loss": losses.mean(), "accuracy": (margin > 0).float().mean(), "chosen_score": chosen.mean(),
                 "rejected_score": rejected.mean(), "margin": margin.mean()}
    return _reduce(losses, reduction), stats


def dpo_loss(policy_chosen: Tensor, policy_rejected: Tensor, ref_chosen: Tensor, ref_rejected: Tensor, *,
             beta: float, label_smoothing: float = 0.0, reduction: Reduction = "mean"
             ) -> tuple[Tensor, dict[str, Tensor]]:
    """DPO's sigmoid loss on summed answer log-probs: with the implicit rewards beta * (policy - reference) of
    each answer, -log sigmoid(reward_chosen - reward_rejected); `label_smoothing` e mixes in the loss of the flipped
    label with weight e (conservative DPO, as Trinity-RFT's `dpo` loss and TRL 0.28's sigmoid loss do; AReaL has no
    such knob). Metrics: the mean implicit rewards, their margin, and the accuracy
    (chosen reward strictly higher). The reference log-probs carry no gradient."""
    chosen_ratio = policy_chosen.float() - ref_chosen.detach().float()
    rejected_ratio = policy_rejected.float() - ref_rejected.detach().float()
    logits = beta * (chosen_ratio - rejected_ratio)
    losses = -(1.0 - label_smoothing) * F.logsigmoid(logits) - label_smoothing * F.logsigmoid(-logits)
    with torch.no_grad():
        chosen_reward, rejected_reward = beta * chosen_ratio, beta * rejected_ratio
        stats = {"loss": losses.mean(), "rewards/chosen": chosen_reward.mean(),
                 "rewards/rejected": rejected_reward.mean(), "rewards/margin": (chosen_reward - rejected_reward).mean(),
                 "rewards/accuracy": (chosen_reward > rejected_reward).float().mean(),
                 "logp/chosen": policy_chosen.detach().float().mean(),
                 "logp/rejected": policy_rejected.detach().float().mean()}
    return _reduce(losses, reduction), stats


class ReferenceLogps:
    """The frozen reference model's summed answer log-probs per pair (by dataset row index), computed the first
    time a pair is seen and read on every later epoch: the reference never changes, so one forward per pair is
    enough. Its state is plain JSON (a recover checkpoint may keep it instead of recomputing after a resume)."""

    def __init__(self) -> None:
        self._values: dict[int, tuple[float, float]] = {}

    def __len__(self) -> int:
        return len(self._values)

    def missing(self, indices: Sequence[int]) -> list[int]:
        """The indices whose reference log-probs are not known yet (what still needs a reference forward)."""
        return [i for i in indices if i not in self._values]

    def put(self, indices: Sequence[int], chosen: Tensor, rejected: Tensor) -> None:
        for i, c, r in zip(indices, chosen.detach().double().cpu().tolist(), rejected.detach().double().cpu().tolist(),
                           strict=True):
            self._values[int(i)] = (float(c), float(r))

    def get(self, indices: Sequence[int], device: torch.device | None = None) -> tuple[Tensor, Tensor]:
        """([B] chosen, [B] rejected) float32 tensors; KeyError naming the first pair that was never computed."""
        absent = self.missing(indices)
        if absent:
            raise KeyError(f"no reference log-probs for pair {absent[0]}: compute them first (missing())")
        values = torch.tensor([self._values[i] for i in indices], dtype=torch.float32, device=device)
        return values[:, 0], values[:, 1]

    def state(self) -> dict[str, list[float]]:
        return {str(i): list(v) for i, v in sorted(self._values.items())}

    @classmethod
    def from_state(cls, state: dict[str, list[float]]) -> ReferenceLogps:
        cache = cls()
        cache._values = {int(i): (float(v[0]), float(v[1])) for i, v in state.items()}
        return cache
