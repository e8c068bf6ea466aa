"""A sampled turn's `response` answered as the Responses API streams it (pure: no HTTP, no tokenizer).

As on the chat route (rlkit.agent.openai_stream), the whole turn is sampled first and its unstreamed answer built
(rlkit.agent.openai_responses.response_body); a call with `stream: true` then gets that answer as the events the
official client parses (`client.responses.create(stream=True)`, `client.responses.stream()`, the Agents SDK's
`Runner.run_streamed`), each with its `type` and a growing `sequence_number`: `response.created` and
`response.in_progress` (the response in progress, no output yet); per output item `response.output_item.added`, then
for a message `response.content_part.added`, `response.output_text.delta` (pieces), `response.output_text.done`,
`response.content_part.done`, and for a function call `response.function_call_arguments.delta` (pieces) and
`.done`; then `response.output_item.done` with the whole item; last `response.completed` (or `response.incomplete`,
the turn cut by its token limit) with the whole response. The accumulator `client.responses.stream()` runs rebuilds
from the added items and deltas the output the last event carries.

A failure once the stream started (the 200 is sent) ends it with `response.failed` (the response, status failed, the
items finished so far, the error) and then an `error` event. The official client raises on neither as documented (an
`error` event's fields are flat): the live API nests them under `error` too, which the client raises as an APIError,
so the `error` event here carries both shapes.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from rlkit.agent.openai_stream import pieces


class ResponseEvents:
    """The events of one `response` body (`events()`), numbered as they are sent, and the events that end the stream
    when sending them fails (`failed`)."""

    def __init__(self, response: Mapping[str, Any]) -> None:
        self.response = dict(response)
        self.sent = 0  # the next event's sequence_number
        self.done: list[dict[str, Any]] = []  # the output items sent whole (what response.failed carries)

    def _event(self, kind: str, **fields: Any) -> dict[str, Any]:
        return {"type": kind, "sequence_number": self.sent, **fields}

    def events(self) -> Iterator[dict[str, Any]]:
        pending = {**self.response, "status": "in_progress", "output": [], "completed_at": None,
                   "incomplete_details": None, "usage": None}
        for kind in ("response.created", "response.in_progress"):
            yield self._event(kind, response=pending)
            self.sent += 1
        for index, item in enumerate(self.response["output"]):
            for data in _item_events(index, item):
                yield self._event(data.pop("type"), **data)
                self.sent += 1
            self.done.append(item)
        kind = "response.incomplete" if self.response["status"] == "incomplete" else "response.completed"
        yield self._event(kind, response=self.response)
        self.sent += 1

    def failed(self, message: str) -> list[dict[str, Any]]:
        """`response.failed` and the `error` event, numbered after the last event sent."""
        error = {"code": "server_error", "message": message}
        failed = {**self.response, "status": "failed", "output": list(self.done), "completed_at": None,
                  "incomplete_details": None, "error": error}
        events = [self._event("response.failed", response=failed)]
        self.sent += 1
        events.append(self._event("error", code="server_error", message=message, param=None,
                                  error={"type": "server_error", "param": None, **error}))
        self.sent += 1
        return events


def _item_events(index: int, item: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """One output item's events, unnumbered: added (in progress, empty), its content in pieces, done (whole)."""
    at = {"item_id": item["id"], "output_index": index}
    if item["type"] == "message":
        yield {"type": "response.output_item.added", "output_index": index,
               "item": {**item, "status": "in_progress", "content": []}}
        for part_index, part in enumerate(item["content"]):
            where = {**at, "content_index": part_index}
            yield {"type": "response.content_part.added", **where, "part": {**part, "text": ""}}
            for piece in pieces(part["text"]):
                yield {"type": "response.output_text.delta", **where, "delta": piece, "logprobs": []}
            yield {"type": "response.output_text.done", **where, "text": part["text"], "logprobs": []}
            yield {"type": "response.content_part.done", **where, "part": part}
    elif item["type"] == "function_call":
        yield {"type": "response.output_item.added", "output_index": index,
               "item": {**item, "status": "in_progress", "arguments": ""}}
        for piece in pieces(item["arguments"]):
            yield {"type": "response.function_call_arguments.delta", **at, "delta": piece}
        yield {"type": "response.function_call_arguments.done", **at, "arguments": item["arguments"]}
    else:  # response_body writes only these two
        raise ValueError(f"no stream events for output items of type {item['type']!r}")
    yield {"type": "response.output_item.done", "output_index": index, "item": dict(item)}
