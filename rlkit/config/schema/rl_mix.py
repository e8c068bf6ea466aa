"""The `opmd` and `mix` sections: Trinity-RFT's `algorithm_type: opmd` and `mix` (rlkit.trainer.rl_math.opmd writes
out their formulas).

opmd: job type opmd's knobs, Trinity-RFT's names (its advantage_fn_args / policy_loss_fn_args `tau` and
`opmd_baseline`). mix: the weight `mu` of the SFT loss of expert rows (`expert_dataset`, read in the `sft` section's
row format) in every step of grpo, ppo or opmd; Trinity-RFT reads them from `sft_warmup_dataset` with a share of
each batch (`expert_data_ratio`), rlkit with expert_dataset.batch_size rows per step.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlkit.config.schema.fields import _f


@dataclass
class OPMDConfig:
    """Job type opmd: advantage = reward - group baseline, loss = token-mean(-A * log pi) / (1 + tau)."""

    tau: float = _f(1.0, "Strength of the mirror-descent regulariser: the loss is divided by 1 + tau, and the "
                         "logavgexp baseline is tau * log(mean(exp(r / tau))).", gt=0)
    opmd_baseline: str = _f("mean", "Group baseline subtracted from each reward. Choices: mean, logavgexp (a soft "
                                    "maximum of the group's rewards at temperature tau).")


@dataclass
class MixConfig:
    """SFT+RL mix: the step's loss is (1 - mu) * RL loss + mu * SFT loss of expert_dataset.batch_size expert rows."""

    mu: float = _f(0.1, "Weight of the expert rows' SFT loss (Trinity-RFT's mix mu); used when expert_dataset.path "
                        "is set.", ge=0, le=1)
