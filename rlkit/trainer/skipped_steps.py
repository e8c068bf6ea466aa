"""Optimizer steps skipped (rlkit.trainer.engine): for a NaN or infinite gradient norm, counted for the step metrics
(`<engine>/skipped_steps`: tensorboard and swanlab see them, where the log line alone did not reach), with the stop
after MAX_SKIPPED_IN_A_ROW in a row; and for a gradient of exactly zero (`<engine>/zero_gradient_steps`).

A zero gradient is a batch with nothing to learn from: every GRPO group flat (all advantages 0) and no KL or entropy
term. Taking the step anyway moves every weight by AdamW's moments alone, at nearly full size for several steps (m
decays by beta1 a step, the root of v by only sqrt(beta2)): the stale direction of the last real gradient, with
nothing in the batch to correct it. On the two-stage demo, whose GRPO stage starts from a model that already solves the
task, one failed sample's gradient at step 4 and four flat steps after it raised the policy's entropy 1.17 -> 1.32
with the loss at 0, and the reward fell to 0.47 at step 9 and 0.26 at step 10. Skipping such a step leaves the
weights and the moments as they were (the learning-rate schedule still counts it): the same run, identical to step 4,
kept its entropy at 1.19-1.20 and its reward at 0.97 and 0.90 (last three steps 0.955 against 0.577). rasbt's
reasoning-from-scratch (`--skip-zero-advantage-updates`) and prime-rl offer this; TRL and verl take the step.

Every rank holds the same all-reduced norm, so every rank skips, counts and stops alike.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rlkit.errors import StepError

MAX_SKIPPED_IN_A_ROW = 5  # optimizer steps skipped for a NaN/inf gradient norm, in a row, before the trainer stops
ZERO_IN_A_ROW_WARNING = 10  # zero-gradient steps in a row before the log says the run is learning nothing


class SkippedSteps:
    """One engine's skipped optimizer steps: in a row (for the stop), and since the loop last took them (the metric)."""

    def __init__(self) -> None:
        self.in_a_row = 0
        self.untaken = 0
        self.zero_untaken = 0  # steps skipped for a zero gradient since the loop last took them
        self.zero_in_a_row = 0

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
        self.in_a_row = self.zero_in_a_row = 0

    def zero(self, *, announce: bool) -> None:
        """A step skipped for a gradient of exactly zero (nothing to learn from; not a broken loss: no stop). A run of
        ZERO_IN_A_ROW_WARNING in a row is said once in the log (`announce`: rank 0): every group's rewards flat."""
        self.zero_untaken += 1
        self.zero_in_a_row += 1
        if announce and self.zero_in_a_row == ZERO_IN_A_ROW_WARNING:
            print(f"rlkit train: WARNING: the gradient was exactly zero at {self.zero_in_a_row} optimizer steps in a "
                  "row (each skipped): the batches hold nothing to learn from, every group's rewards equal (all "
                  "solved, or all failed); look at reward/mean, the reward function, or actor.dynamic_sampling",
                  flush=True)

    def take(self) -> tuple[int, int]:
        """The steps skipped since the last take: for a non-finite norm, and for a zero gradient."""
        counts = (self.untaken, self.zero_untaken)
        self.untaken = self.zero_untaken = 0
        return counts


def skipped_metrics(engines: Mapping[str, Any]) -> dict[str, float]:
    """`<name>/skipped_steps` and `<name>/zero_gradient_steps` of each engine (its `skipped`): the optimizer steps
    it skipped during this training step for a non-finite norm and for a zero gradient (0 normally;
    ppo_n_minibatches x ppo_epochs at most). Every rank takes them, so every rank's counts start again."""
    metrics = {}
    for name, engine in engines.items():
        broken, zero = engine.skipped.take()
        metrics[f"{name}/skipped_steps"], metrics[f"{name}/zero_gradient_steps"] = float(broken), float(zero)
    return metrics
