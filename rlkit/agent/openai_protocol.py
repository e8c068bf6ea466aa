"""The OpenAI chat-completions protocol as rlkit's agent endpoint speaks it (pure: no HTTP, no tokenizer).

What an agent program may ask, and why the rest is refused. The trainer's importance ratio compares its own
log-probs with the server's, both taken at gconfig's sampling settings, so a call may not change the distribution:
`temperature`, `top_p` and `top_k` must be absent or equal to gconfig's; `n` must be 1 (one episode is one
trajectory); `logit_bias`, penalties, `response_format` and forced tool choices (`required`, a named function) are
refused with an OpenAI-style error the client raises as it would for OpenAI's own. A call may set `max_tokens` /
`max_completion_tokens` (fewer tokens than a turn's limit), `stop`, `tools`, `tool_choice` (`auto`, `none`), and
`stream` with `stream_options.include_usage` (the sampled turn sent as OpenAI's chunks: rlkit.agent.openai_stream).
`seed` and `model` are accepted and ignored: rlkit seeds every turn so a resumed run samples the same, and serves
one model, the policy being trained.

Conversations are compared by `normalized` messages: the agent re-sends the whole conversation each call, as a
dict it built or as the client's own message object dumped back (extra null fields, tool-call ids, arguments as
JSON text with other spacing); what must be unchanged is each message's role, text, tool calls (name and parsed
arguments) and the tool_call_id a tool result answers.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rlkit import untrusted_json
from rlkit.agent.tool_calls import ParsedTurn

ROLES = ("system", "developer", "user", "assistant", "tool")
REFUSED_PARAMETERS = {  # parameter -> why the trainer cannot honour it
    "logit_bias": "it changes the sampling distribution the trainer's log-probs are taken at",
    "presence_penalty": "it changes the sampling distribution the trainer's log-probs are taken at",
    "frequency_penalty": "it changes the sampling distribution the trainer's log-probs are taken at",
    "response_format": "constrained decoding changes the sampling distribution the trainer's log-probs are taken at",
    "functions": "the legacy `functions` parameter is not served; give `tools`",
    "logprobs": "the reply carries no log-probs (the trainer computes its own); call without logprobs",
    "top_logprobs": "the reply carries no log-probs (the trainer computes its own); call without top_logprobs",
    "reasoning_effort": "rlkit samples the policy as it is (no effort setting changes what it writes)",
    "verbosity": "rlkit samples the policy as it is (no verbosity setting changes what it writes)",
    "prediction": "predicted outputs change what the server samples",
    "audio": "only text is served",
    "web_search_options": "web search runs on OpenAI's side; give the program a search tool of its own",
}
GCONFIG_PARAMETERS = ("temperature", "top_p", "top_k")


class OpenAIError(Exception):
    """A call the endpoint refuses, answered as OpenAI's API does (status, message, type, param, code)."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None,
                 kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = status, message, param, code, kind

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


@dataclass(frozen=True)
class ChatRequest:
    """One checked chat-completions call."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]  # the function schemas ({"name", "description", "parameters"})
    parse_tool_calls: bool  # False with tool_choice "none" or no tools: the turn's text is its content
    max_tokens: int | None
    stop: list[str] | None  # None: gconfig's
    stream: bool = False  # answer as server-sent chunks (rlkit.agent.openai_stream)
    include_usage: bool = False  # stream_options.include_usage: a last chunk with the usage


def _bad(message: str, param: str | None = None, code: str | None = None) -> OpenAIError:
    return OpenAIError(400, message, param=param, code=code)


def _text_of(content: Any, where: str) -> str:
    """A message's content as text: a string, null, or a list of text parts (other parts are refused)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, Mapping) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise _bad(f"{where}: only text content parts are served (type text with a string text)", where)
            texts.append(part["text"])
        return "".join(texts)
    raise _bad(f"{where}: content must be a string, null or a list of text parts", where)


def _arguments(raw: Any, where: str) -> Any:
    if isinstance(raw, str):
        try:
            return untrusted_json.loads(raw)  # "[[[[..." deeper than the stack is text, not a RecursionError
        except ValueError:
            return raw  # compared as written
    return raw


def normalized(message: Any, where: str) -> dict[str, Any]:
    """What of a message must stay unchanged when the agent re-sends it (see the module docstring)."""
    if not isinstance(message, Mapping):
        raise _bad(f"{where} must be an object with a role", where)
    role = message.get("role")
    if role not in ROLES:
        raise _bad(f"{where}.role {role!r} is not one of {', '.join(ROLES)}", f"{where}.role")
    out: dict[str, Any] = {"role": role, "content": _text_of(message.get("content"), f"{where}.content")}
    calls = message.get("tool_calls") or []
    if role == "assistant" and calls:
        if not isinstance(calls, list):
            raise _bad(f"{where}.tool_calls must be a list", f"{where}.tool_calls")
        parsed = []
        for i, call in enumerate(calls):
            fn = call.get("function") if isinstance(call, Mapping) else None
            if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
                raise _bad(f"{where}.tool_calls[{i}] needs function.name", f"{where}.tool_calls")
            parsed.append({"name": fn["name"], "arguments": _arguments(fn.get("arguments"), where)})
        out["tool_calls"] = parsed
    if role == "tool":
        out["tool_call_id"] = str(message.get("tool_call_id") or "")
    return out


def template_message(message: Mapping[str, Any]) -> dict[str, Any]:
    """A normalized message as chat templates take it (tool calls as {"type": "function", "function": ...})."""
    out = {k: v for k, v in message.items() if k != "tool_calls"}
    if message.get("tool_calls"):
        out["tool_calls"] = [{"type": "function", "function": dict(call)} for call in message["tool_calls"]]
    return out


def _tools(raw: Any) -> list[dict[str, Any]]:
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise _bad("tools must be a list", "tools")
    schemas = []
    for i, tool in enumerate(raw):
        fn = tool.get("function") if isinstance(tool, Mapping) else None
        if not isinstance(tool, Mapping) or tool.get("type", "function") != "function" or not isinstance(fn, Mapping) \
                or not isinstance(fn.get("name"), str):
            raise _bad(f"tools[{i}] must be {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}", "tools")
        schemas.append(dict(fn))
    return schemas


def _stop(raw: Any) -> list[str] | None:
    if raw is None:
        return None
    stops = [raw] if isinstance(raw, str) else raw
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops) or len(stops) > 4:
        raise _bad("stop must be a non-empty string or a list of at most 4 of them", "stop")
    return list(stops)


def _streaming(body: Mapping[str, Any]) -> tuple[bool, bool]:
    """(stream, include_usage), checked as OpenAI checks them."""
    stream, options = body.get("stream"), body.get("stream_options")
    if stream is not None and not isinstance(stream, bool):
        raise _bad("stream must be true or false", "stream")
    if options is None:
        return bool(stream), False
    if not stream:
        raise _bad("stream_options is only allowed when stream is true", "stream_options")
    if not isinstance(options, Mapping):
        raise _bad("stream_options must be an object", "stream_options")
    usage = options.get("include_usage")
    if usage is not None and not isinstance(usage, bool):
        raise _bad("stream_options.include_usage must be true or false", "stream_options.include_usage")
    return True, bool(usage)


def _max_tokens(body: Mapping[str, Any]) -> int | None:
    for name in ("max_completion_tokens", "max_tokens"):
        value = body.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise _bad(f"{name} must be a positive integer", name)
        return value
    return None


def parse_request(body: Any, gconfig: Mapping[str, float]) -> ChatRequest:
    """The call as rlkit serves it, or OpenAIError naming the first parameter it cannot honour. `gconfig`: the
    run's temperature, top_p and top_k (a call may repeat them, never change them)."""
    if not isinstance(body, Mapping):
        raise _bad("the request body must be a JSON object")
    for name, why in REFUSED_PARAMETERS.items():
        value = body.get(name)
        if value not in (None, False, 0, 0.0, {}, []) and not (name == "response_format" and isinstance(value, Mapping)
                                                          and value.get("type") == "text"):
            raise _bad(f"{name} is not served: {why}", name, "unsupported_parameter")
    if body.get("modalities") not in (None, ["text"]):
        raise _bad("modalities other than [\"text\"] are not served: only text is", "modalities",
                   "unsupported_parameter")
    for name in GCONFIG_PARAMETERS:
        value = body.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)
                                  or abs(float(value) - float(gconfig[name])) > 1e-6):
            raise _bad(f"{name}={value!r} differs from this episode's {name} {gconfig[name]} (gconfig's; "
                       "eval_gconfig's in an evaluation): the trainer's log-probs are taken at those sampling "
                       "settings (leave it out, or set it to that value)", name, "unsupported_value")
    n = body.get("n")
    if n not in (None, 1):
        raise _bad(f"n={n!r}: one call samples one turn of one episode (n must be 1)", "n", "unsupported_value")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _bad("messages must be a non-empty list", "messages")
    normal = [normalized(m, f"messages[{i}]") for i, m in enumerate(messages)]
    if normal[-1]["role"] == "assistant":
        raise _bad("the last message is the assistant's: continuing a written assistant turn is not served (every "
                   "trained token must be sampled)", "messages", "unsupported_value")
    tools = _tools(body.get("tools"))
    choice = body.get("tool_choice")
    if choice not in (None, "auto", "none"):
        raise _bad(f"tool_choice={choice!r}: only auto and none are served (forcing a call would change what the "
                   "policy samples)", "tool_choice", "unsupported_value")
    return ChatRequest(normal, tools, bool(tools) and choice != "none", _max_tokens(body), _stop(body.get("stop")),
                       *_streaming(body))


def completion_body(parsed: ParsedTurn | None, text: str, finish_reason: str, *, call_id: str, model: str,
                    prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
    """The chat.completion answer of one sampled turn. `parsed`: its tool calls (None: the text is the content);
    `finish_reason`: the server's (`stop` or `length`); it becomes `tool_calls` when the turn called tools."""
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if parsed is not None and parsed.calls:
        message["content"] = parsed.content or None
        message["tool_calls"] = [{"id": f"{call_id}-{i}", "type": "function",
                                  "function": {"name": call.name, "arguments": json.dumps(call.arguments)}}
                                 for i, call in enumerate(parsed.calls)]
        finish_reason = "tool_calls"
    return {"id": call_id, "object": "chat.completion", "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "message": message, "finish_reason": finish_reason, "logprobs": None}],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                      "total_tokens": prompt_tokens + completion_tokens}}


def assistant_message(body: Mapping[str, Any]) -> dict[str, Any]:
    """The normalized assistant message of a completion_body: what the agent must send back unchanged."""
    return normalized(body["choices"][0]["message"], "the reply")


def models_body(model: str) -> dict[str, Any]:
    return {"object": "list", "data": [{"id": model, "object": "model", "created": 0, "owned_by": "rlkit"}]}


def continues(known: Sequence[Mapping[str, Any]], messages: Sequence[Mapping[str, Any]]) -> bool:
    """Whether `messages` repeat `known` unchanged and add only non-assistant messages after it."""
    return (len(messages) > len(known) and list(messages[:len(known)]) == list(known)
            and all(m["role"] != "assistant" for m in messages[len(known):]))
