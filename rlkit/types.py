"""Types shared by the rollout side and the trainer, free of torch (the rollout client never imports torch)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Sample:
    """One completion of a prompt, as the rollout produced it, plus what training adds (advantage)."""

    prompt_ids: list[int]
    completion_ids: list[int]
    behav_logp: list[float]
    reward: float
    version: int
    finished: bool
    group: int
    advantage: float = 0.0
    dummy: bool = False  # padding so every rank runs the same number of micro-batches; never contributes to loss
    info: dict[str, float] = field(default_factory=dict)
    server: int = -1  # index of the server that generated it (-1: unknown); the log-prob mismatch check groups by it
    token_advantages: list[float] | None = None  # per completion token (KL penalty, GAE, adv_norm); None: advantage
    # Multi-turn episodes (rlkit.agent.episode): completion_ids holds every token after the prompt, sampled and
    # inserted; only tokens with loss_mask 1 are trained. None: every completion token was sampled (single turn).
    loss_mask: list[int] | None = None
    token_versions: list[int] | None = None  # weight version per completion token (-1: inserted); None: version
    # Job type distill: the teacher's log-prob of each completion token, and (distill.topk) its top-k
    # (token id, log-prob) pairs at each completion position (rlkit.rollout.teacher).
    teacher_logp: list[float] | None = None
    teacher_topk: list[list[tuple[int, float]]] | None = None

    @property
    def length(self) -> int:
        return len(self.prompt_ids) + len(self.completion_ids)
