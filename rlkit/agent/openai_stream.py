"""A sampled turn's chat.completion answered as OpenAI streams it (pure: no HTTP, no tokenizer).

The agent endpoint samples the whole turn first (one turn of the token-exact trajectory, as an unstreamed call), then
sends it as server-sent events in OpenAI's shape, because agent programs and frameworks that stream
(`create(stream=True)`, `client.chat.completions.stream()`, LangChain's `streaming=True`, the Agents SDK's
`run_streamed`) parse exactly that: `chat.completion.chunk` objects sharing the call's id, created and model; the
first carries the role (and `content` "" or, for a turn of tool calls only, null); then content deltas; then each tool
call's `index`, `id`, `type` and `function.name` with empty `arguments`, followed by its arguments in pieces; then an
empty delta with the `finish_reason`; with `stream_options.include_usage`, a last chunk with no choices and the usage
(the others carry `"usage": null`, as OpenAI's do); then `data: [DONE]`. The client's accumulator (what
`client.chat.completions.stream()` runs) rebuilds from these the message an unstreamed call returns.

A failure after the first event was sent cannot change the status (200 is gone): the stream ends with
`data: {"error": {...}}`, which the client raises as an APIError, and no [DONE].

The framing (`event`, `sse_stream`) and the pieces (`pieces`) also serve the Responses route's events
(rlkit.agent.openai_responses_stream), named by `event:` lines as that API sends them.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

PIECE_CHARS = 64  # characters of content (or of a call's arguments) per delta: a few events a turn, not one a token


def pieces(text: str) -> list[str]:
    """`text` in deltas of PIECE_CHARS characters (none for empty text)."""
    return [text[i:i + PIECE_CHARS] for i in range(0, len(text), PIECE_CHARS)]


def completion_chunks(body: Mapping[str, Any], *, include_usage: bool) -> Iterator[dict[str, Any]]:
    """The chat.completion.chunk objects of a chat.completion `body` (rlkit.agent.openai_protocol.completion_body)."""
    head = {"id": body["id"], "object": "chat.completion.chunk", "created": body["created"], "model": body["model"]}
    if include_usage:
        head["usage"] = None

    def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
        return {**head, "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}]}

    choice = body["choices"][0]
    message = choice["message"]
    content = message.get("content")
    yield chunk({"role": "assistant", "content": None if content is None else ""})
    for piece in pieces(content or ""):
        yield chunk({"content": piece})
    for index, call in enumerate(message.get("tool_calls") or []):
        function = call["function"]
        yield chunk({"tool_calls": [{"index": index, "id": call["id"], "type": call["type"],
                                     "function": {"name": function["name"], "arguments": ""}}]})
        for piece in pieces(function["arguments"]):
            yield chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
    yield chunk({}, choice["finish_reason"])
    if include_usage:
        yield {**head, "choices": [], "usage": dict(body["usage"])}


def event(data: Mapping[str, Any], *, named: bool = False) -> bytes:
    """One server-sent event carrying `data` as JSON; `named`: after an `event:` line with its `type`, as the
    Responses API sends them (chat chunks are data-only; the client reads both)."""
    head = b"event: " + str(data["type"]).encode() + b"\n" if named else b""
    return head + b"data: " + json.dumps(data, separators=(",", ":")).encode() + b"\n\n"


DONE = b"data: [DONE]\n\n"


def sse_stream(chunks: Iterable[Mapping[str, Any]], failed: Callable[[Exception], Iterable[Mapping[str, Any]]], *,
               named: bool = False, end: bytes = DONE) -> Iterator[bytes]:
    """`chunks` as events, then `end` ([DONE]; the Responses API sends nothing); if producing them fails, the events
    `failed(exc)` returns, last (the caller records the failure there: it is called before they are sent, so before
    the client can raise)."""
    try:
        for chunk in chunks:
            yield event(chunk, named=named)
    except Exception as exc:  # the status is sent: the error can only be an event
        for data in failed(exc):
            yield event(data, named=named)
        return
    if end:
        yield end
