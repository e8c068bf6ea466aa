"""OpenAI's Responses API on the agent endpoint (rlkit.agent.openai_responses): the official `openai` client's
`responses.create` against the real uvicorn endpoint, with the tiny tokenizer and a scripted server (as in
test_openai_endpoint.py). A Responses episode is the same token-exact trajectory as the chat route's for the same
conversation; the output items sent back continue it; what the trainer cannot honour is a 400 naming the parameter."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
from openai import AsyncOpenAI, BadRequestError, OpenAI
from openai.types.responses import Response

from rlkit.agent.episode import Episode
from rlkit.agent.openai_endpoint import AgentEndpoint
from rlkit.agent.openai_workflow import AgentProgram
from rlkit.agent.trajectory import SampledSegment
from tests.unit.agent.test_openai_endpoint import _context, _scripted, _workflow

PRESS = {"type": "function", "name": "press", "description": "Press the button that opens the door.",
         "parameters": {"type": "object", "properties": {}}, "strict": False}
DEEP = b"[" * 100_000 + b"]" * 100_000


def _responses_agent(dump: str, seen: list[Response]) -> Any:
    """An agent written for the Responses API: the output items go back as the next call's input, dumped the way the
    Agents SDK does (`exclude_unset`: with their ids and statuses) or with every field (`all`)."""

    def agent(base_url: str, row: dict[str, Any]) -> float:
        client = OpenAI(base_url=base_url, api_key="in-the-url")
        items: list[Any] = [{"role": "user", "content": row["prompt"]}]
        while True:
            response = client.responses.create(model="policy", instructions="Open the door.", input=items,
                                               tools=[PRESS])
            seen.append(response)
            items += [item.model_dump(exclude_unset=dump == "exclude_unset") for item in response.output]
            calls = [item for item in response.output if item.type == "function_call"]
            if not calls:
                return 1.0
            items += [{"type": "function_call_output", "call_id": call.call_id, "output": "the door is open"}
                      for call in calls]

    return agent


def _chat_agent(base_url: str, row: dict[str, Any]) -> float:
    """The same conversation through chat completions."""
    client = OpenAI(base_url=base_url, api_key="in-the-url")
    tool = {"type": "function", "function": {k: v for k, v in PRESS.items() if k != "type"}}
    messages: list[Any] = [{"role": "system", "content": "Open the door."}, {"role": "user", "content": row["prompt"]}]
    while True:
        reply = client.chat.completions.create(model="policy", messages=messages, tools=[tool]).choices[0].message
        messages.append(reply.model_dump(exclude_none=True))
        if not reply.tool_calls:
            return 1.0
        messages += [{"role": "tool", "tool_call_id": call.id, "content": "the door is open"}
                     for call in reply.tool_calls]


def _episode(tok: Any, agent: Any, texts: list[str]) -> Episode:
    ctx = _context(tok, _scripted(tok, texts))
    return asyncio.run(_workflow(agent)(ctx, ctx.row))


@pytest.mark.parametrize("dump", ["exclude_unset", "all"])
def test_a_responses_episode_is_the_chat_routes_trajectory_and_its_output_items_continue_it(tok: Any,
                                                                                           dump: str) -> None:
    seen: list[Response] = []
    texts = ["a 7", "done"]  # a digit calls `press` (the test parser): a tool call, then a plain answer
    by_responses = _episode(tok, _responses_agent(dump, seen), texts)
    by_chat = _episode(tok, _chat_agent, texts)
    r, c = by_responses.trajectory, by_chat.trajectory
    assert list(r.prompt_ids) == list(c.prompt_ids) and list(r.token_ids) == list(c.token_ids)
    assert list(r.loss_mask) == list(c.loss_mask) and r.turns == c.turns == 2
    assert [type(s) for s in r.segments] == [type(s) for s in c.segments]
    assert "Open the door." in tok.decode(list(r.prompt_ids)), "instructions: the system message"
    assert by_responses.info["openai_segments"] == 1, "the output items sent back continued the trajectory"
    assert by_responses.info["openai_calls"] == 2 and by_responses.tools.calls == 1
    first, second = seen
    assert [item.type for item in first.output] == ["message", "function_call"]
    call = first.output[1]
    assert call.type == "function_call" and call.name == "press" and call.arguments == "{}" and call.call_id
    assert first.output_text == "a 7" and second.output_text == "done" and second.status == "completed"
    assert [t.name for t in first.tools if t.type == "function"] == ["press"] and first.tool_choice == "auto"
    sampled = [s for s in r.segments if isinstance(s, SampledSegment)]
    assert second.usage is not None and second.usage.output_tokens == len(sampled[1].token_ids)
    assert second.usage.total_tokens == second.usage.input_tokens + second.usage.output_tokens == len(r.prompt_ids) \
        + len(r.token_ids)


def _chained_agent(seen: list[Response]) -> Any:
    """The same agent sending only what is new, its previous response named (previous_response_id)."""

    def agent(base_url: str, row: dict[str, Any]) -> float:
        client = OpenAI(base_url=base_url, api_key="in-the-url")
        new: list[Any] = [{"role": "user", "content": row["prompt"]}]
        previous = None
        while True:
            response = client.responses.create(model="policy", instructions="Open the door.", input=new,
                                               tools=[PRESS], **({"previous_response_id": previous} if previous
                                                                 else {}))
            seen.append(response)
            calls = [item for item in response.output if item.type == "function_call"]
            if not calls:
                return 1.0
            previous = response.id
            new = [{"type": "function_call_output", "call_id": call.call_id, "output": "the door is open"}
                   for call in calls]

    return agent


def test_a_call_naming_its_previous_response_continues_the_same_trajectory(tok: Any) -> None:
    chained: list[Response] = []
    texts = ["a 7", "done"]
    by_chain = _episode(tok, _chained_agent(chained), texts)
    by_resend = _episode(tok, _responses_agent("exclude_unset", []), texts)
    c, r = by_chain.trajectory, by_resend.trajectory
    assert list(c.prompt_ids) == list(r.prompt_ids) and list(c.token_ids) == list(r.token_ids)
    assert list(c.loss_mask) == list(r.loss_mask) and c.turns == 2
    assert by_chain.info["openai_segments"] == 1 and by_chain.info["openai_refused"] == 0
    assert chained[1].previous_response_id == chained[0].id and chained[0].previous_response_id is None
    assert "Open the door." in tok.decode(list(c.prompt_ids)), "the call's instructions, not carried over twice"


def test_the_response_store_keeps_an_episodes_last_responses_as_copies() -> None:
    from rlkit.agent.openai_protocol import OpenAIError
    from rlkit.agent.openai_responses import STORED_RESPONSES, ResponseStore, parse_responses

    store = ResponseStore()
    gconfig = {"temperature": 1.0, "top_p": 1.0, "top_k": -1}
    for i in range(STORED_RESPONSES + 1):
        call = parse_responses({"input": f"q{i}"}, gconfig)
        store.keep(f"resp_{i}", call, {"role": "assistant", "content": f"a{i}"})
    with pytest.raises(OpenAIError) as gone:
        store.conversation("resp_0")
    assert gone.value.param == "previous_response_id" and gone.value.code == "previous_response_not_found"
    kept, _ = store.conversation("resp_1")
    assert kept == [{"role": "user", "content": "q1"}, {"role": "assistant", "content": "a1"}]
    kept[1]["content"] = "changed by a later call"
    assert store.conversation("resp_1")[0][1]["content"] == "a1", "a copy: a later call cannot change it"
    later = parse_responses({"input": "next", "previous_response_id": "resp_1", "instructions": "be brief"}, gconfig,
                            store)
    assert [m["content"] for m in later.chat.messages] == ["be brief", "q1", "a1", "next"]
    assert [m["content"] for m in later.conversation] == ["q1", "a1", "next"], "no instructions carried over"


def test_an_output_item_sent_back_changed_starts_a_new_segment(tok: Any) -> None:
    def agent(base_url: str, row: dict[str, Any]) -> float:
        client = OpenAI(base_url=base_url, api_key="k")
        items: list[Any] = [{"role": "user", "content": "first"}]
        response = client.responses.create(model="m", input=items)
        edited = response.output[0].model_dump(exclude_unset=True)
        edited["content"][0]["text"] = "words the model never wrote"
        client.responses.create(model="m", input=[*items, edited, {"role": "user", "content": "and now?"}])
        return 0.5

    episode = _episode(tok, agent, ["one", "two"])
    assert episode.info["openai_segments"] == 2 and episode.trajectory.turns == 1
    assert "words the model never wrote" in tok.decode(list(episode.trajectory.prompt_ids))


REFUSED: list[tuple[dict[str, Any], str]] = [
    ({"previous_response_id": "resp_1"}, "previous_response_id"),  # not one of this episode's responses
    ({"conversation": "conv_1"}, "conversation"),
    ({"background": True}, "background"), ({"prompt": {"id": "pmpt_1"}}, "prompt"),
    ({"reasoning": {"effort": "low"}}, "reasoning"), ({"text": {"format": {"type": "json_object"}}}, "text.format"),
    ({"tools": [{"type": "web_search"}]}, "tools"), ({"tool_choice": "required"}, "tool_choice"),
    ({"temperature": 0.2}, "temperature"), ({"top_p": 0.5}, "top_p"), ({"truncation": "auto"}, "truncation"),
    ({"include": ["reasoning.encrypted_content"]}, "include"), ({"top_logprobs": 2}, "top_logprobs"),
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0]"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "input[0].content"),
    ({"input": [{"role": "user", "content": "hi"}, {"type": "function_call", "call_id": "c", "name": "f",
                                                     "arguments": "{}"}]}, "input"),
]


def test_parameters_the_trainer_cannot_honour_are_bad_requests_naming_them_and_the_rest_is_served(tok: Any) -> None:
    refused: list[tuple[str | None, str]] = []
    served: list[Response] = []

    async def agent(base_url: str, row: dict[str, Any]) -> float:
        client = AsyncOpenAI(base_url=base_url, api_key="k")
        for extra, _ in REFUSED:
            try:
                await client.responses.create(**{"model": "m", "input": "hi", **extra})
            except BadRequestError as exc:
                refused.append((exc.param, exc.message))
        served.append(await client.responses.create(
            model="any", input="hi", store=True, metadata={"a": "b"}, user="u", truncation="disabled", include=[],
            parallel_tool_calls=False, temperature=1.0, max_output_tokens=2, text={"format": {"type": "text"}}))
        return 0.5

    server = _scripted(tok, ["x 1 2 3 4"])
    ctx = _context(tok, server)
    episode = asyncio.run(_workflow(agent)(ctx, ctx.row))
    assert [param for param, _ in refused] == [param for _, param in REFUSED]
    for param, message in refused:
        assert param is not None and param.split("[")[0].split(".")[0] in message, (param, message)
    (response,) = served
    assert response.status == "incomplete" and response.incomplete_details is not None
    cut = tok.decode(tok.encode("x 1 2 3 4", add_special_tokens=False)[:2])
    assert response.incomplete_details.reason == "max_output_tokens" and response.output_text == cut
    assert response.usage is not None and response.usage.output_tokens == 2 and response.parallel_tool_calls is False
    assert response.metadata == {"a": "b"} and response.temperature == 1.0
    assert len(server.requests) == 1 and episode.info["openai_refused"] == len(REFUSED)


def test_responses_calls_without_the_episodes_key_are_refused_and_concurrent_episodes_never_mix(tok: Any) -> None:
    seen: dict[str, str] = {}

    async def run() -> tuple[list[Episode], list[int]]:
        gate = asyncio.Event()
        statuses: list[int] = []

        async def agent(base_url: str, row: dict[str, Any]) -> float:
            name = row["prompt"]
            async with httpx.AsyncClient(timeout=30) as http:
                client = AsyncOpenAI(base_url=base_url, api_key="unused", http_client=http)
                first = await client.responses.create(model="m", input=name)
                if name == "one":
                    root = base_url.split("/e/")[0]
                    for headers in ({}, {"Authorization": "Bearer nope"}):  # no key, another key
                        statuses.append((await http.post(f"{root}/v1/responses", json={"input": "x"},
                                                         headers=headers)).status_code)
                    gate.set()
                else:
                    await gate.wait()  # both episodes are live at once
                items = [{"role": "user", "content": name}, *(i.model_dump(exclude_unset=True) for i in first.output),
                         {"role": "user", "content": f"for {name}"}]
                await client.responses.create(model="m", input=items)
            seen[name] = base_url
            return 1.0

        workflow = _workflow()
        workflow.program = AgentProgram(agent, (), 30.0)
        server = _scripted(tok, ["a", "b", "c", "d"])
        ctxs = [_context(tok, server, {"prompt": name}) for name in ("one", "two")]
        episodes = await asyncio.gather(*(workflow(c, c.row) for c in ctxs))
        async with httpx.AsyncClient(timeout=30) as http:  # after its episode, a key is dead
            statuses.append((await http.post(f"{seen['one']}/responses", json={"input": "x"})).status_code)
        return list(episodes), statuses

    episodes, statuses = asyncio.run(run())
    assert statuses == [401, 401, 401]
    for name, episode in zip(("one", "two"), episodes, strict=True):
        text = tok.decode(list(episode.trajectory.prompt_ids) + list(episode.trajectory.token_ids))
        other = "two" if name == "one" else "one"
        assert f"for {name}" in text and f"for {other}" not in text and f"\n{other}" not in text, text
        assert episode.trajectory.turns == 2 and episode.info["openai_segments"] == 1


@pytest.mark.parametrize(("body", "param"), [
    (b'{"input": ' + DEEP + b"}", None), (b'{"input": []}', "input"), (b'{"input": [7]}', "input[0]"),
    (b'{"input": [{"type": "function_call", "call_id": "c", "name": "f"}]}', "input[0].arguments"),
    (b'{"input": [{"type": "reasoning", "summary": []}]}', "input[0].type"),
    (b'{"input": [{"role": "tool", "content": "x"}]}', "input[0].role"),
    (b'{"input": "x", "instructions": 5}', "instructions"), (b'{"input": "x", "max_output_tokens": 0}',
                                                             "max_output_tokens"),
    (b'{"input": "x", "tools": [{"type": "function"}]}', "tools[0].name"), (b'[1]', None),
    (b'{"input": "' + b"hello world " * 400 + b'"}', "input"),  # the session's refusal, named as this API's
], ids=["deep", "empty", "number", "no-arguments", "reasoning", "tool-role", "instructions", "max-tokens", "no-name",
        "list-body", "too-long"])
def test_malformed_responses_calls_are_the_programs_400_never_rlkits_failure(tok: Any, body: bytes,
                                                                             param: str | None) -> None:
    ctx = _context(tok, _scripted(tok, ["never"]))

    async def main() -> tuple[int, Any, BaseException | None]:
        endpoint = AgentEndpoint()
        await endpoint.start()
        session = endpoint.open(ctx)
        try:
            async with httpx.AsyncClient(timeout=30) as client:
                reply = await client.post(endpoint.base_url(session) + "/responses", content=body,
                                          headers={"content-type": "application/json"})
            return reply.status_code, reply.json(), session.failure
        finally:
            endpoint.close(session)
            await endpoint.stop()

    status, answer, failure = asyncio.run(main())
    assert (status, failure) == (400, None), answer
    assert answer["error"]["param"] == param, answer


def test_a_chain_of_responses_is_held_to_what_one_whole_resend_may_hold() -> None:
    """Each chained call adds to the conversation the endpoint keeps; past MAX_CHAIN_CHARS (what one request body may
    hold) naming it is refused, as resending it whole would be."""
    from rlkit.agent.openai_protocol import OpenAIError
    from rlkit.agent.openai_responses import MAX_CHAIN_CHARS, ResponseStore, parse_responses

    store = ResponseStore()
    gconfig = {"temperature": 1.0, "top_p": 1.0, "top_k": -1}
    chunk = "x" * (MAX_CHAIN_CHARS // 3)
    call = parse_responses({"input": chunk}, gconfig, store)
    previous = "resp_0"
    store.keep(previous, call, {"role": "assistant", "content": "a"})
    for i in range(1, 3):  # three thirds and the JSON around them: over the limit
        call = parse_responses({"input": chunk, "previous_response_id": previous}, gconfig, store)
        previous = f"resp_{i}"
        store.keep(previous, call, {"role": "assistant", "content": "a"})
    with pytest.raises(OpenAIError) as over:
        parse_responses({"input": "more", "previous_response_id": previous}, gconfig, store)
    assert over.value.status == 413 and over.value.param == "previous_response_id"
    assert parse_responses({"input": "more", "previous_response_id": "resp_1"}, gconfig, store).earlier == 4
