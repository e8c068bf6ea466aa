"""OpenAI's Responses API (`POST /v1/responses`) as rlkit's agent endpoint speaks it: a subset, translated to and
from the chat-completions call the episode's session already serves (pure: no HTTP, no tokenizer).

The OpenAI Agents SDK calls this API by default, re-sending the whole conversation as `input` each call (it never
sends previous_response_id unless told to). A call becomes the normalized chat messages the session compares
(rlkit.agent.openai_protocol): `instructions` a system message first, message items as they are, `function_call`
items the assistant's tool calls (joined to the assistant message they follow), `function_call_output` items tool
messages. So the output items the endpoint returned, sent back as they came (with their ids and statuses), are the
conversation unchanged and the episode stays one token-exact trajectory; one turn is one `AgentSession.chat`. A call
may instead name an earlier response of its episode as `previous_response_id` and send only what is new: that
response's conversation (ResponseStore) stands before its input, as OpenAI's would.

Refused with an OpenAI-style 400 naming the parameter: what needs other state on the server (conversation,
item_reference, stored prompt templates, background), what the turn cannot honour (reasoning effort,
a text format other than text, truncation auto, include, forced tool choices, OpenAI's built-in tools) and sampling
settings other than the episode's (openai_protocol's rule). `model`, `store`, `metadata`, `user`,
`parallel_tool_calls` and cache hints are accepted and ignored, as the chat route does `seed` and `model`.
`stream: true` is the same turn, sent as the Responses API's events (rlkit.agent.openai_responses_stream).
"""

from __future__ import annotations

import copy
import json
import time
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rlkit.agent.openai_protocol import ChatRequest, OpenAIError, parse_request

REFUSED = {  # parameter -> why (refused when set to anything but null/false/empty)
    "conversation": "the endpoint keeps no conversations: send the whole conversation as input",
    "background": "a turn is sampled while the call waits; background responses are not served",
    "prompt": "stored prompt templates live on OpenAI's side; send instructions and input instead",
    "context_management": "the conversation is never compacted: the model trains on what it saw",
    "max_tool_calls": "rlkit does not cap a turn's tool calls (the agent program runs them)",
    "include": "this endpoint returns no extra output data (logprobs, reasoning, tool results)",
    "top_logprobs": "the output carries no log-probs (the trainer computes its own); call without top_logprobs",
}
CONTENT_PARTS = ("input_text", "output_text")
INPUT_ROLES = ("user", "system", "developer", "assistant")


STORED_RESPONSES = 16  # an episode's last responses kept for previous_response_id (a program names its latest)
MAX_CHAIN_CHARS = 16 << 20  # a chained conversation may hold what one whole resend may (the endpoint's body limit)


def _bad(message: str, param: str, code: str = "unsupported_parameter") -> OpenAIError:
    return OpenAIError(400, message, param=param, code=code)


def _text(content: Any, where: str) -> str:
    """Text content: a string or a list of input_text/output_text parts (images and files are refused)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, Mapping) or part.get("type") not in CONTENT_PARTS \
                    or not isinstance(part.get("text"), str):
                raise _bad(f"{where}: only text parts are served ({' or '.join(CONTENT_PARTS)} with a string text)",
                           where, "invalid_value")
            texts.append(part["text"])
        return "".join(texts)
    raise _bad(f"{where} must be a string or a list of text parts", where, "invalid_value")


def _string(item: Mapping[str, Any], name: str, where: str) -> str:
    value = item.get(name)
    if not isinstance(value, str):
        raise _bad(f"{where}.{name} must be a string", f"{where}.{name}", "invalid_value")
    return value


def chat_messages(body: Mapping[str, Any], earlier: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """The call's `instructions`, the `earlier` conversation (a previous response's, rlkit.agent.openai_responses
    .ResponseStore) and its `input` as chat-completions messages (what parse_request takes)."""
    messages: list[dict[str, Any]] = []
    instructions = body.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise _bad("instructions must be a string", "instructions", "invalid_value")
        messages.append({"role": "system", "content": instructions})
    messages += earlier or []
    raw = body.get("input")
    if isinstance(raw, str):
        return [*messages, {"role": "user", "content": raw}]
    if not isinstance(raw, list) or not raw:
        raise _bad("input must be a string or a non-empty list of items", "input", "invalid_value")
    for i, item in enumerate(raw):
        where = f"input[{i}]"
        if not isinstance(item, Mapping):
            raise _bad(f"{where} must be an object (a message, function_call or function_call_output)", where,
                       "invalid_value")
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            role = item.get("role")
            if role not in INPUT_ROLES:
                raise _bad(f"{where}.role {role!r} is not one of {', '.join(INPUT_ROLES)}", f"{where}.role",
                           "invalid_value")
            messages.append({"role": role, "content": _text(item.get("content"), f"{where}.content")})
        elif kind == "function_call":
            call = {"id": _string(item, "call_id", where), "type": "function",
                    "function": {"name": _string(item, "name", where), "arguments": _string(item, "arguments", where)}}
            if messages and messages[-1]["role"] == "assistant":  # the message (or calls) it follows: one turn
                messages[-1].setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            messages.append({"role": "tool", "tool_call_id": _string(item, "call_id", where),
                             "content": _text(item.get("output"), f"{where}.output")})
        elif kind == "item_reference":
            raise _bad(f"{where}: item_reference is not served: the endpoint keeps no items; send the item itself",
                       where)
        else:
            raise _bad(f"{where}: items of type {kind!r} are not served (message, function_call and "
                       "function_call_output are; this endpoint never returns reasoning or built-in tool items)",
                       f"{where}.type")
    if messages[-1]["role"] == "assistant":
        raise _bad("the input ends with the assistant's turn (a message, or a function_call without its "
                   "function_call_output): continuing a written assistant turn is not served (every trained token "
                   "must be sampled)", "input", "invalid_value")
    return messages


def _tools(raw: Any) -> list[dict[str, Any]]:
    """Function tools, in the Responses shape, as the chat route's function schemas (same keys, same order)."""
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise _bad("tools must be a list", "tools", "invalid_value")
    schemas = []
    for i, tool in enumerate(raw):
        kind = tool.get("type") if isinstance(tool, Mapping) else None
        if kind != "function":
            raise _bad(f"tools[{i}]: type {kind!r} is not served: only function tools are (the agent program runs "
                       "its tools; OpenAI's built-in tools such as web_search, file_search and computer run on "
                       "OpenAI's side)", "tools")
        assert isinstance(tool, Mapping)
        schema: dict[str, Any] = {"name": _string(tool, "name", f"tools[{i}]")}
        for key in ("description", "parameters", "strict"):
            if tool.get(key) is not None:
                schema[key] = tool[key]
        schemas.append(schema)
    return schemas


def _check_settings(body: Mapping[str, Any]) -> None:
    """Refuse the parameters the endpoint cannot honour, each named with why."""
    for name, why in REFUSED.items():
        if body.get(name) not in (None, False, 0, "", {}, []):
            raise _bad(f"{name} is not served: {why}", name)
    reasoning = body.get("reasoning")
    if reasoning is not None and (not isinstance(reasoning, Mapping) or any(v is not None for v in reasoning.values())):
        raise _bad("reasoning is not served: rlkit samples the policy as it is (no effort or summary settings)",
                   "reasoning")
    text = body.get("text")
    if text is not None:
        fmt = text.get("format") if isinstance(text, Mapping) else None
        if not isinstance(text, Mapping) or (fmt is not None and (not isinstance(fmt, Mapping)
                                                                  or fmt.get("type") != "text")):
            raise _bad("text.format is not served unless it is {\"type\": \"text\"}: constrained decoding changes "
                       "the sampling distribution the trainer's log-probs are taken at", "text.format")
        if text.get("verbosity") is not None:
            raise _bad("text.verbosity is not served: rlkit samples the policy as it is", "text.verbosity")
    if body.get("truncation") not in (None, "disabled"):
        raise _bad("truncation is not served unless disabled: the conversation is never cut by the endpoint",
                   "truncation")
    for name in ("parallel_tool_calls", "store"):
        if body.get(name) is not None and not isinstance(body[name], bool):
            raise _bad(f"{name} must be a boolean", name, "invalid_value")
    stream, options = body.get("stream"), body.get("stream_options")
    if stream is not None and not isinstance(stream, bool):
        raise _bad("stream must be true or false", "stream", "invalid_value")
    if options is not None:  # as OpenAI checks it; include_obfuscation is accepted and ignored (a loopback stream)
        if not stream:
            raise _bad("stream_options is only allowed when stream is true", "stream_options", "invalid_value")
        if not isinstance(options, Mapping) or set(options) - {"include_obfuscation"} \
                or not isinstance(options.get("include_obfuscation", False), bool):
            raise _bad("stream_options may only set include_obfuscation (true or false)", "stream_options",
                       "invalid_value")
    limit = body.get("max_output_tokens")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise _bad("max_output_tokens must be a positive integer", "max_output_tokens", "invalid_value")


@dataclass(frozen=True)
class ResponsesCall:
    """One checked Responses call: the chat call it is, and what the Response repeats of it."""

    chat: ChatRequest
    echo: dict[str, Any]
    stream: bool = False  # answer as the Responses API's events (rlkit.agent.openai_responses_stream)
    conversation: tuple[dict[str, Any], ...] = ()  # the chat messages without the instructions (what a later call's
    # previous_response_id carries over, with the reply: OpenAI carries no instructions over)
    earlier: int = 0  # how many of them came from the named previous response
    earlier_chars: int = 0  # and their size as JSON


class ResponseStore:
    """An episode's last STORED_RESPONSES responses, each as its whole conversation (instructions excluded), for calls
    that name one as `previous_response_id` (the Agents SDK's `previous_response_id`/`auto_previous_response_id`): the
    call then sends only what is new. Kept per episode, whatever `store` says, so only that episode's key reaches
    them; a conversation is copied out, never shared, so a later call cannot change an earlier one."""

    def __init__(self) -> None:
        self._kept: OrderedDict[str, tuple[list[dict[str, Any]], int]] = OrderedDict()  # id -> conversation, chars

    def conversation(self, response_id: Any) -> tuple[list[dict[str, Any]], int]:
        """A copy of the named response's conversation, and its size as JSON (at most MAX_CHAIN_CHARS)."""
        if not isinstance(response_id, str) or response_id not in self._kept:
            raise _bad(f"previous_response_id {response_id!r} is not one of this episode's last {STORED_RESPONSES} "
                       "responses (rlkit keeps no others): name a response this episode got, or send the whole "
                       "conversation as input", "previous_response_id", "previous_response_not_found")
        conversation, chars = self._kept[response_id]
        if chars > MAX_CHAIN_CHARS:  # as a whole resend of it would be refused (a chain must not grow without end)
            raise OpenAIError(413, f"the conversation of previous_response_id {response_id!r} is over "
                                   f"{MAX_CHAIN_CHARS} bytes", param="previous_response_id")
        return copy.deepcopy(conversation), chars

    def keep(self, response_id: str, call: ResponsesCall, reply: Mapping[str, Any]) -> None:
        """The conversation of a served call and its reply (the chat completion's message); its size is the earlier
        part's plus what this call added, so a chain is never measured whole again."""
        added = [*call.conversation[call.earlier:], dict(reply)]
        chars = call.earlier_chars + len(json.dumps(added, default=str))
        self._kept[response_id] = (copy.deepcopy([*call.conversation, dict(reply)]), chars)
        while len(self._kept) > STORED_RESPONSES:
            self._kept.popitem(last=False)


def parse_responses(body: Any, gconfig: Mapping[str, float], store: ResponseStore | None = None) -> ResponsesCall:
    """The call as the chat route serves it, or OpenAIError naming the first parameter it cannot honour. `store`:
    the episode's responses, which `previous_response_id` may name (None: refused)."""
    if not isinstance(body, Mapping):
        raise OpenAIError(400, "the request body must be a JSON object")
    _check_settings(body)
    schemas = _tools(body.get("tools"))
    previous = body.get("previous_response_id")
    earlier, earlier_chars = (store or ResponseStore()).conversation(previous) if previous is not None else ([], 0)
    messages = chat_messages(body, earlier)
    chat_body: dict[str, Any] = {"messages": messages, "tool_choice": body.get("tool_choice"),
                                 "tools": [{"type": "function", "function": s} for s in schemas],
                                 "max_tokens": body.get("max_output_tokens")}
    chat_body.update({k: body[k] for k in ("temperature", "top_p", "top_k") if k in body})
    metadata = body.get("metadata")
    echo = {"instructions": body.get("instructions"), "max_output_tokens": body.get("max_output_tokens"),
            "metadata": dict(metadata) if isinstance(metadata, Mapping) else {},
            "parallel_tool_calls": body.get("parallel_tool_calls") is not False,
            "tool_choice": body.get("tool_choice") or "auto", "store": body.get("store") is True,
            "temperature": gconfig["temperature"], "top_p": gconfig["top_p"],
            "tools": [{"type": "function", "description": None, "parameters": None, "strict": None, **s}
                      for s in schemas],
            "user": body.get("user") if isinstance(body.get("user"), str) else None}
    conversation = tuple(messages[1:] if body.get("instructions") is not None else messages)
    echo["previous_response_id"] = previous
    return ResponsesCall(parse_request(chat_body, gconfig), echo, body.get("stream") is True, conversation,
                         len(earlier), earlier_chars)


def response_body(completion: Mapping[str, Any], call: ResponsesCall) -> dict[str, Any]:
    """The `response` object of one chat.completion answer (openai_protocol.completion_body): a message item with the
    text (when there is text, or no tool call), then a function_call item per tool call; `incomplete` when the turn
    hit its token limit."""
    choice = completion["choices"][0]
    message = choice["message"]
    turn_id = str(completion["id"]).removeprefix("chatcmpl-")
    status = "incomplete" if choice["finish_reason"] == "length" else "completed"
    output: list[dict[str, Any]] = []
    if message.get("content") or not message.get("tool_calls"):
        output.append({"id": f"msg_{turn_id}", "type": "message", "role": "assistant", "status": status,
                       "content": [{"type": "output_text", "text": message.get("content") or "", "annotations": []}]})
    for tool_call in message.get("tool_calls") or []:
        output.append({"id": f"fc_{tool_call['id'].removeprefix('chatcmpl-')}", "type": "function_call",
                       "status": "completed", "call_id": f"call_{tool_call['id'].removeprefix('chatcmpl-')}",
                       "name": tool_call["function"]["name"], "arguments": tool_call["function"]["arguments"]})
    usage = completion["usage"]
    now = time.time()
    return {"id": f"resp_{turn_id}", "object": "response", "created_at": completion.get("created", int(now)),
            "status": status, "completed_at": now if status == "completed" else None, "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "model": completion["model"], "output": output, **call.echo,
            "reasoning": None, "background": False, "text": {"format": {"type": "text"}}, "truncation": "disabled",
            "usage": {"input_tokens": usage["prompt_tokens"],
                      "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
                      "output_tokens": usage["completion_tokens"], "output_tokens_details": {"reasoning_tokens": 0},
                      "total_tokens": usage["total_tokens"]}}
