"""`rollout.agent.workflow: verifiers`: a verifiers environment's episodes, trained token-exact.

rlkit never imports verifiers (it pins openai<3; the dev venv holds openai 3): each episode runs
rlkit/agent/verifiers_program.py under the verifiers venv's interpreter (scripts/verifiers-env.sh), which calls
`Env.run_episode` with verifiers' train client pointed at this episode's key on rlkit's agent endpoint. The client
renders its turns itself and posts token ids to the token-level route (rlkit.agent.token_route), where each turn is
sampled like every rollout turn and recorded as the episode's trajectory. The row names the task: `task`, its index
in the taskset (rollout.agent.verifiers.environment).

rlkit trains on its own recording (the server's ids, behaviour log-probs and weight versions) and checks it against
the trace verifiers returns: the trained branch's token ids must equal the trajectory's, token for token, and its
`sampled_mask` must mark exactly the tokens rlkit sampled; any difference is a TrajectoryMismatch, never trained on.
The reward is the trace's (verifiers' weighted sum of its @reward functions). An episode verifiers reports as not ok
(a harness or scoring error), a program that fails or runs past the timeout, or an episode of more than one trace
(a multi-agent env) is dropped with its reason, like an agent program's (rlkit.agent.openai_workflow).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlkit.agent.context import EpisodeContext
from rlkit.agent.episode import Episode, EpisodeDropped
from rlkit.agent.openai_endpoint import AgentEndpoint
from rlkit.agent.trajectory import SampledSegment, TrajectoryMismatch
from rlkit.errors import ConfigError, StepError

PROGRAM = Path(__file__).with_name("verifiers_program.py")
DEFAULT_PYTHON = "~/.cache/rlkit-verifiers/venv/bin/python"
TASK_FIELD = "task"  # the row's index of its task in the taskset


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


class VerifiersWorkflow:
    """The episode workflow of `verifiers` (an `async def episode(ctx, row)` like any other; see the module)."""

    def __init__(self, environment: VerifiersEnvironment) -> None:
        self.environment = environment
        self._endpoint: AgentEndpoint | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._starting: asyncio.Lock | None = None

    async def endpoint(self) -> AgentEndpoint:
        """The endpoint on the running loop, started by the first episode."""
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            self._loop, self._endpoint, self._starting = loop, None, asyncio.Lock()
        assert self._starting is not None
        async with self._starting:
            if self._endpoint is None:
                endpoint = AgentEndpoint()
                await endpoint.start()
                self._endpoint = endpoint
        return self._endpoint

    async def __call__(self, ctx: EpisodeContext, row: dict[str, Any]) -> Episode:
        task = row.get(TASK_FIELD)
        if isinstance(task, bool) or not isinstance(task, int) or task < 0:
            raise EpisodeDropped(f"the row's {TASK_FIELD!r} is {task!r}: workflow verifiers needs the task's index in "
                                 "the taskset (a non-negative integer)")
        endpoint = await self.endpoint()
        session = endpoint.open(ctx)
        try:
            result = await self._run(endpoint.base_url(session), session.key, ctx, task)
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
        check_branch(ctx, traces[0]["branches"][-1])
        return ctx.finish(float(traces[0]["reward"]), verifiers_calls=float(session.calls),
                          verifiers_segments=float(session.segments))

    async def _run(self, base_url: str, key: str, ctx: EpisodeContext, task: int) -> dict[str, Any]:
        env = self.environment
        params = ctx.services.params
        spec = {"environment": env.environment, "args": env.args, "harness": env.harness, "runtime": env.runtime,
                "task": task, "base_url": base_url, "tokenizer": str(ctx.tokenizer.name_or_path),
                "temperature": params.temperature, "max_tokens": ctx.builder.limits.max_tokens_per_turn}
        try:
            proc = await asyncio.create_subprocess_exec(
                env.python, str(PROGRAM), stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE, env=program_env(env.python, key), start_new_session=True)
        except OSError as exc:
            raise EpisodeDropped(f"the verifiers program could not start under {env.python}: {exc} (install the venv "
                                 "with scripts/verifiers-env.sh)") from exc
        try:
            out, err = await asyncio.wait_for(proc.communicate(json.dumps(spec).encode()), env.timeout)
        except TimeoutError:
            raise EpisodeDropped(f"the verifiers episode ran past rollout.agent.verifiers.timeout ({env.timeout:g} s); "
                                 "its process group was killed") from None
        finally:
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                await proc.wait()
        lines = [line for line in out.decode(errors="replace").splitlines() if line.strip()]
        if proc.returncode != 0 or not lines:
            tail = " | ".join(err.decode(errors="replace").strip().splitlines()[-3:])
            raise EpisodeDropped(f"the verifiers program exited with code {proc.returncode}: {tail}")
        try:
            result = json.loads(lines[-1])
        except ValueError:
            raise EpisodeDropped(f"the verifiers program's last line {lines[-1][:80]!r} is not its result") from None
        if not isinstance(result, dict):
            raise EpisodeDropped("the verifiers program's result is not a JSON object")
        return result


def program_env(python: str, key: str) -> dict[str, str]:
    """The program's environment: the venv's bin first on PATH (verifiers finds the venv's `uv` there instead of
    downloading one from astral.sh), the offline uv settings, and the episode's key for its train client."""
    path = f"{Path(python).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    return {**os.environ, "PATH": path, **offline_uv(python), "RLKIT_EPISODE_KEY": key}


def offline_uv(python: str) -> dict[str, str]:
    """uv settings that make verifiers' `uv sync --script` (its harness's chat program) install from the wheelhouse
    scripts/verifiers-env.sh put beside the venv, with no network: find-links there, an empty default index (uv has no
    variable for --no-index) and no Python downloads. Nothing when there is no wheelhouse."""
    wheels = Path(python).parent.parent.parent / "wheelhouse"
    if not (wheels / ".complete").is_file():
        return {}
    return {"UV_FIND_LINKS": str(wheels), "UV_DEFAULT_INDEX": (wheels / "empty-index").as_uri(),
            "UV_PYTHON_DOWNLOADS": "never"}


def check_branch(ctx: EpisodeContext, branch: dict[str, Any]) -> None:
    """The trace's trained branch is the trajectory rlkit recorded, token for token; TrajectoryMismatch if not."""
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
