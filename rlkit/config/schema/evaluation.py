"""Evaluation during training (job type grpo): when the policy is scored on `valid_dataset`, and how it samples.

Names from the seeds: AReaL's `evaluator.freq_epochs/freq_steps/freq_secs` (the saver's triggers) and its top-level
`eval_gconfig` ("None: use gconfig", here per field), Trinity-RFT's `eval_on_startup` (score the starting model once,
never again when a trial resumes). AReaL's evaluator also names experiment_name, trial_name and fileroot: rlkit's
evaluations run inside the trial and log to its metrics, so those would only repeat the trial's own names.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlkit.config.schema.fields import _f


@dataclass
class EvaluatorConfig:
    """When the current weights are scored on valid_dataset (on the same servers, while training goes on)."""

    freq_steps: int | None = _f(None, "Evaluate every N steps; None: off.", ge=1)
    freq_epochs: int | None = _f(None, "Evaluate every N epochs; None: off.", ge=1)
    freq_secs: int | None = _f(None, "Evaluate when N seconds passed since the last evaluation; None: off.", ge=1)
    eval_on_startup: bool = _f(False, "Also evaluate the starting model (weight version 0) before step 1; a resumed "
                                      "trial does not evaluate again on startup.")
    max_prompts: int | None = _f(None, "Evaluate on the first N prompts of valid_dataset only; None: all of them.",
                                 ge=1)


@dataclass
class EvalGenerationConfig:
    """Sampling of the evaluation requests; every field left at None takes gconfig's value (AReaL's eval_gconfig)."""

    n_samples: int | None = _f(None, "Completions per prompt; None: gconfig.n_samples.", ge=1)
    max_new_tokens: int | None = _f(None, "Most tokens per completion; None: gconfig.max_new_tokens.", ge=1)
    min_new_tokens: int | None = _f(None, "Fewest tokens per completion (the model's EOS cannot end one sooner; 0: "
                                          "off); None: gconfig.min_new_tokens.")
    temperature: float | None = _f(None, "Sampling temperature (0: greedy); None: gconfig.temperature.", ge=0)
    top_p: float | None = _f(None, "Nucleus sampling probability mass; None: gconfig.top_p.", gt=0, le=1)
    top_k: int | None = _f(None, "Top-k sampling, -1: off; None: gconfig.top_k.")
    stop: list[str] | None = _f(None, "Stop strings; None: gconfig.stop.")
    greedy: bool | None = _f(None, "Greedy decoding: the evaluation requests go at temperature 0, top_p 1, top_k -1 "
                                   "whatever the temperature, top_p and top_k say; None: gconfig.greedy.")


def evaluation_enabled(evaluator: EvaluatorConfig) -> bool:
    """Whether any trigger is set (then valid_dataset is required)."""
    return bool(evaluator.freq_steps or evaluator.freq_epochs or evaluator.freq_secs or evaluator.eval_on_startup)
