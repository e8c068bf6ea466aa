"""Calls an agent program gets wrong must be its error (an OpenAI-style 4xx it can read), never the rollout's: a
failure recorded on the session (`session.failure`) stops the whole training step (rlkit.agent.openai_workflow).
Before, JSON nested past Python's stack, a conversation the model's chat template refuses (Mistral's and Gemma's
templates raise on roles they do not take) and a token id outside the vocabulary were each answered 500 and
recorded as rlkit's failure, so one buggy agent call ended the step.

A real uvicorn endpoint on the test's loop with the tiny tokenizer; the server is scripted (never reached here)."""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from rlkit.agent.context import EpisodeContext, EpisodeServices
from rlkit.agent.episode import EpisodeDropped
from rlkit.agent.openai_endpoint import AgentEndpoint
from rlkit.agent.openai_workflow import AgentProgram, OpenAIAgentWorkflow
from rlkit.agent.press_door import digits_press
from rlkit.agent.tools import ToolRegistry
from rlkit.agent.trajectory import TrajectoryBuilder, TrajectoryLimits, encode_within
from rlkit.rewards.runner import RewardOutcome
from rlkit.servers.backend import SamplingParams
from tests.helpers.scripted_server import ScriptedServer

DEEP = b"[" * 100_000 + b"]" * 100_000
# a template that refuses two user turns in a row, as Mistral's and Llama 2's do
ALTERNATING = ("{% for m in messages %}{% if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}"
               "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
               "{% endif %}{{ m['role'] + ': ' + m['content'] + '\\n' }}{% endfor %}"
               "{% if add_generation_prompt %}assistant: {% endif %}")


def _context(tok: Any) -> EpisodeContext:
    async def score(prompt: str, answer: str, row: dict[str, Any]) -> RewardOutcome:
        return RewardOutcome(0.0)

    services = EpisodeServices(score=score, tokenizer=tok, tools=ToolRegistry([]), parser=digits_press,
                               params=SamplingParams(max_new_tokens=16), limits=TrajectoryLimits(3, 400, 16),
                               vocab_size=len(tok))
    server = ScriptedServer(tok, ["7"])
    return EpisodeContext(services, complete=server.complete, settled_version=server.settled, row={"prompt": "q"},
                          prompt_ids=tok.encode("x", add_special_tokens=False), prompt_text="", seed=1)


def _call(tok: Any, route: str, body: bytes) -> tuple[int, str, BaseException | None]:
    """(status, body text, the session's recorded failure) of one call to a fresh episode's `route`."""
    ctx = _context(tok)

    async def main() -> tuple[int, str, BaseException | None]:
        endpoint = AgentEndpoint()
        await endpoint.start()
        session = endpoint.open(ctx)
        base = endpoint.base_url(session)
        url = base + "/chat/completions" if route == "chat" else base.removesuffix("/v1") + "/inference/v1/generate"
        try:
            async with httpx.AsyncClient(timeout=30) as client:
                response = await client.post(url, content=body, headers={"content-type": "application/json"})
            return response.status_code, response.text, session.failure
        finally:
            endpoint.close(session)
            await endpoint.stop()

    return asyncio.run(main())


@pytest.mark.parametrize("route", ["chat", "tokens"])
def test_json_nested_past_the_stack_is_a_400(tok: Any, route: str) -> None:
    status, text, failure = _call(tok, route, b'{"messages": ' + DEEP + b"}")
    assert (status, failure) == (400, None), text
    assert "nested deeper" in text


def test_tool_call_arguments_nested_past_the_stack_are_kept_as_text(tok: Any) -> None:
    deep = "[" * 100_000 + "]" * 100_000
    body = ('{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "", "tool_calls": '
            f'[{{"function": {{"name": "f", "arguments": "{deep}"}}}}]}}, {{"role": "user", "content": "go"}}]}}')
    status, text, failure = _call(tok, "chat", body.encode())
    assert failure is None and status == 200, text


def test_a_conversation_the_chat_template_refuses_is_a_400(tok: Any) -> None:
    saved = tok.chat_template
    tok.chat_template = ALTERNATING
    try:
        status, text, failure = _call(tok, "chat", b'{"messages": [{"role": "user", "content": "a"}, '
                                                   b'{"role": "user", "content": "b"}]}')
    finally:
        tok.chat_template = saved
    assert (status, failure) == (400, None), text
    assert "the model's chat template refuses these messages: Conversation roles must alternate" in text


@pytest.mark.parametrize(("ids", "says"), [(b"[1000000]", "token_ids holds 1000000, not a token id of this model"),
                                          (b"[1180591620717411303424]", "integers from 0 below 2**31")])
def test_a_token_id_outside_the_vocabulary_is_a_400(tok: Any, ids: bytes, says: str) -> None:
    status, text, failure = _call(tok, "tokens", b'{"token_ids": ' + ids + b"}")
    assert (status, failure) == (400, None), text
    assert says in text


def test_an_agent_command_whose_last_line_is_nested_past_the_stack_is_dropped(tok: Any, tmp_path: Path) -> None:
    """The line is not a reward: the episode is dropped with that reason (a RecursionError failed the step)."""
    script = tmp_path / "agent.py"
    script.write_text("import sys\nsys.stdin.readline()\nprint('[' * 100000 + ']' * 100000)\n")
    ctx = _context(tok)
    workflow = OpenAIAgentWorkflow(AgentProgram(None, (sys.executable, str(script)), 30.0))
    with pytest.raises(EpisodeDropped, match=r"last line '\[\[\[.*is not its reward"):
        asyncio.run(workflow(ctx, ctx.row))


class _Counting:
    """The tokenizer, counting the characters it was asked to encode."""

    def __init__(self, tok: Any) -> None:
        self.tok, self.chars = tok, 0

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        self.chars += len(text)
        return list(self.tok.encode(text, add_special_tokens=add_special_tokens))


def test_a_text_far_past_the_limit_is_refused_without_tokenizing_it_whole(tok: Any) -> None:
    """16 MB of an agent's conversation took 18 s to tokenize on the rollout's event loop, which answered nothing
    else meanwhile; a prefix shows it cannot fit."""
    counting = _Counting(tok)
    huge = "hello world " * 200_000
    assert encode_within(counting, huge, 400) is None and counting.chars < 10_000
    small = "hello world " * 20
    assert encode_within(counting, small, 400) == tok.encode(small, add_special_tokens=False)
    assert encode_within(counting, small, 5) is None
    builder = TrajectoryBuilder(tok.encode("x", add_special_tokens=False), TrajectoryLimits(3, 400, 16), counting)
    counting.chars = 0
    assert builder.add_inserted(huge) is False and builder.truncated and counting.chars < 10_000


def test_a_conversation_far_past_the_limit_is_a_400_at_once(tok: Any) -> None:
    body = b'{"messages": [{"role": "user", "content": "' + b"hello world " * 1_000_000 + b'"}]}'
    started = time.monotonic()
    status, text, failure = _call(tok, "chat", body)
    assert (status, failure) == (400, None) and "the conversation is more than 399 tokens" in text, text
    assert time.monotonic() - started < 8


class _Slow:
    """The tokenizer, its encoding of a long text taking `seconds` (as a long conversation's does, the GIL released)."""

    def __init__(self, tok: Any, seconds: float) -> None:
        self.tok, self.seconds = tok, seconds

    def __getattr__(self, name: str) -> Any:
        return getattr(self.tok, name)

    def __len__(self) -> int:
        return len(self.tok)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        if len(text) > 100:
            time.sleep(self.seconds)
        return list(self.tok.encode(text, add_special_tokens=add_special_tokens))


def test_the_first_calls_tokenization_leaves_the_event_loop_free(tok: Any) -> None:
    """The first call's conversation is rendered and tokenized off the loop that serves every concurrent episode
    (and the servers' requests): a 25k-token conversation stalled that loop ~50 ms, eight at once ~600 ms."""
    ctx = _context(_Slow(tok, 0.5))
    body = b'{"messages": [{"role": "user", "content": "' + b"a long question " * 20 + b'"}]}'

    async def main() -> tuple[int, float]:
        endpoint = AgentEndpoint()
        await endpoint.start()
        session = endpoint.open(ctx)
        longest, done = 0.0, False

        async def beat() -> None:
            nonlocal longest
            last = time.monotonic()
            while not done:
                await asyncio.sleep(0.01)
                longest, last = max(longest, time.monotonic() - last), time.monotonic()

        beating = asyncio.create_task(beat())
        try:
            async with httpx.AsyncClient(timeout=30) as client:
                response = await client.post(endpoint.base_url(session) + "/chat/completions", content=body)
            return response.status_code, longest
        finally:
            done = True
            await beating
            endpoint.close(session)
            await endpoint.stop()

    status, longest = asyncio.run(main())
    assert status == 200 and ctx.builder.turns == 1
    assert longest < 0.25, f"the loop answered nothing for {longest:.2f} s while the conversation was tokenized"


def test_an_episode_that_ends_while_its_first_call_is_tokenized_samples_nothing(tok: Any) -> None:
    """The first call's conversation is tokenized in a thread; an episode closed meanwhile (its program ran past its
    timeout) gets the ended-key answer, and no turn is sampled for it."""
    ctx = _context(_Slow(tok, 0.5))
    body = b'{"messages": [{"role": "user", "content": "' + b"a long question " * 20 + b'"}]}'
    asked: list[Any] = []
    complete = ctx._complete

    async def counted(*args: Any, **kwargs: Any) -> Any:
        asked.append(args)
        return await complete(*args, **kwargs)

    ctx._complete = counted

    async def main() -> int:
        endpoint = AgentEndpoint()
        await endpoint.start()
        session = endpoint.open(ctx)
        try:
            async with httpx.AsyncClient(timeout=30) as client:
                call = asyncio.create_task(client.post(endpoint.base_url(session) + "/chat/completions",
                                                       content=body))
                await asyncio.sleep(0.2)  # the call is being tokenized
                endpoint.close(session)
                return (await call).status_code
        finally:
            await endpoint.stop()

    assert asyncio.run(main()) == 401
    assert asked == [] and ctx.builder.turns == 0
