"""Optimizer steps skipped for a NaN or infinite gradient norm (rlkit.trainer.engine): counted for the step metrics
(`<engine>/skipped_steps`: tensorboard and swanlab see them, where the log line alone did not reach), and the stop
after MAX_SKIPPED_IN_A_ROW in a row.

Every rank holds the same all-reduced norm, so every rank skips, counts and stops alike.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rlkit.errors import StepError

MAX_SKIPPED_IN_A_ROW = 5  # optimizer steps skipped for a NaN/inf gradient norm, in a row, before the trainer stops


class SkippedSteps:
    """One engine's skipped optimizer steps: in a row (for the stop), and since the loop last took them (the metric)."""

    def __init__(self) -> None:
        self.in_a_row = 0
        self.untaken = 0

    def skip(self, norm: float, *, announce: bool) -> None:
        """One more skipped step (StepError at the MAX_SKIPPED_IN_A_ROW-th in a row: a run that trains nothing must
        not run on unseen); `announce`: say it in the log (rank 0)."""
        self.in_a_row += 1
        self.untaken += 1
        if self.in_a_row >= MAX_SKIPPED_IN_A_ROW:
            raise StepError(f"the gradient norm was NaN or infinite at {self.in_a_row} optimizer steps in a row (each "
                            "skipped): the loss is broken, look for NaN rewards, advantages or log-probs in the "
                            "trainer's log")
        if announce:
            print(f"rlkit train: WARNING: the gradient norm is {norm}: this optimizer step is skipped, the weights "
                  "and optimizer state stay as they were (a NaN or infinite loss); "
                  f"{MAX_SKIPPED_IN_A_ROW} in a row stop the trainer", flush=True)

    def taken(self) -> None:
        """A step was taken: the run of skipped ones is over."""
        self.in_a_row = 0

    def take(self) -> int:
        """The steps skipped since the last take."""
        count, self.untaken = self.untaken, 0
        return count


def skipped_metrics(engines: Mapping[str, Any]) -> dict[str, float]:
    """`<name>/skipped_steps` of each engine (its `skipped`): the optimizer steps it skipped during this training
    step (0 normally; ppo_n_minibatches at most). Every rank takes them, so every rank's count starts again."""
    return {f"{name}/skipped_steps": float(engine.skipped.take()) for name, engine in engines.items()}
