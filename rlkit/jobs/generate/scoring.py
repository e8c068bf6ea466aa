"""generate.score: each completion scored by the run's `reward` section exactly as the rollouts of training score
it: the same scorer (rlkit.rewards.mix.reward_scorer: reward.fn or the mix of reward.fns, in RewardRunner's worker
processes with their time limits and error counts), the same prompt text and the same completion text (the token
ids decoded without special tokens, rlkit.jobs.grpo.rank0). Nothing here scores on its own: a failed or timed-out
call keeps the runner's 0.0, and its line says so (`reward_error`, `reward_timed_out`) besides the counts."""

from __future__ import annotations

import asyncio
from typing import Any

from rlkit.config.schema.experiment import ExperimentConfig
from rlkit.rewards.mix import RewardMix, reward_scorer


class CompletionScorer:
    """Scores the completions of one prompt at a time; `counts` for the summary; `close` ends the workers."""

    def __init__(self, config: ExperimentConfig) -> None:
        self.scorer = reward_scorer(config.reward, prompt_key=config.generate.dataset.prompt_key)

    async def score(self, prompt: str, texts: list[str], row: dict[str, Any]) -> list[dict[str, Any]]:
        """Per completion, the fields its line gains: reward, a mix's per-function rewards, and the error of a
        failed call."""
        outcomes = await asyncio.gather(*(self.scorer.score(prompt, text, row) for text in texts))
        fields = []
        for outcome in outcomes:
            one: dict[str, Any] = {"reward": outcome.value}
            if outcome.parts:
                one["rewards"] = dict(outcome.parts)
            if outcome.error is not None:
                one["reward_error"] = outcome.error
            if outcome.timed_out:
                one["reward_timed_out"] = True
            fields.append(one)
        return fields

    def counts(self) -> dict[str, Any]:
        """The reward calls as the runners counted them (a timed-out call counts as timed out, not failed)."""
        scorer = self.scorer
        counts: dict[str, Any] = {"reward_calls": scorer.calls, "failed_calls": scorer.errors,
                                  "timed_out_calls": scorer.timeouts}
        if isinstance(scorer, RewardMix):
            counts["functions"] = {t.name: {"fn": t.spec, "weight": t.weight, "failed_calls": t.runner.errors,
                                            "timed_out_calls": t.runner.timeouts} for t in scorer.terms}
        return counts

    def close(self) -> None:
        self.scorer.close()
