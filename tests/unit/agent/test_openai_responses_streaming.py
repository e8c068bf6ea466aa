"""Streamed Responses calls on the agent endpoint (rlkit.agent.openai_responses_stream): the official `openai` client,
sync and async, against the real uvicorn endpoint with the tiny tokenizer and a scripted server (what the Agents SDK's
`Runner.run_streamed` calls). A streamed call is the same turn of the same token-exact trajectory as an unstreamed
one; the client's own event models and the accumulator `client.responses.stream()` runs rebuild from the events the
output the unstreamed call returns; a turn cut by its limit ends with `response.incomplete`; a failure once the stream
started is raised by the client and fails the step."""

from __future__ import annotations

import asyncio
import json
from itertools import groupby
from typing import Any

import httpx
import pytest
from openai import APIError, AsyncOpenAI, InternalServerError, OpenAI

from rlkit.agent import openai_responses_stream
from rlkit.agent.episode import Episode
from rlkit.agent.openai_workflow import AgentProgram, OpenAIAgentWorkflow
from rlkit.errors import StepError
from rlkit.servers.backend import Completion, SamplingParams
from tests.helpers.scripted_server import ScriptedServer
from tests.unit.agent.test_openai_streaming import TEXTS, _context

PRESS: Any = {"type": "function", "name": "press", "description": "Press a button.",
              "parameters": {"type": "object", "properties": {}}, "strict": False}


def _rebuilt(events: list[Any]) -> list[dict[str, Any]]:
    """What a program that streams with create(stream=True) builds: each added item, its text or arguments joined
    from the deltas, its status from the item's done event."""
    items: dict[int, dict[str, Any]] = {}
    for e in events:
        if e.type == "response.output_item.added":
            items[e.output_index] = e.item.model_dump(exclude_unset=True)
        elif e.type == "response.content_part.added":
            items[e.output_index]["content"].append(e.part.model_dump(exclude_unset=True))
        elif e.type == "response.output_text.delta":
            items[e.output_index]["content"][e.content_index]["text"] += e.delta
        elif e.type == "response.function_call_arguments.delta":
            items[e.output_index]["arguments"] += e.delta
        elif e.type == "response.output_item.done":
            items[e.output_index]["status"] = e.item.status
    return [items[i] for i in sorted(items)]


def _turn(mode: str, client: Any, items: list[Any], events: list[Any]) -> tuple[Any, list[dict[str, Any]]]:
    """(the response, the output items as the program sends them back) of one call made as `mode` says (sync)."""
    if mode == "plain":
        response = client.responses.create(model="m", input=items, tools=[PRESS])
        return response, [item.model_dump(exclude_unset=True) for item in response.output]
    if mode == "create":
        turn = list(client.responses.create(model="m", input=items, tools=[PRESS], stream=True))
        events.extend(turn)
        return turn[-1].response, _rebuilt(turn)
    with client.responses.stream(model="m", input=items, tools=[PRESS]) as stream:
        events.extend(stream)
        final = stream.get_final_response()
    return final, [_unparsed(item, exclude_unset=True) for item in final.output]


def _unparsed(item: Any, *, exclude_unset: bool = False) -> dict[str, Any]:
    """An output item as a dict, less the `parsed` fields of the helper's ParsedResponse (its own, never sent)."""
    data = item.model_dump(exclude_unset=exclude_unset, exclude={"parsed_arguments"})
    for part in data.get("content", []):
        part.pop("parsed", None)
    return data


def _agent(mode: str, seen: list[tuple[Any, list[dict[str, Any]]]], events: list[Any]) -> Any:
    """A two-turn tool-calling program written for the Responses API; `seen`: each (response, items sent back)."""

    def next_input(response: Any, output: list[dict[str, Any]], items: list[Any]) -> None:
        seen.append((response, output))
        items += output
        items += [{"type": "function_call_output", "call_id": item["call_id"], "output": "pressed"}
                  for item in output if item["type"] == "function_call"]

    if mode == "async":
        async def agent_async(base_url: str, row: dict[str, Any]) -> float:
            client = AsyncOpenAI(base_url=base_url, api_key="k", max_retries=0)
            items: list[Any] = [{"role": "user", "content": row["prompt"]}]
            for _ in range(2):
                turn = [e async for e in await client.responses.create(model="m", input=items, tools=[PRESS],
                                                                       stream=True)]
                events.extend(turn)
                next_input(turn[-1].response, _rebuilt(turn), items)
            await client.close()
            return 1.0
        return agent_async

    def agent(base_url: str, row: dict[str, Any]) -> float:
        client = OpenAI(base_url=base_url, api_key="k", max_retries=0)
        items: list[Any] = [{"role": "user", "content": row["prompt"]}]
        for _ in range(2):
            next_input(*_turn(mode, client, items, events), items)
        client.close()
        return 1.0

    return agent


def _episode(tok: Any, mode: str) -> tuple[Episode, ScriptedServer, list[Any], list[Any]]:
    server = ScriptedServer(tok, list(TEXTS))
    ctx = _context(tok, server)
    seen: list[Any] = []
    events: list[Any] = []
    episode = asyncio.run(OpenAIAgentWorkflow(AgentProgram(_agent(mode, seen, events), (), 30.0))(ctx, ctx.row))
    return episode, server, seen, events


def _keyless(response: Any, items: list[dict[str, Any]]) -> str:
    """The items with the call's id (it holds the episode's key) written as ID."""
    return json.dumps(items, sort_keys=True).replace(response.id.removeprefix("resp_"), "ID")


MESSAGE = ["response.output_item.added", "response.content_part.added", "response.output_text.delta",
           "response.output_text.done", "response.content_part.done", "response.output_item.done"]
CALL = ["response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.done", "response.output_item.done"]


@pytest.mark.parametrize("mode", ["create", "async", "stream_helper"])
def test_a_streamed_responses_episode_is_the_unstreamed_trajectory_and_output(tok: Any, mode: str) -> None:
    plain, plain_server, plain_seen, _ = _episode(tok, "plain")
    streamed, server, seen, events = _episode(tok, mode)
    first = plain_seen[0][1]
    assert [item["type"] for item in first] == ["message", "function_call", "function_call"]
    assert len(first[0]["content"][0]["text"]) > 64 and len(first[1]["arguments"]) > 64, "sent in several deltas"
    a, b = plain.trajectory, streamed.trajectory
    assert (list(b.prompt_ids), list(b.token_ids), list(b.loss_mask)) == \
        (list(a.prompt_ids), list(a.token_ids), list(a.loss_mask))
    assert [ids for ids, _ in server.requests] == [ids for ids, _ in plain_server.requests]
    assert b.turns == 2 and streamed.info["openai_segments"] == 1 and streamed.info["openai_refused"] == 0
    # the items the events rebuild (or the helper's final response holds) are the unstreamed call's, sent back alike
    assert [_keyless(r, items) for r, items in seen] == [_keyless(r, items) for r, items in plain_seen]
    for (response, _), (plain_response, _) in zip(seen, plain_seen, strict=True):
        assert _keyless(response, [_unparsed(i) for i in response.output]) == \
            _keyless(plain_response, [_unparsed(i) for i in plain_response.output])
        assert response.status == "completed" and response.usage == plain_response.usage
    # the events, in order, numbered from 0 in each call
    turns = [list(g) for _, g in groupby(events, key=lambda e: e.type == "response.created" or None)]
    calls = [turns[i] + turns[i + 1] for i in range(0, len(turns), 2)]
    assert [[e.sequence_number for e in call] for call in calls] == [list(range(len(call))) for call in calls]
    kinds = [[k for k, _ in groupby(e.type for e in call)] for call in calls]
    assert kinds == [["response.created", "response.in_progress", *MESSAGE, *CALL, *CALL, "response.completed"],
                     ["response.created", "response.in_progress", *MESSAGE, "response.completed"]]
    assert calls[0][1].response.status == "in_progress" and calls[0][1].response.output == []
    if mode == "stream_helper":  # the accumulator's snapshots, grown from the deltas, end as the final items
        for call, (response, _) in zip(calls, seen, strict=True):
            grown = {e.output_index: e.snapshot for e in call if e.type in ("response.output_text.delta",
                                                                            "response.function_call_arguments.delta")}
            assert grown == {i: item.content[0].text if item.type == "message" else item.arguments
                             for i, item in enumerate(response.output)}


def _raw(tok: Any, bodies: list[dict[str, Any]], texts: list[str]) -> list[tuple[int, str]]:
    """Each raw call's (status, body text), each a first call of the episode."""
    server = ScriptedServer(tok, texts)
    ctx = _context(tok, server)
    out: list[tuple[int, str]] = []

    async def agent(base_url: str, row: dict[str, Any]) -> float:
        async with httpx.AsyncClient(timeout=30) as client:
            for body in bodies:
                reply = await client.post(f"{base_url}/responses", json={"input": "hi", **body})
                out.append((reply.status_code, reply.text))
        return 1.0

    asyncio.run(OpenAIAgentWorkflow(AgentProgram(agent, (), 30.0))(ctx, ctx.row))
    return out


def test_a_turn_cut_by_its_limit_ends_with_response_incomplete_in_named_events(tok: Any) -> None:
    out = _raw(tok, [{"stream": True, "max_output_tokens": 2, "stream_options": {"include_obfuscation": False}},
                     {"stream": "yes"}, {"stream_options": {"include_obfuscation": True}},
                     {"stream": True, "stream_options": {"chunk": 1}}], ["x 1 2 3 4", "b"])
    (status, text), *refused = out
    assert status == 200 and [(s, json.loads(t)["error"]["param"]) for s, t in refused] == \
        [(400, "stream"), (400, "stream_options"), (400, "stream_options")]
    frames = text.split("\n\n")
    assert frames[-1] == "", "the stream ends with its last event, no [DONE] (the Responses API sends none)"
    events = []
    for frame in frames[:-1]:  # `event: <type>` then the data, as OpenAI sends them
        name, data = frame.split("\n")
        events.append(json.loads(data.removeprefix("data: ")))
        assert name == f"event: {events[-1]['type']}"
    last = events[-1]
    assert last["type"] == "response.incomplete" and last["response"]["status"] == "incomplete"
    assert last["response"]["incomplete_details"] == {"reason": "max_output_tokens"}
    assert last["response"]["output"][0]["status"] == "incomplete" and last["response"]["usage"]["output_tokens"] == 2
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    # what the client makes of it: its event models, and its accumulator, which wants a response.completed
    client = OpenAI(base_url="http://127.0.0.1:9/v1", api_key="k",
                    http_client=httpx.Client(transport=httpx.MockTransport(
                        lambda request: httpx.Response(200, content=text.encode(),
                                                       headers={"content-type": "text/event-stream"}))))
    assert type(list(client.responses.create(model="m", input="hi", stream=True))[-1]).__name__ == \
        "ResponseIncompleteEvent"
    with client.responses.stream(model="m", input="hi") as stream, pytest.raises(RuntimeError, match="completed"):
        stream.get_final_response()


@pytest.mark.parametrize("where", ["before", "mid"])
def test_a_failure_on_rlkits_side_of_a_streamed_responses_call_is_raised_and_is_the_steps_error(
        tok: Any, where: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before the stream: the JSON 500 of an unstreamed call. Once it started: response.failed, then an error event
    the client raises; the failure is recorded on the session either way, so the step fails, not the episode."""

    class Down(ScriptedServer):
        async def complete(self, ids: list[int], params: SamplingParams) -> tuple[int, Completion]:
            raise StepError("every server failed the request after 2 retries")

    if where == "mid":
        real = openai_responses_stream._item_events

        def breaks(index: int, item: Any) -> Any:
            yield next(real(index, item))
            raise RuntimeError("an event could not be built")

        monkeypatch.setattr(openai_responses_stream, "_item_events", breaks)
    server = Down(tok, []) if where == "before" else ScriptedServer(tok, list(TEXTS))
    got: list[Any] = []

    def agent(base_url: str, row: dict[str, Any]) -> float:
        client = OpenAI(base_url=base_url, api_key="k", max_retries=0)
        try:
            for event in client.responses.create(model="m", input="hi", tools=[PRESS], stream=True):
                got.append(event)
        except APIError as exc:
            got.append(exc)
            raise
        return 1.0

    ctx = _context(tok, server)
    says = "every server failed" if where == "before" else "RuntimeError: an event could not be built"
    with pytest.raises(StepError, match=f"could not be sampled: .*{says}"):
        asyncio.run(OpenAIAgentWorkflow(AgentProgram(agent, (), 30.0))(ctx, ctx.row))
    error = got[-1]
    if where == "before":
        assert isinstance(error, InternalServerError) and got == [error]
        return
    assert [e.type for e in got[:-1]] == ["response.created", "response.in_progress", "response.output_item.added",
                                          "response.failed"], "the stream had started"
    failed = got[-2].response
    assert failed.status == "failed" and failed.error is not None and failed.error.code == "server_error"
    assert failed.output == [] and [e.sequence_number for e in got[:-1]] == [0, 1, 2, 3]
    assert type(error) is APIError and "rlkit could not stream this turn: RuntimeError" in error.message
