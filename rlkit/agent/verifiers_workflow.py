"""`rollout.agent.workflow: verifiers`: a verifiers environment's episodes, trained token-exact.

rlkit never imports verifiers (it pins openai<3; the dev venv holds openai 3): the run's verifiers program
(rlkit.agent.verifiers_worker, under the verifiers venv's interpreter: scripts/verifiers-env.sh) calls
`Env.run_episode` for each episode with verifiers' train client pointed at this episode's key on rlkit's agent
endpoint. The client
renders its turns itself and posts token ids to the token-level route (rlkit.agent.token_route), where each turn is
sampled like every rollout turn and recorded as the episode's trajectory. The row names the task: `task`, its index
in the taskset (rollout.agent.verifiers.environment).

rlkit trains on its own recording (the server's ids, behaviour log-probs and weight versions) and checks it against
the trace verifiers returns: the trained branch's token ids must equal the trajectory's, token for token, and its
`sampled_mask` must mark exactly the tokens rlkit sampled; any difference is a TrajectoryMismatch, never trained on.
The reward is the trace's (verifiers' weighted sum of its @reward functions). An episode verifiers reports as not ok
(a harness or scoring error), one the program fails or that runs past the timeout, or one of more than one trace (a
multi-agent env) is dropped with its reason, like an agent program's (rlkit.agent.openai_workflow).

The run's first episodes, and every one whose check fails, are written to the trainer's log in full, one JSON line
each (`rlkit verifiers: episode ...`): the prompt verifiers rendered, the reply, the sample rlkit trains on and the
trace beside it, the reward. It is what to read first when an environment's episodes or rewards look wrong.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from typing import Any

from rlkit.agent.context import EpisodeContext
from rlkit.agent.episode import Episode, EpisodeDropped
from rlkit.agent.openai_endpoint import EndpointPerLoop
from rlkit.agent.trajectory import SampledSegment, TrajectoryMismatch
from rlkit.agent.verifiers_worker import VerifiersWorker
from rlkit.errors import ConfigError, StepError

DEFAULT_PYTHON = "~/.cache/rlkit-verifiers/venv/bin/python"
TASK_FIELD = "task"  # the row's index of its task in the taskset
SHOWN_EPISODES = 3  # the run's first episodes written to the log in full (and every one whose check fails)
EPISODE_RECORD = "rlkit verifiers: episode"  # how those log lines start


@dataclass(frozen=True)
class VerifiersEnvironment:
    """What every episode of the run hands the program (rollout.agent.verifiers), resolved once."""

    python: str
    environment: str
    args: dict[str, Any]
    harness: str
    runtime: str
    timeout: float


def verifiers_python(configured: str) -> str:
    """The verifiers venv's interpreter: the setting, else $RLKIT_VERIFIERS_PYTHON, else the default venv."""
    return os.path.expanduser(configured.strip() or os.environ.get("RLKIT_VERIFIERS_PYTHON", "") or DEFAULT_PYTHON)


def resolve_environment(settings: Any) -> VerifiersEnvironment:
    """rollout.agent.verifiers as a VerifiersEnvironment; ConfigError (with the fix) when it names no environment."""
    if not settings.environment.strip():
        raise ConfigError("rollout.agent.verifiers.environment is empty: workflow verifiers needs the taskset to play",
                          hint="set rollout.agent.verifiers.environment=<taskset module importable in the verifiers "
                               "venv>")
    return VerifiersEnvironment(verifiers_python(settings.python), settings.environment.strip(), dict(settings.args),
                                settings.harness, settings.runtime, float(settings.timeout))


class VerifiersWorkflow(EndpointPerLoop):
    """The episode workflow of `verifiers` (an `async def episode(ctx, row)` like any other; see the module)."""

    def __init__(self, environment: VerifiersEnvironment) -> None:
        super().__init__()
        self.environment = environment
        self._worker: VerifiersWorker | None = None
        self._shown = 0  # episodes written to the log in full (_show)

    def _new_loop(self) -> None:
        """Each loop's endpoint has the loop's own verifiers program."""
        self._worker = VerifiersWorker(self.environment.python)

    async def __call__(self, ctx: EpisodeContext, row: dict[str, Any]) -> Episode:
        task = row.get(TASK_FIELD)
        if isinstance(task, bool) or not isinstance(task, int) or task < 0:
            raise EpisodeDropped(f"the row's {TASK_FIELD!r} is {task!r}: workflow verifiers needs the task's index in "
                                 "the taskset (a non-negative integer)")
        endpoint = await self.endpoint()
        session = endpoint.open(ctx)
        try:
            result = await self._run(endpoint.base_url(session), ctx, task)
        finally:
            endpoint.close(session)
        async with session.lock:  # a call the program left in flight ends before the trajectory is read
            pass
        if session.failure is not None:
            raise StepError(f"a verifiers episode's turn could not be sampled: {type(session.failure).__name__}: "
                            f"{session.failure}") from session.failure
        if not result.get("ok"):
            raise EpisodeDropped(f"verifiers reports the episode as failed: {'; '.join(result.get('errors') or [])}")
        traces = result.get("traces") or []
        if len(traces) != 1 or not traces[0].get("branches"):
            raise EpisodeDropped(f"the episode has {len(traces)} traces: workflow verifiers trains one agent's trace "
                                 "with a trainable branch")
        if session.segments == 0 or ctx.builder.turns == 0:
            raise EpisodeDropped("the verifiers episode made no call to the token route that was answered")
        reward = traces[0].get("reward")
        if isinstance(reward, bool) or not isinstance(reward, int | float) or not math.isfinite(reward):
            raise EpisodeDropped(f"the verifiers trace's reward is {reward!r}, not a finite number")
        episode = ctx.finish(float(reward), verifiers_calls=float(session.calls),
                             verifiers_segments=float(session.segments))
        branch = traces[0]["branches"][-1]
        try:
            episode.info["verifiers_checked_tokens"] = float(check_branch(ctx, branch))
        except TrajectoryMismatch:
            self._show(ctx, task, episode, branch, "its trace does not match what rlkit sampled")
            raise
        if self._shown < SHOWN_EPISODES:
            self._show(ctx, task, episode, branch, f"one of the run's first {SHOWN_EPISODES}")
        return episode

    def _show(self, ctx: EpisodeContext, task: int, episode: Episode, branch: dict[str, Any], why: str) -> None:
        """The episode in full in the trainer's log, as a JSON line: what verifiers rendered, what rlkit trains on
        (the sample: prompt, completion, loss mask, the server's log-probs) and verifiers' trace beside it."""
        self._shown += 1
        sample = episode.to_sample(group=-1)
        record = {"task": task, "prompt": ctx.tokenizer.decode(sample.prompt_ids),
                  "reply": ctx.tokenizer.decode(sample.completion_ids, skip_special_tokens=True),
                  "reward": episode.reward, "prompt_ids": sample.prompt_ids, "completion_ids": sample.completion_ids,
                  "loss_mask": sample.loss_mask, "behav_logp": sample.behav_logp,
                  "trace": {key: branch.get(key) for key in ("token_ids", "sampled_mask", "logprobs")}}
        print(f"{EPISODE_RECORD} ({why}): {json.dumps(record)}", flush=True)

    async def _run(self, base_url: str, ctx: EpisodeContext, task: int) -> dict[str, Any]:
        env = self.environment
        assert self._worker is not None
        spec = {"environment": env.environment, "args": env.args, "harness": env.harness, "runtime": env.runtime,
                "task": task, "base_url": base_url, "tokenizer": str(ctx.tokenizer.name_or_path),
                "temperature": ctx.services.params.temperature, "max_tokens": ctx.builder.limits.max_tokens_per_turn}
        return await self._worker.episode(spec, env.timeout)

    async def stop(self) -> None:
        """End the verifiers program and the endpoint of the running loop (the program also ends with the trainer)."""
        if self._worker is not None:
            await self._worker.stop()
        if self._endpoint is not None:
            await self._endpoint.stop()


def check_branch(ctx: EpisodeContext, branch: dict[str, Any]) -> int:
    """The trace's trained branch is the trajectory rlkit recorded: the same ids token for token, `sampled_mask` on
    exactly the sampled ones, the server's log-probs on them; TrajectoryMismatch if not. Returns how many sampled
    tokens it compared (`agent/verifiers_checked_tokens`: equal to `agent/trained_tokens` when every trained token
    was checked)."""
    builder = ctx.builder
    ids = list(builder.context_ids())
    if list(branch.get("token_ids") or []) != ids:
        raise TrajectoryMismatch(f"the verifiers trace's branch ({len(branch.get('token_ids') or [])} tokens) is not "
                                 f"the trajectory rlkit sampled ({len(ids)} tokens)")
    sampled = [False] * len(builder.prompt_ids)
    for segment in builder.segments:
        sampled += [isinstance(segment, SampledSegment)] * len(segment.token_ids)
    if [bool(m) for m in branch.get("sampled_mask") or []] != sampled:
        raise TrajectoryMismatch("the verifiers trace's sampled_mask does not mark exactly the tokens rlkit sampled")
    logprobs = [lp for segment in builder.segments if isinstance(segment, SampledSegment) for lp in segment.logprobs]
    theirs = [lp for lp, m in zip(branch.get("logprobs") or [], sampled, strict=False) if m]
    if theirs != logprobs:
        raise TrajectoryMismatch("the verifiers trace's log-probs differ from the ones the server returned")
    return len(logprobs)
