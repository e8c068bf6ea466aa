"""Streamed chat calls on the agent endpoint (rlkit.agent.openai_stream): the official `openai` client, sync and async,
against the real uvicorn endpoint with the tiny tokenizer and a scripted server. A streamed call is the same turn of
the same token-exact trajectory as an unstreamed one, and the client's own parsers (its chunk models, the
accumulator `client.chat.completions.stream()` runs) rebuild the same message from the chunks; a failure once the
stream started is raised by the client and fails the step as an unstreamed one does."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest
from openai import APIError, AsyncOpenAI, InternalServerError, OpenAI

from rlkit.agent import openai_endpoint
from rlkit.agent.context import EpisodeContext, EpisodeServices
from rlkit.agent.episode import Episode
from rlkit.agent.openai_workflow import AgentProgram, OpenAIAgentWorkflow
from rlkit.agent.tool_calls import ParsedTurn, ToolCall
from rlkit.agent.tools import ToolRegistry
from rlkit.agent.trajectory import SampledSegment, TrajectoryLimits
from rlkit.errors import StepError
from rlkit.rewards.runner import RewardOutcome
from rlkit.servers.backend import Completion, SamplingParams
from tests.helpers.scripted_server import ScriptedServer

PRESS: Any = {"type": "function", "function": {"name": "press", "description": "Press a button.",
                                          "parameters": {"type": "object", "properties": {}}}}
# turn 1: content past one delta's 64 characters and two calls with long arguments; turn 2: text only
TEXTS = ["please press the button marked 7 and then the one marked 8 so that the door opens wide", "done now"]


def _calls(text: str) -> ParsedTurn:
    """Each digit is a call to `press`, its arguments long enough to be sent in pieces."""
    turn = ParsedTurn(content="".join(c for c in text if not c.isdigit()))
    for i, c in enumerate(c for c in text if c.isdigit()):
        turn.calls.append(ToolCall("press", {"button": int(c), "why": f"the door needs button {c} " * 4}, i))
    return turn


def _context(tok: Any, server: ScriptedServer) -> EpisodeContext:
    async def score(prompt: str, answer: str, row: dict[str, Any]) -> RewardOutcome:
        return RewardOutcome(0.0)

    services = EpisodeServices(score=score, tokenizer=tok, tools=ToolRegistry([]), parser=_calls,
                               params=SamplingParams(max_new_tokens=64), limits=TrajectoryLimits(3, 1000, 64))
    return EpisodeContext(services, complete=server.complete, settled_version=server.settled,
                          row={"prompt": "open the door"}, prompt_ids=tok.encode("x", add_special_tokens=False),
                          prompt_text="", seed=3)


def _reply(mode: str, client: Any, messages: list[Any], chunks: list[Any]) -> tuple[str, Any]:
    """(the completion's id, the assistant message) of one call made as `mode` says, with a sync client."""
    if mode == "plain":
        completion = client.chat.completions.create(model="m", messages=messages, tools=[PRESS])
        return completion.id, completion.choices[0].message
    with client.chat.completions.stream(model="m", messages=messages, tools=[PRESS]) as stream:
        for event in stream:
            if event.type == "chunk":
                chunks.append(event.chunk)
        final = stream.get_final_completion()
    return final.id, final.choices[0].message


def _accumulated(chunks: list[Any]) -> tuple[str, dict[str, Any]]:
    """What a program that streams with create(stream=True) builds from the chunks: content and tool calls joined."""
    message: dict[str, Any] = {"role": None, "content": None, "tool_calls": {}}
    for chunk in chunks:
        for choice in chunk.choices:
            delta = choice.delta
            message["role"] = message["role"] or delta.role
            if delta.content is not None:
                message["content"] = (message["content"] or "") + delta.content
            for part in delta.tool_calls or []:
                call = message["tool_calls"].setdefault(part.index, {"id": "", "type": "", "function": {
                    "name": "", "arguments": ""}})
                call["id"] += part.id or ""
                call["type"] = part.type or call["type"]
                if part.function is not None:
                    call["function"]["name"] += part.function.name or ""
                    call["function"]["arguments"] += part.function.arguments or ""
    message["tool_calls"] = [message["tool_calls"][i] for i in sorted(message["tool_calls"])] or None
    return chunks[0].id, message


def _agent(mode: str, seen: list[tuple[str, Any]], chunks: list[Any]) -> Any:
    """A two-turn tool-calling program; `seen`: each reply's (id, message as it sends it back)."""

    def tool_results(call_id: str, message: dict[str, Any], messages: list[Any]) -> None:
        seen.append((call_id, message))
        messages.append({k: v for k, v in message.items() if v is not None})
        for call in message.get("tool_calls") or []:
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": "pressed"})

    if mode == "async":
        async def agent_async(base_url: str, row: dict[str, Any]) -> float:
            client = AsyncOpenAI(base_url=base_url, api_key="k", max_retries=0)
            messages: list[Any] = [{"role": "user", "content": row["prompt"]}]
            for _ in range(2):
                turn = [c async for c in await client.chat.completions.create(
                    model="m", messages=messages, tools=[PRESS], stream=True)]
                chunks.extend(turn)
                tool_results(*_accumulated(turn), messages)
            await client.close()
            return 1.0
        return agent_async

    def agent(base_url: str, row: dict[str, Any]) -> float:
        client = OpenAI(base_url=base_url, api_key="k", max_retries=0)
        messages: list[Any] = [{"role": "user", "content": row["prompt"]}]
        for _ in range(2):
            if mode == "create":
                turn = list(client.chat.completions.create(model="m", messages=messages, tools=[PRESS],
                                                           stream=True))
                chunks.extend(turn)
                call_id, message = _accumulated(turn)
            else:
                call_id, reply = _reply(mode, client, messages, chunks)
                message = {"role": reply.role, "content": reply.content, "tool_calls": [
                    {"id": c.id, "type": c.type, "function": {"name": c.function.name,
                                                              "arguments": c.function.arguments}}
                    for c in reply.tool_calls] if reply.tool_calls else None}
            tool_results(call_id, message, messages)
        client.close()
        return 1.0

    return agent


def _episode(tok: Any, mode: str) -> tuple[Episode, ScriptedServer, list[tuple[str, Any]], list[Any]]:
    server = ScriptedServer(tok, list(TEXTS))
    ctx = _context(tok, server)
    seen: list[tuple[str, Any]] = []
    chunks: list[Any] = []
    workflow = OpenAIAgentWorkflow(AgentProgram(_agent(mode, seen, chunks), (), 30.0))
    return asyncio.run(workflow(ctx, ctx.row)), server, seen, chunks


@pytest.mark.parametrize("mode", ["create", "async", "stream_helper"])
def test_a_streamed_episode_is_the_unstreamed_trajectory_and_messages(tok: Any, mode: str) -> None:
    plain, plain_server, plain_seen, _ = _episode(tok, "plain")
    streamed, server, seen, chunks = _episode(tok, mode)
    assert plain_seen[0][1]["tool_calls"] and len(plain_seen[0][1]["tool_calls"]) == 2, "turn 1 called two tools"
    assert len(plain_seen[0][1]["content"]) > 64 and len(plain_seen[0][1]["tool_calls"][0]["function"]
                                                         ["arguments"]) > 64, "both are sent in several deltas"
    a, b = plain.trajectory, streamed.trajectory
    assert (list(b.prompt_ids), list(b.token_ids), list(b.loss_mask)) == \
        (list(a.prompt_ids), list(a.token_ids), list(a.loss_mask))
    assert [ids for ids, _ in server.requests] == [ids for ids, _ in plain_server.requests]
    assert b.turns == 2 and streamed.info["openai_segments"] == 1 and streamed.info["openai_refused"] == 0

    def same_ids(pairs: list[tuple[str, Any]]) -> list[str]:  # tool-call ids hold the call's id (the episode's key)
        return [json.dumps(message).replace(call_id, "ID") for call_id, message in pairs]

    assert same_ids(seen) == same_ids(plain_seen)
    assert all(c.object == "chat.completion.chunk" and c.id in (seen[0][0], seen[1][0]) for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant" and chunks[0].choices[0].finish_reason is None
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices[0].finish_reason]
    assert finishes == ["tool_calls", "stop"] and all(c.usage is None for c in chunks)


def _raw_stream(tok: Any, bodies: list[dict[str, Any]]) -> tuple[list[Any], ScriptedServer, Episode]:
    """Each call's (status, content type, events) for raw bodies sent in turn, each after the last reply."""
    server = ScriptedServer(tok, list(TEXTS))
    ctx = _context(tok, server)
    out: list[Any] = []

    async def agent(base_url: str, row: dict[str, Any]) -> float:
        messages: list[Any] = [{"role": "user", "content": row["prompt"]}]
        async with httpx.AsyncClient(timeout=30) as client:
            for body in bodies:
                reply = await client.post(f"{base_url}/chat/completions", json={"messages": messages, **body})
                lines = reply.text.split("\n\n")
                out.append((reply.status_code, reply.headers["content-type"], lines))
                if reply.status_code != 200:
                    continue
                events = [json.loads(line.removeprefix("data: ")) for line in lines[:-2]]
                text = "".join(e["choices"][0]["delta"].get("content") or "" for e in events if e["choices"])
                messages += [{"role": "assistant", "content": text}, {"role": "user", "content": "go on"}]
        return 1.0

    workflow = OpenAIAgentWorkflow(AgentProgram(agent, (), 30.0))
    return out, server, asyncio.run(workflow(ctx, ctx.row))


def test_include_usage_adds_openais_usage_chunk_with_the_turns_counts(tok: Any) -> None:
    usage = {"stream": True, "stream_options": {"include_usage": True}}
    out, server, episode = _raw_stream(tok, [usage, usage])
    sampled = [s for s in episode.trajectory.segments if isinstance(s, SampledSegment)]
    for (status, kind, lines), (prompt, _), turn in zip(out, server.requests, sampled, strict=True):
        assert status == 200 and kind.startswith("text/event-stream")
        assert lines[-2:] == ["data: [DONE]", ""] and all(line.startswith("data: {") for line in lines[:-2])
        events = [json.loads(line.removeprefix("data: ")) for line in lines[:-2]]
        assert all(e["usage"] is None and len(e["choices"]) == 1 for e in events[:-1])
        last = events[-1]
        assert last["choices"] == [] and last["object"] == "chat.completion.chunk"
        assert last["usage"] == {"prompt_tokens": len(prompt), "completion_tokens": len(turn.token_ids),
                                 "total_tokens": len(prompt) + len(turn.token_ids)}
    # without include_usage no chunk has the field (OpenAI's shape); stream_options needs stream, as OpenAI's does
    out, _, _ = _raw_stream(tok, [{"stream": True}, {"stream_options": {"include_usage": True}},
                                  {"stream": "yes"}, {"stream": True, "stream_options": {"include_usage": 1}}])
    assert all("usage" not in json.loads(line.removeprefix("data: ")) for line in out[0][2][:-2])
    assert [(status, json.loads(lines[0])["error"]["param"]) for status, _, lines in out[1:]] == \
        [(400, "stream_options"), (400, "stream"), (400, "stream_options.include_usage")]


@pytest.mark.parametrize("where", ["before", "mid"])
def test_a_failure_on_rlkits_side_of_a_streamed_call_is_raised_and_is_the_steps_error(
        tok: Any, where: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before the stream: the JSON 500 of an unstreamed call. Once it started (the status is sent): an error event
    the client raises; the failure is recorded on the session either way, so the step fails, not the episode."""

    class Down(ScriptedServer):
        async def complete(self, ids: list[int], params: SamplingParams) -> tuple[int, Completion]:
            raise StepError("every server failed the request after 2 retries")

    if where == "mid":
        real = openai_endpoint.completion_chunks

        def breaks(body: Any, *, include_usage: bool) -> Any:
            yield next(real(body, include_usage=include_usage))
            raise RuntimeError("a chunk could not be built")

        monkeypatch.setattr(openai_endpoint, "completion_chunks", breaks)
    server = Down(tok, []) if where == "before" else ScriptedServer(tok, list(TEXTS))
    got: list[Any] = []

    def agent(base_url: str, row: dict[str, Any]) -> float:
        client = OpenAI(base_url=base_url, api_key="k", max_retries=0)
        try:
            for chunk in client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}],
                                                        stream=True):
                got.append(chunk)
        except APIError as exc:
            got.append(exc)
            raise
        return 1.0

    ctx = _context(tok, server)
    says = "every server failed" if where == "before" else "RuntimeError: a chunk could not be built"
    with pytest.raises(StepError, match=f"could not be sampled: .*{says}"):
        asyncio.run(OpenAIAgentWorkflow(AgentProgram(agent, (), 30.0))(ctx, ctx.row))
    error = got[-1]
    if where == "before":
        assert isinstance(error, InternalServerError) and got == [error]
    else:
        assert len(got) == 2 and got[0].choices[0].delta.role == "assistant", "the stream had started"
        assert type(error) is APIError and "rlkit could not stream this turn: RuntimeError" in error.message
