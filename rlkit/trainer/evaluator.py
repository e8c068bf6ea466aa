"""Evaluation during GRPO training (trainer rank 0): the current weights scored on valid_dataset, beside training.

When `evaluator.freq_*` says so (the saver's triggers, rlkit.trainer.loop_rank0.Saver), all validation prompts go at
once to the same servers through the rollout controller's loop, as a background task, right after a weight push:
training goes on, and the result is merged into the metrics of the step during which it finished. One evaluation at
a time (a due one waits for the running one); the last step always evaluates the final weights and waits for it.

A prompt is sampled the way training samples a group (rlkit.rollout.groups: the training sampler's `for_params`) at
eval_gconfig's settings: one request for its completions, or with rollout.agent one episode per sample of the same
workflow, tools and limits, whose agent metrics are logged under `eval/agent/`.

An evaluation is of one weight version: the next push first waits for it (at most about one request time, as its
requests run side by side, or one episode's turns and tool calls; `timing/eval_wait`), and a sample during which an
update began anyway (its tokens may come from two versions) is counted in `eval/version_mismatches` and left out of
`eval/reward`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rlkit.agent.episode import Episode
from rlkit.agent.metrics import batch_metrics
from rlkit.config.schema.evaluation import EvaluatorConfig
from rlkit.config.schema.experiment import ExperimentConfig
from rlkit.rewards.reasoning_gym import task_metrics
from rlkit.rollout.controller import RolloutController
from rlkit.rollout.groups import GroupSampler, Prompt
from rlkit.servers.backend import SamplingParams
from rlkit.servers.sampling import sampling_params
from rlkit.trainer.loop_rank0 import Saver
from rlkit.types import Sample


def eval_sampling(config: ExperimentConfig) -> SamplingParams:
    """eval_gconfig with each unset field taken from gconfig (AReaL: "None: use gconfig"), greedy decoding included
    (rlkit.servers.sampling)."""
    return sampling_params(config, evaluation=True)


def episode_bound(config: ExperimentConfig, request: float) -> float:
    """The longest one sample may take, given the longest one model call may (`request` s): that call, or for
    rollout.agent's episodes max_turns turns, each a call and its tool calls (tool_timeout, the code tool's own
    limit)."""
    agent = config.rollout.agent
    if not agent.workflow.strip():
        return request
    code = agent.code_tool
    tool = max(agent.tool_timeout, code.wall_seconds + 30.0 if code.enabled else 0.0)
    return agent.max_turns * (request + tool)


def eval_wait_bound(config: ExperimentConfig) -> float:
    """How long a push waits for a running evaluation: one request (rollout.request_timeout), or for episodes each
    of max_turns turns with its tool calls (`episode_bound`)."""
    return episode_bound(config, config.rollout.request_timeout)


class EvalSchedule:
    """When to start an evaluation: the saver's decision (freq_steps / freq_epochs / freq_secs), kept owed while one
    is still running, and always after the last step."""

    def __init__(self, config: EvaluatorConfig, now: float) -> None:
        self.trigger = Saver(config.freq_steps, config.freq_epochs, config.freq_secs, now)
        self.owed = False

    def should_start(self, step: int, epoch: int, now: float, *, running: bool, last: bool) -> bool:
        self.owed |= self.trigger.due(step, epoch, now) or last
        if self.owed and not running:
            self.owed = False
            return True
        return False


@dataclass
class EvalOutcome:
    """One finished evaluation."""

    version: int
    rewards: list[float] = field(default_factory=list)  # samples made wholly at `version`
    mismatched: int = 0  # samples during which a weight update began
    request_failures: int = 0  # prompts whose request (or episode) failed after its retries
    reward_errors: int = 0
    seconds: float = 0.0
    episodes: list[Episode] = field(default_factory=list)  # rollout.agent: the episodes of `rewards`
    scored: list[tuple[dict[str, Any], list[Sample]]] = field(default_factory=list)  # each prompt's row and samples

    @property
    def reward(self) -> float:
        return statistics.fmean(self.rewards) if self.rewards else math.nan

    def metrics(self) -> dict[str, float]:
        return {"eval/reward": self.reward, "eval/n": len(self.rewards), "eval/version": self.version,
                "eval/version_mismatches": self.mismatched, "eval/request_failures": self.request_failures,
                "eval/reward_errors": self.reward_errors, "eval/seconds": self.seconds,
                **batch_metrics(self.episodes, prefix="eval/agent/"), **task_metrics(self.scored, prefix="eval")}


class Evaluator:
    """Rank 0's evaluations; `after_step` is called once per finished step, after its weights reached the servers."""

    def __init__(self, config: ExperimentConfig, prompts: list[Prompt], controller: RolloutController,
                 sampler: GroupSampler, clock: Callable[[], float] = time.monotonic) -> None:
        """`sampler`: the training sampler; the evaluation samples with its `for_params(eval_sampling(config))`."""
        cap = config.evaluator.max_prompts
        self.sampler = sampler.for_params(eval_sampling(config), prompt_key=config.valid_dataset.prompt_key)
        self.prompts = self.sampler.fitting(prompts[:cap] if cap is not None else prompts, dataset="valid_dataset")
        self.controller, self.clock = controller, clock
        self.wait_s = eval_wait_bound(config)
        self.schedule = EvalSchedule(config.evaluator, clock())
        self.running: concurrent.futures.Future[EvalOutcome] | None = None
        self.finished: list[EvalOutcome] = []  # since the last after_step
        self.last: EvalOutcome | None = None

    def progress(self) -> dict[str, float | int | None]:
        """The last evaluation's fields of progress.json (`rlkit status`); empty before the first one."""
        if self.last is None:
            return {}
        reward = self.last.reward
        return {"eval_reward": reward if math.isfinite(reward) else None, "eval_version": self.last.version}

    def start(self) -> None:
        """Evaluate the weights the servers hold now, in the background."""
        self.running = self.controller.submit(self._evaluate())

    def wait_before_push(self) -> float:
        """Before the next weight push: let the running evaluation finish (at most rollout.request_timeout), so that
        its completions all come from one version; returns the seconds waited (training's only wait for it)."""
        started = time.monotonic()
        if self.running is not None and not self.running.done():
            self._settle(self.wait_s, cancel=False)
        return time.monotonic() - started

    def after_step(self, step: int, epoch: int, *, last: bool) -> dict[str, float]:
        """The metrics of the evaluation that finished since the previous step (if any); starts one when due. At the
        last step, waits for the running one and then for the evaluation of the final weights."""
        if self.running is not None and (last or self.running.done()):
            self._settle(self.wait_s, cancel=True)
        if self.schedule.should_start(step, epoch, self.clock(), running=self.running is not None, last=last):
            self.start()
            if last:
                self._settle(self.wait_s, cancel=True)
        finished, self.finished = self.finished, []
        return finished[-1].metrics() if finished else {}  # two only if the last step waited for an older one

    def _settle(self, timeout: float, *, cancel: bool) -> None:
        """Wait up to `timeout` s for the running evaluation; keep its outcome for the step's metrics."""
        assert self.running is not None
        try:
            outcome = self.running.result(timeout=timeout)
        except concurrent.futures.TimeoutError:
            print(f"rlkit train: an evaluation is still running after {timeout:g} s (rollout.request_timeout)"
                  + ("; it is dropped" if cancel else "; the weights change under it"), flush=True)
            if cancel:
                self.running.cancel()
                self.running = None
            return
        except Exception as exc:  # an evaluation never fails training
            print(f"rlkit train: an evaluation failed: {type(exc).__name__}: {exc}", flush=True)
            self.running = None
            return
        self.running = None
        self.last = outcome
        self.finished.append(outcome)
        print(f"rlkit train: eval at weight version {outcome.version}: reward {outcome.reward:.3f} over "
              f"{len(outcome.rewards)} completions ({outcome.mismatched} across a weight update, "
              f"{outcome.request_failures} failed requests) in {outcome.seconds:.1f} s", flush=True)

    async def _evaluate(self) -> EvalOutcome:
        started = time.monotonic()
        version, _ = await self.controller.settled_version()
        outcome = EvalOutcome(version)
        failures: list[str] = []

        async def one(i: int, prompt: Prompt) -> None:
            try:  # seeded by the prompt's position (`seq`): the same sampling at every version, so versions compare
                sampled, at, clean = await self.controller.sample_at_one_version(self.sampler, prompt, i)
            except Exception as exc:
                outcome.request_failures += 1
                failures.append(f"{type(exc).__name__}: {exc}")
                return
            if sampled.dropped_episodes:  # an agent program's episodes that could not be finished
                outcome.request_failures += 1
                failures.append(f"{sampled.dropped_episodes} episodes dropped (the log above says why)")
            if at != version or not clean:
                outcome.mismatched += len(sampled.samples)
                return
            outcome.rewards.extend(s.reward for s in sampled.samples)
            outcome.scored.append((prompt.row, sampled.samples))
            outcome.reward_errors += sampled.reward_errors + sampled.reward_timeouts
            outcome.episodes.extend(sampled.episodes)

        await asyncio.gather(*(one(i, p) for i, p in enumerate(self.prompts)))
        if failures:  # the first one says why (a request's retries, or an episode workflow's error)
            print(f"rlkit train: {len(failures)} evaluation prompts failed; the first: {failures[0]}", flush=True)
        outcome.seconds = time.monotonic() - started
        return outcome
