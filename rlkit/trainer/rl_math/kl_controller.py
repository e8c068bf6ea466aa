"""The KL reward penalty's coefficient over a run: fixed (actor.kl_ctl), or adaptive (actor.kl_ctl_adaptive).

The adaptive controller is Ziegler et al. 2019 ("Fine-Tuning Language Models from Human Preferences"), as verl's
`algorithm.kl_ctrl.type: adaptive` and Trinity-RFT's `adaptive: true`: after each step the coefficient is multiplied
by 1 + e x n / horizon, where e = clip(kl / target_kl - 1, -0.2, 0.2) is the step's proportional error and n the
number of sequences the step measured `kl` over. So a KL above target raises the penalty, one below lowers it, by at
most 0.2 x n / horizon per step. The coefficient is part of the run's state: a resumed run continues from the saved
value (rlkit.jobs.grpo.algorithm saves it with the algorithm's state).
"""

from __future__ import annotations

import math
from typing import Any

from rlkit.config.schema.actor import KL_CONTROL_ERROR_CLIP as ERROR_CLIP
from rlkit.config.schema.actor import ActorConfig

STATE_KEY = "kl_ctl"  # the coefficient's key in the algorithm's state of a recover checkpoint


def adapted_kl_coef(coef: float, kl: float, *, target_kl: float, horizon: float, n: int) -> float:
    """The coefficient after a step that measured `kl` over `n` sequences (pure)."""
    error = min(max(kl / target_kl - 1.0, -ERROR_CLIP), ERROR_CLIP)
    return coef * (1.0 + error * n / horizon)


class KLController:
    """The coefficient the next step's KL reward penalty uses; identical on every trainer rank, since every rank
    updates it from the same whole-batch statistic."""

    def __init__(self, actor: ActorConfig) -> None:
        self.value = float(actor.kl_ctl)
        self.adaptive = actor.kl_ctl_adaptive

    def update(self, kl: float, n: int) -> None:
        """After a step: move the coefficient toward target_kl (fixed: unchanged). A KL that is no finite number (a
        step of non-finite log-probs, whose optimizer step the engine skips) leaves it as it was: NaN would stay the
        coefficient of every later step, and the checkpoint's value would be refused on resume."""
        if self.adaptive is not None and n > 0 and math.isfinite(kl):
            self.value = adapted_kl_coef(self.value, kl, target_kl=self.adaptive.target_kl,
                                         horizon=self.adaptive.horizon, n=n)

    def step_done(self, stats: dict[str, float], n: int) -> dict[str, float]:
        """After a step's penalty of coefficient `value` over `n` sequences (`stats`: advantages_and_returns'): that
        coefficient as the statistic `kl_ctl`, and the update for the next step. Nothing without a penalty."""
        if "kl_seq_mean" not in stats:
            return {}
        used = self.value
        self.update(stats["kl_seq_mean"], n)
        return {"kl_ctl": used}

    def state(self) -> dict[str, float]:
        """The algorithm state's part of the controller (nothing when fixed: the config holds it)."""
        return {STATE_KEY: self.value} if self.adaptive is not None else {}

    def restore(self, state: dict[str, Any]) -> str:
        """Continue from a recover checkpoint's algorithm state; returns what to say of it ("" when fixed). A state
        without the coefficient (saved by a run without the controller) keeps the starting one; one with it, resumed
        with the controller turned off, drops it, said, since the penalty's strength then changes at once. ValueError
        when the saved value is no positive finite number (the file was altered)."""
        if self.adaptive is None:
            if STATE_KEY not in state:
                return ""
            saved = state[STATE_KEY]
            held = f" {saved:g}" if type(saved) in (int, float) and math.isfinite(saved) else ""
            return (f"the checkpoint's adaptive KL coefficient{held} is not continued: actor.kl_ctl_adaptive is off "
                    f"in this attempt, so the penalty uses actor.kl_ctl {self.value:g} from now on")
        if STATE_KEY not in state:
            return (f"the checkpoint holds no adaptive KL coefficient (its run had none): starting from "
                    f"actor.kl_ctl {self.value:g}")
        saved = state[STATE_KEY]
        if type(saved) not in (int, float) or not math.isfinite(saved) or saved <= 0:
            raise ValueError(f"its {STATE_KEY} {str(saved)[:50]!r} is not a positive number")
        self.value = float(saved)
        return f"the adaptive KL coefficient continues at {self.value:g}"
