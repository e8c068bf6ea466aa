"""On-policy distillation as an algorithm of the training loop: GRPO's (rlkit.jobs.grpo.algorithm) with the teacher's
scores in every batch and other advantages; `run_distill` is the `rlkit train` step.

Rank 0 gets a batch as GRPO's does, then has the teacher's servers score every sample (rlkit.rollout.teacher) before
the batch is broadcast. On every rank each sampled token's advantage becomes -distill.coef times its reverse KL to
the teacher (discounted over later tokens by distill.discount), plus distill.rl_coef times GRPO's advantage from the
reward (rlkit.trainer.rl_math.distill says why an advantage and not a loss term); the PPO actor's clipped steps do the
rest. With distill.topk the actor's loss also gets the top-k forward KL (`TopKTerm`), which needs the full logits: a
second forward of each micro-batch, [B, L, V] in memory.

Not built: a teacher inside the trainer (AReaL's self_distillation EMA teacher, cosmos-rl's FSDP teacher): the
teacher is always a served model (rlkit.config.areal.keys says so where those keys are refused).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from rlkit.config.schema.distill import DistillConfig
from rlkit.config.schema.experiment import ExperimentConfig
from rlkit.errors import StepError
from rlkit.jobs.grpo.algorithm import GRPO, set_token_advantages
from rlkit.jobs.grpo.rank0 import Rank0
from rlkit.jobs.grpo.waits import trainer_waits
from rlkit.rollout.teacher import TeacherScorer
from rlkit.trainer.batch import MicroBatch
from rlkit.trainer.dist import gather_per_sample
from rlkit.trainer.loop import run_training
from rlkit.trainer.rl_math.distill import is_clip_weight, reverse_kl_advantages, topk_forward_kl
from rlkit.types import Sample
from rlkit.weights.base import WeightTransport


def run_distill(trial_dir: Path, config: ExperimentConfig) -> None:
    """The distill trainer step's entry point on every rank (`rlkit train --trial-dir`)."""
    run_training(trial_dir, config, Distill, waits=trainer_waits(config, scored=True))


def distill_advantages(samples: Sequence[Sample], student: dict[int, list[float]], d: DistillConfig, *,
                       rl: bool) -> dict[str, float]:
    """Every sample's token_advantages: -coef x its discounted reverse KL to the teacher, plus rl_coef x the GRPO
    advantages already set (`rl`); returns the batch's distillation metrics (means over sampled tokens)."""
    kls: list[float] = []
    teacher: list[float] = []
    for i, s in enumerate(samples):
        if s.teacher_logp is None:
            raise StepError(f"sample {i} of the batch has no teacher log-probs")
        adv, kl = reverse_kl_advantages(student[i], s.teacher_logp, coef=d.coef, discount=d.discount,
                                        mask=s.loss_mask)
        base = s.token_advantages if rl and s.token_advantages is not None else [s.advantage if rl else 0.0] * len(adv)
        s.token_advantages = [d.rl_coef * b + a for a, b in zip(adv, base, strict=True)]
        sampled = [bool(m) for m in s.loss_mask] if s.loss_mask is not None else [True] * len(kl)
        kls += [k for k, m in zip(kl, sampled, strict=True) if m]
        teacher += [t for t, m in zip(s.teacher_logp, sampled, strict=True) if m]
    if not kls:
        return {}
    return {"distill/reverse_kl": statistics.fmean(kls), "distill/teacher_logp": statistics.fmean(teacher),
            "distill/advantage_mean": statistics.fmean(a for s in samples for a in s.token_advantages or [])}


class TopKTerm:
    """The top-k forward-KL loss term of one step's samples (PPOActor.extra_loss)."""

    names: tuple[str, ...] = ("distill/topk_forward_kl",)

    def __init__(self, samples: Sequence[Sample], d: DistillConfig, temperature: float) -> None:
        self.samples, self.d, self.temperature = samples, d, temperature

    def teacher_tensors(self, mb: MicroBatch, group_idx: list[int]) -> tuple[Tensor, Tensor]:
        """[B, L-1, K] token ids and teacher log-probs at the micro-batch's completion positions (elsewhere: token
        0 at a uniform log-prob, masked out by the loss)."""
        k = self.d.topk or 0
        b, positions = mb.loss_mask.shape
        ids = torch.zeros((b, positions, k), dtype=torch.long)
        logp = torch.full((b, positions, k), -20.0)
        for row, i in enumerate(group_idx):
            if i < 0:
                continue
            s = self.samples[i]
            start = len(s.prompt_ids) - 1
            for j, pairs in enumerate(s.teacher_topk or []):
                ids[row, start + j] = torch.tensor([t for t, _ in pairs])
                logp[row, start + j] = torch.tensor([lp for _, lp in pairs])
        return ids.to(mb.input_ids.device), logp.to(mb.input_ids.device)

    def __call__(self, model: nn.Module, mb: MicroBatch, group_idx: list[int], logp: Tensor
                 ) -> tuple[Tensor, dict[str, float]]:
        ids, teacher = self.teacher_tensors(mb, group_idx)
        out: Any = model(input_ids=mb.input_ids, attention_mask=mb.attention_mask, use_cache=False)
        student = torch.log_softmax(out.logits[:, :-1].float() / self.temperature, dim=-1).gather(-1, ids)
        weight = is_clip_weight(logp, mb.behav_logp, self.d.is_clip)
        loss, per_token = topk_forward_kl(student, teacher, mb.loss_mask, add_tail=self.d.add_tail, weight=weight)
        mask = mb.loss_mask
        mean = float(torch.where(mask, per_token, 0.0).sum() / mask.sum().clamp(min=1))
        return self.d.topk_coef * loss, {"distill/topk_forward_kl": mean}


class DistillRank0(Rank0):
    """GRPO's rank 0 plus the teacher: each batch is scored before it is handed to the ranks."""

    scorer: TeacherScorer | None = None
    score_s = 0.0

    def start(self, transport: WeightTransport) -> None:
        from rlkit.nameresolve import name_resolve_for

        super().start(transport)  # waits for every auxiliary model's servers, the teacher's among them
        with name_resolve_for(self.config) as nr:
            self.scorer = TeacherScorer.for_trial(self.config, nr, self.token)
        print(f"rlkit train: teacher {self.config.distill.teacher} scores with "
              f"{', '.join(s.address for s in self.scorer.servers)}", flush=True)

    def next_batch(self) -> list[Sample] | str:
        batch = super().next_batch()
        if isinstance(batch, str):
            return batch
        try:
            assert self.scorer is not None
            started = time.monotonic()
            self.scorer.score(batch)
            self.score_s = time.monotonic() - started
            return batch
        except BaseException as exc:
            self._pending_error = exc
            return f"trainer rank 0 failed: {type(exc).__name__}: {exc}"

    def step_metrics(self, step: int, train_stats: dict[str, float], timing: dict[str, float]) -> dict[str, float]:
        timing = {**timing, "timing/teacher_score": self.score_s}
        metrics = super().step_metrics(step, train_stats, timing)
        if self.scorer is not None:
            metrics["distill/teacher_requests"] = self.scorer.requests
            metrics["distill/teacher_failures"] = self.scorer.failures
        return metrics


class Distill(GRPO):
    """On-policy distillation on one rank (the loop's `Algorithm`)."""

    rank0_class = DistillRank0
    reads_old_first = True  # the student's log-probs of the advantages

    def train_batch(self, samples: list[Sample], old: dict[int, list[float]] | None,
                    ref: dict[int, list[float]] | None) -> dict[str, float]:
        """Collective: GRPO's advantages when distill.rl_coef > 0 (with the KL reward penalty of actor.kl_ctl), the
        distillation advantages over them, then the actor's steps (with the top-k term when distill.topk)."""
        d, actor = self.config.distill, self.actor
        stats: dict[str, float] = {}
        rl = d.rl_coef > 0
        if rl:
            stats.update(set_token_advantages(actor.config, samples, old, ref, self.kl_control))
        merged = gather_per_sample(old)  # the proximal log-probs, else the servers' behaviour ones
        student = merged if merged is not None else {i: s.behav_logp for i, s in enumerate(samples)}
        stats.update(distill_advantages(samples, student, d, rl=rl))
        actor.extra_loss = TopKTerm(samples, d, actor.temperature) if d.topk and d.topk_coef > 0 else None
        try:
            stats.update(actor.train_step(samples, old, ref))
        finally:
            actor.extra_loss = None
        return stats
