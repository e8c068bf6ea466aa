"""What an episode workflow is given: `ctx`, one episode's handle on the servers, the tools and the reward.

A workflow is `async def episode(ctx, row) -> Episode` (rollout.agent.workflow). It asks for turns with
`await ctx.generate()`, which samples the next assistant turn from the live servers as the single-turn rollout does
(least-busy server, retries, no request while new weights are being pushed, the turn tagged with the weight version
it was sampled at). Everything the workflow adds between turns (tool results, a user turn) goes in with
`ctx.insert_messages` / `ctx.run_tool_calls`, as the chat template writes it, tokenized once by rlkit and masked
out of the loss (rlkit.agent.trajectory says why the conversation is never tokenized again). `ctx.finish(reward)`
returns the Episode.

Sampling settings that the trainer's log-probs depend on (temperature, top_p, top_k) are gconfig's and cannot be
changed per turn: the importance ratio between the trainer's and the server's log-probs only means something when
both are of the same distribution. A turn may set its own `stop` strings and ask for fewer tokens. (The evaluator's
episodes are sampled at eval_gconfig's settings instead: nothing trains on them; rlkit.trainer.evaluator.)
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rlkit.agent.chat import closing_token_text, turn_glue
from rlkit.agent.episode import Episode, ToolTally
from rlkit.agent.tool_calls import ParsedTurn, ToolCallParser, problem_message, tool_message
from rlkit.agent.tools import ToolRegistry, ToolResult
from rlkit.agent.trajectory import TrajectoryBuilder, TrajectoryLimits
from rlkit.errors import StepError
from rlkit.rewards.runner import RewardOutcome
from rlkit.servers.backend import Completion, SamplingParams

# (request ids, params) -> (server index, completion); the rollout's server pool behind it
Complete = Callable[[list[int], SamplingParams], Awaitable[tuple[int, Completion]]]
SettledVersion = Callable[[], Awaitable[int]]  # waits while weights are pushed, then the version the servers hold
Score = Callable[[str, str, dict[str, Any]], Awaitable[RewardOutcome]]  # (prompt, answer, row): reward.fn's score
TURN_SETTINGS = ("stop", "max_new_tokens")  # what a turn may set; the rest is gconfig's


@dataclass(frozen=True)
class Turn:
    """One sampled assistant turn: its text (special tokens skipped), ids, why it ended, and its tool calls."""

    text: str
    token_ids: tuple[int, ...]
    finish_reason: str
    parsed: ParsedTurn
    server: int
    version: int

    @property
    def wants_tools(self) -> bool:
        return self.parsed.wants_tools


@dataclass(frozen=True)
class EpisodeServices:
    """What every episode of a run shares: the tokenizer, the tools, the parser, the reward, the limits."""

    score: Score
    tokenizer: Any
    tools: ToolRegistry
    parser: ToolCallParser
    params: SamplingParams  # gconfig's (n is ignored: one turn per request)
    limits: TrajectoryLimits
    vocab_size: int | None = None


class EpisodeContext:
    """One episode in progress; see the module docstring."""

    def __init__(self, services: EpisodeServices, *, complete: Complete, settled_version: SettledVersion,
                 row: dict[str, Any], prompt_ids: Sequence[int], prompt_text: str, seed: int) -> None:
        self.services = services
        self._complete, self._settled_version = complete, settled_version
        self.row = row
        self.tokenizer = services.tokenizer
        self.restart(prompt_ids, prompt_text)
        self.tally = ToolTally()
        self.reward_errors = 0
        self.reward_timeouts = 0
        self._seed = seed
        self._sampled = 0  # turns sampled in this episode, over every restart (each turn's own seed)
        self._started = time.monotonic()

    @property
    def last_turn(self) -> Turn | None:
        return self.turns[-1] if self.turns else None

    def restart(self, prompt_ids: Sequence[int], prompt_text: str) -> None:
        """Begin the trajectory from `prompt_ids`: at the start, and again from another prompt (the OpenAI endpoint's
        first call, or a call that rewrote earlier turns), the turns so far then left out of the episode; tool counts
        stay."""
        self.builder = TrajectoryBuilder(prompt_ids, self.services.limits, self.tokenizer,
                                         vocab_size=self.services.vocab_size)
        self.prompt_text = prompt_text
        self.turns: list[Turn] = []

    async def generate(self, **settings: Any) -> Turn | None:
        """Sample the next assistant turn; None when a limit ends the episode (it is then flagged truncated)."""
        unknown = sorted(set(settings) - set(TURN_SETTINGS))
        if unknown:
            raise StepError(f"ctx.generate({', '.join(unknown)}=...): a turn may set only {', '.join(TURN_SETTINGS)}; "
                            "temperature, top_p and top_k are gconfig's (the trainer's log-probs are taken at them)")
        request = self.builder.start_turn()
        if request is None:
            return None
        wanted = settings.get("max_new_tokens", request.max_new_tokens)
        if isinstance(wanted, bool) or not isinstance(wanted, int) or wanted < 1:
            raise StepError(f"ctx.generate(max_new_tokens={wanted!r}): give a positive integer (at most "
                            f"{request.max_new_tokens} fit in this turn)")
        stop = settings.get("stop", self.services.params.stop)
        stop = [stop] if isinstance(stop, str) else stop
        if not isinstance(stop, list | tuple) or not all(isinstance(s, str) and s for s in stop):
            raise StepError(f"ctx.generate(stop={stop!r}): give a string or a list of non-empty strings")
        params = dataclasses.replace(
            self.services.params, n=1, max_new_tokens=min(wanted, request.max_new_tokens), stop=list(stop),
            seed=(self._seed * 1_000_003 + self._sampled) % 2**31)  # resumed runs sample the same turns
        version = await self._settled_version()
        server, completion = await self._complete(list(request.request_ids), params)
        self.builder.add_sampled(request, completion.token_ids, completion.logprobs, version=version,
                                 finish_reason=completion.finish_reason)
        self._sampled += 1
        text = self.tokenizer.decode(completion.token_ids, skip_special_tokens=True)
        try:
            parsed = self.services.parser(text)
        except Exception as exc:
            raise StepError(f"the tool-call parser (rollout.agent.tool_call_parser) raised {type(exc).__name__}: "
                            f"{exc} on a turn's text; a parser returns a ParsedTurn with problems, never raises") \
                from exc
        turn = Turn(text, tuple(completion.token_ids), completion.finish_reason, parsed, server, version)
        self.turns.append(turn)
        return turn

    def insert_messages(self, messages: Sequence[Mapping[str, Any]]) -> bool:
        """Append `messages` (role tool or user) after the last turn and open the next assistant turn, as the chat
        template writes them; False (episode truncated) when they do not fit in rollout.agent.engine_max_tokens."""
        last = self.last_turn
        closed = closing_token_text(self.tokenizer, last.token_ids) if last is not None else ""
        return self.builder.add_inserted(turn_glue(self.tokenizer, messages, turn_closed_with=closed))

    async def call_tool(self, name: str, arguments: Mapping[str, Any]) -> ToolResult:
        """Run one tool (errors come back as the result's text, never raised) and count it for the metrics."""
        result = await self.services.tools.call(name, arguments)
        self.tally.add_results([result])
        return result

    async def run_tool_calls(self, turn: Turn) -> bool:
        """Run every call of `turn` in order and insert their results (and a message for each call that could not
        be read); False when there was nothing to run or the results no longer fit."""
        if not turn.wants_tools:
            return False
        messages = [tool_message(call, (await self.call_tool(call.name, call.arguments)).content)
                    for call in turn.parsed.calls]
        messages += [problem_message(problem) for problem in turn.parsed.problems]
        self.tally.add_unparsed(len(turn.parsed.problems))
        return self.insert_messages(messages)

    async def reward(self, answer: str | None = None) -> float:
        """The configured reward (reward.fn) of `answer` (default: the last turn's text) for this row."""
        last = self.last_turn
        text = answer if answer is not None else (last.text if last is not None else "")
        outcome = await self.services.score(self.prompt_text, text, self.row)
        self.reward_errors += outcome.error is not None and not outcome.timed_out
        self.reward_timeouts += outcome.timed_out
        return outcome.value

    def finish(self, reward: float, **info: float) -> Episode:
        """The episode as it stands, with its reward (and numbers of the workflow's own for the metrics)."""
        seconds = time.monotonic() - self._started
        return Episode(self.builder.build(), float(reward), self.tally, {**info, "episode_seconds": seconds})
