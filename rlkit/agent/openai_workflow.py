"""`rollout.agent.workflow: openai`: the user's agent program, unmodified, as an episode workflow.

Each episode runs the program once (rollout.agent.openai): a Python function `agent(base_url, row)` (sync: in a daemon
thread of its own; async: on the rollout's loop) or a command line (with OPENAI_BASE_URL and OPENAI_API_KEY set to the
episode's, the row as JSON on stdin and in RLKIT_EPISODE_ROW). Its chat calls go to the agent endpoint
(rlkit.agent.openai_endpoint) under a key that belongs to this episode only, and become the episode's token-exact
trajectory. Its reward is what the function returns (the command's last line of output: a number), or, for None
(`null`), reward.fn's score of the last reply.

An episode that cannot be trained on is dropped, never padded or guessed: the program raised (a non-zero exit), ran
past `timeout` (its key is revoked, a command's process group killed; a thread cannot be killed and ends at its next
call, which is refused), returned something that is not a number, or made no model call. A group needs all its
samples, so the whole group is dropped, counted in `rollout/dropped_episodes`, and another prompt takes its place
(rlkit.rollout.groups). A failure on rlkit's side (the servers) is the step's error, as in every rollout.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import math
import os
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rlkit import untrusted_json
from rlkit.agent.context import EpisodeContext
from rlkit.agent.episode import Episode, EpisodeDropped, cannot_start
from rlkit.agent.openai_endpoint import EndpointPerLoop
from rlkit.errors import ConfigError, FatalStepError, StepError
from rlkit.import_path import import_callable

AGENT_FORM = "module.path:function or /abs/path/file.py:function, called as agent(base_url, row) -> reward or None"
OUTPUT_CAP = 1 << 20  # bytes of a command's stdout and of its stderr kept; the rest is read and thrown away


@dataclass(frozen=True)
class AgentProgram:
    """What runs once per episode: a function or a command, and how long it may take."""

    function: Callable[..., Any] | None
    command: tuple[str, ...]
    timeout: float


def resolve_program(settings: Any, *, setting: str = "rollout.agent.openai") -> AgentProgram:
    """rollout.agent.openai as a program; ConfigError (with the fix) when it names none, both, or no function."""
    agent, command = settings.agent.strip(), [str(part) for part in settings.command]
    if bool(agent) == bool(command):
        raise ConfigError(f"{setting}: give the agent program as exactly one of agent (a function) and command "
                          f"(a command line){'; both are set' if agent else ''}",
                          hint=f"set {setting}.agent={AGENT_FORM.split(',')[0]}, or {setting}.command=[prog, args]")
    function = None
    if agent:
        function = import_callable(agent, setting=f"{setting}.agent", form=AGENT_FORM, files=True)
        if not callable(function):
            raise ConfigError(f"{setting}.agent '{agent}' is not a function", hint=f"name {AGENT_FORM}")
    return AgentProgram(function, tuple(command), float(settings.timeout))


class OpenAIAgentWorkflow(EndpointPerLoop):
    """The episode workflow of `openai` (an `async def episode(ctx, row)` like any other; see the module)."""

    def __init__(self, program: AgentProgram) -> None:
        super().__init__()
        self.program = program

    async def __call__(self, ctx: EpisodeContext, row: dict[str, Any]) -> Episode:
        endpoint = await self.endpoint()
        session = endpoint.open(ctx)
        try:
            outcome = await self._run(endpoint.base_url(session), session.key, row)
        except EpisodeDropped:
            if session.failure is None:
                raise
            outcome = None  # the program failed because rlkit did: that is the error below, not the program's
        finally:
            endpoint.close(session)
        async with session.lock:  # a call the program left in flight ends before the trajectory is read
            pass
        if session.failure is not None:
            raise StepError(f"an agent episode's turn could not be sampled: {type(session.failure).__name__}: "
                            f"{session.failure}") from session.failure
        if not session.segments or ctx.builder.turns == 0:
            raise EpisodeDropped("the agent program made no model call (chat completions or responses) that was "
                                 "answered"
                                 + (f" ({session.refused} refused)" if session.refused else ""))
        reward = await ctx.reward() if outcome is None else outcome
        return ctx.finish(reward, openai_calls=float(session.calls), openai_segments=float(session.segments),
                          openai_refused=float(session.refused))

    async def _run(self, base_url: str, key: str, row: dict[str, Any]) -> float | None:
        program = self.program
        if program.function is None:
            return await self._run_command(base_url, key, row)
        try:
            if inspect.iscoroutinefunction(program.function):
                result = await asyncio.wait_for(program.function(base_url, row), program.timeout)
            else:
                result = await asyncio.wait_for(_in_daemon_thread(program.function, base_url, row), program.timeout)
        except TimeoutError:
            raise EpisodeDropped(f"the agent program ran past rollout.agent.openai.timeout "
                                 f"({program.timeout:g} s)") from None
        except Exception as exc:
            raise EpisodeDropped(f"the agent program raised {type(exc).__name__}: {exc}") from exc
        return _reward_of(result, "returned")

    async def _run_command(self, base_url: str, key: str, row: dict[str, Any]) -> float | None:
        program = self.program
        row_json = json.dumps(row)
        env = {**os.environ, "OPENAI_BASE_URL": base_url, "OPENAI_API_KEY": key, "RLKIT_EPISODE_ROW": row_json}
        try:
            proc = await asyncio.create_subprocess_exec(
                *program.command, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE, env=env, start_new_session=True)
        except OSError as exc:
            why = f"the agent command {program.command[0]!r} could not start: {exc}"
            if cannot_start(exc):
                raise FatalStepError(f"{why}; fix: rollout.agent.openai.command must start with a program this "
                                     "user may run on the trainer's node") from exc
            raise EpisodeDropped(why) from exc
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        try:
            async def feed() -> None:
                try:
                    proc.stdin.write(row_json.encode() + b"\n")  # type: ignore[union-attr]
                    await proc.stdin.drain()  # type: ignore[union-attr]
                    proc.stdin.close()  # type: ignore[union-attr]
                except (BrokenPipeError, ConnectionResetError):
                    pass  # a program that does not read its row

            _, out, err, code = await asyncio.wait_for(asyncio.gather(
                feed(), _read_capped(proc.stdout), _read_capped(proc.stderr), proc.wait()), program.timeout)
        except TimeoutError:
            raise EpisodeDropped(f"the agent command ran past rollout.agent.openai.timeout ({program.timeout:g} s); "
                                 "its process group was killed") from None
        finally:
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                await proc.wait()
        if code != 0:
            tail = err.decode(errors="replace").strip().splitlines()[-3:]
            said = f": {' | '.join(tail)}" if tail else ""
            raise EpisodeDropped(f"the agent command exited with code {code}{said}")
        lines = [line for line in out.decode(errors="replace").splitlines() if line.strip()]
        if not lines:
            return None
        try:
            value = untrusted_json.loads(lines[-1])  # "[[[[..." is not a reward, not a RecursionError
        except ValueError:
            raise EpisodeDropped(f"the agent command's last line {lines[-1][:80]!r} is not its reward (a number, or "
                                 "null for reward.fn)") from None
        return _reward_of(value, "printed")


def _in_daemon_thread(fn: Callable[..., Any], *args: Any) -> asyncio.Future[Any]:
    """`fn(*args)` in a thread of its own, its outcome as a future of the running loop. A daemon thread, not a pool's:
    a program stuck past its timeout cannot be killed, and a pool's threads are joined at exit (the trainer would
    hang there); a daemon thread ends with the process, or at the program's next call, which is refused."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()

    def settle(result: Any, error: BaseException | None) -> None:
        if future.done():  # the episode timed out and stopped waiting
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)

    def run() -> None:
        try:
            outcome: tuple[Any, BaseException | None] = (fn(*args), None)
        except BaseException as exc:  # handed to the episode, which drops itself
            outcome = (None, exc)
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile (the trainer is stopping)
            loop.call_soon_threadsafe(settle, *outcome)

    threading.Thread(target=run, name="rlkit-agent", daemon=True).start()
    return future


async def _read_capped(stream: asyncio.StreamReader) -> bytes:
    """Everything the stream gives, the first OUTPUT_CAP bytes kept (reading on, so the program never blocks)."""
    kept = bytearray()
    while chunk := await stream.read(65536):
        kept += chunk[:max(0, OUTPUT_CAP - len(kept))]
    return bytes(kept)


def _reward_of(value: Any, verb: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(float(value)):
        raise EpisodeDropped(f"the agent program {verb} {str(value)[:80]!r}, not its reward (a finite number, or None "
                             "to score the last reply with reward.fn)")
    return float(value)
