"""The sampling settings of the requests, built from the config in one place: the generate step
(rlkit.jobs.generate.step), the GRPO/PPO rollouts (rlkit.jobs.grpo.rank0) and the evaluator (rlkit.trainer.evaluator)
all call `sampling_params`, so they agree on what each field means.

`greedy` (AReaL's gconfig.greedy, eval_gconfig.greedy) is greedy decoding: the request goes at temperature 0 with
top_p and top_k neutral (1, -1), whatever temperature, top_p and top_k say. It never reaches training: the submit
checks refuse it for GRPO and PPO rollouts (rlkit.checks.sampling.validate_greedy), and the trainer takes
its log-probs at gconfig.temperature, which they require to be > 0.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlkit.servers.backend import SamplingParams

if TYPE_CHECKING:
    from rlkit.config.schema.experiment import ExperimentConfig

GREEDY_TEMPERATURE, NEUTRAL_TOP_P, NEUTRAL_TOP_K = 0.0, 1.0, -1


def sampling_params(config: ExperimentConfig, *, evaluation: bool = False) -> SamplingParams:
    """gconfig's settings, or with `evaluation` eval_gconfig's with each unset (None) field taken from gconfig
    (AReaL: "None: use gconfig"); greedy decoding overrides temperature, top_p and top_k."""
    g = config.gconfig
    n, max_new, min_new, temperature, top_p, top_k, stop, greedy = (
        g.n_samples, g.max_new_tokens, g.min_new_tokens, g.temperature, g.top_p, g.top_k, g.stop, g.greedy)
    if evaluation:
        e = config.eval_gconfig
        n = n if e.n_samples is None else e.n_samples
        max_new = max_new if e.max_new_tokens is None else e.max_new_tokens
        min_new = min_new if e.min_new_tokens is None else e.min_new_tokens
        temperature = temperature if e.temperature is None else e.temperature
        top_p = top_p if e.top_p is None else e.top_p
        top_k = top_k if e.top_k is None else e.top_k
        stop = stop if e.stop is None else e.stop
        greedy = greedy if e.greedy is None else e.greedy
    if greedy:
        temperature, top_p, top_k = GREEDY_TEMPERATURE, NEUTRAL_TOP_P, NEUTRAL_TOP_K
    return SamplingParams(n=n, max_new_tokens=max_new, min_new_tokens=min_new, temperature=temperature, top_p=top_p,
                          top_k=top_k, stop=list(stop))
