"""A weighted mix of reward functions (`reward.fns`: {function: weight}, as cosmos-rl writes `reward_function` and
Trinity-RFT combines rewards): each function runs in its own RewardRunner, with its own time limit
(`reward.timeouts`, else `reward.timeout`) and counts, and a completion's reward is the weighted sum.

A function that fails or times out scores 0.0 in the sum (as a single reward.fn does) and the outcome carries its
error; the other functions still count. Every outcome carries the functions' own values (`parts`, by name), which
the rollouts put in each sample's info so that the trainer logs each function's mean beside their weighted sum.
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass
from typing import Any

from rlkit.config.schema.experiment import RewardConfig
from rlkit.errors import ConfigError
from rlkit.rewards.model_reward import REWARD_MODEL
from rlkit.rewards.resolve import resolve_reward_fn
from rlkit.rewards.runner import RewardOutcome, RewardRunner

INFO_PREFIX = "reward/"  # a sample's info key of one function's value: reward/<name>


def term_name(spec: str) -> str:
    """The name a function's metrics go by: a built-in's name, else the function's own (after ':' or the last
    '.'), in letters, digits and _."""
    spec = spec.strip()
    tail = spec.rpartition(":")[2] if ":" in spec else spec.rpartition(".")[2]
    return re.sub(r"[^A-Za-z0-9_]", "_", tail) or "fn"


def term_names(reward: RewardConfig) -> list[str]:
    """The metric names of reward.fns, in order; ConfigError when two functions share one."""
    names = [term_name(spec) for spec in reward.fns]
    clashes = sorted({n for n in names if names.count(n) > 1})
    if clashes:
        raise ConfigError(f"reward.fns: functions share the metric name(s) {', '.join(clashes)}",
                          hint="give each function of the mix a distinct function name")
    return names


@dataclass
class _Term:
    name: str
    spec: str  # as reward.fns names it
    weight: float
    runner: RewardRunner
    errors_seen: int = 0
    timeouts_seen: int = 0


class RewardMix:
    """Scores a completion with every function of reward.fns; the RewardRunner interface (score, counts, close)."""

    def __init__(self, reward: RewardConfig, *, env: dict[str, str] | None = None, prompt_key: str = "prompt") -> None:
        unknown = sorted(set(reward.timeouts) - set(reward.fns))
        if unknown:
            raise ConfigError(f"reward.timeouts names {', '.join(unknown)}, which reward.fns does not list",
                              hint="key reward.timeouts by the same function specs as reward.fns")
        self.terms: list[_Term] = []
        for name, (spec, weight) in zip(term_names(reward), reward.fns.items(), strict=True):
            fn = resolve_reward_fn(spec, reward.answer_key, reward.reward_model_path, served=_served(reward),
                                   prompt_key=prompt_key)
            timeout = float(reward.timeouts.get(spec, reward.timeout))
            runner = RewardRunner(fn, timeout, workers=_workers(spec, reward), env=env)
            self.terms.append(_Term(name, spec, float(weight), runner))

    @property
    def calls(self) -> int:
        return self.terms[0].runner.calls if self.terms else 0

    @property
    def errors(self) -> int:
        return sum(t.runner.errors for t in self.terms)

    @property
    def timeouts(self) -> int:
        return sum(t.runner.timeouts for t in self.terms)

    async def score(self, prompt: str, completion: str, row: dict[str, Any]) -> RewardOutcome:
        """The weighted sum of every function's score (a failed one: 0.0, its error kept); never raises."""
        outcomes = await asyncio.gather(*(t.runner.score(prompt, completion, row) for t in self.terms))
        value = sum(t.weight * o.value for t, o in zip(self.terms, outcomes, strict=True))
        errors = [f"{t.name}: {o.error}" for t, o in zip(self.terms, outcomes, strict=True) if o.error is not None]
        return RewardOutcome(value, "; ".join(errors) or None, timed_out=any(o.timed_out for o in outcomes),
                             parts=tuple((t.name, o.value) for t, o in zip(self.terms, outcomes, strict=True)))

    def step_counts(self) -> dict[str, float]:
        """Each function's errors and timeouts since the last call (per-step metrics)."""
        out: dict[str, float] = {}
        for t in self.terms:
            out[f"reward/fn/{t.name}/errors"] = t.runner.errors - t.errors_seen
            out[f"reward/fn/{t.name}/timeouts"] = t.runner.timeouts - t.timeouts_seen
            t.errors_seen, t.timeouts_seen = t.runner.errors, t.runner.timeouts
        return out

    def close(self) -> None:
        for t in self.terms:
            t.runner.close()


RewardScorer = RewardRunner | RewardMix  # what scores rollouts: reward_scorer


def part_means(samples_info: list[dict[str, float]], names: list[str]) -> dict[str, float]:
    """Each function's mean value over the samples (their info holds reward/<name>): reward/fn/<name>/mean."""
    out: dict[str, float] = {}
    for name in names:
        values = [info[INFO_PREFIX + name] for info in samples_info if INFO_PREFIX + name in info]
        if values:
            out[f"reward/fn/{name}/mean"] = sum(values) / len(values)
    return out


def reward_scorer(reward: RewardConfig, *, env: dict[str, str] | None = None,
                  prompt_key: str = "prompt") -> RewardScorer:
    """What scores the rollouts: the mix of reward.fns when set, else the one reward.fn (`prompt_key`: the rows'
    prompt column, where a reward model trained elsewhere reads the chat it renders)."""
    if reward.fns:
        return RewardMix(reward, env=env, prompt_key=prompt_key)
    return RewardRunner(resolve_reward_fn(reward.fn, reward.answer_key, reward.reward_model_path,
                                          served=_served(reward), prompt_key=prompt_key), reward.timeout,
                        workers=_workers(reward.fn, reward), env=env)


def _served(reward: RewardConfig) -> bool:
    """Whether `reward_model` is asked of its servers (rlkit.config.served_models), not loaded in a worker."""
    return reward.reward_model_engine_num > 0


def _workers(spec: str, reward: RewardConfig) -> int:
    """Worker processes for the function `spec` names: reward.num_workers, but one for a reward model scored here
    (each worker would load the model; a served one's workers only send requests)."""
    return 1 if spec.strip() == REWARD_MODEL and not _served(reward) else reward.num_workers
