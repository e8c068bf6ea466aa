"""Tool calls in an assistant turn's text, and tool results going back into the conversation.

The built-in format is Qwen2.5's (the Hermes one): each call is a JSON object between `<tool_call>` and
`</tool_call>`, with `name` and `arguments` (an object, or a string holding a JSON object, as some models write it).
Model output is untrusted and often malformed while a policy learns, so parsing never raises: every call it cannot
read becomes a `ToolCallProblem`, which the episode turns into an error message for the model instead of a crash.

Another format plugs in as `module.path:function`, a `ToolCallParser` (text -> ParsedTurn), like `reward.fn`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from rlkit.errors import ConfigError
from rlkit.import_path import import_callable

OPEN_TAG = "<tool_call>"
CLOSE_TAG = "</tool_call>"
HERMES = "hermes"
QWEN = "qwen"  # AReaL's name of the same format
PARSER_FORM = "module.path:function, called as fn(text) -> rlkit.agent.tool_calls.ParsedTurn"
_BLOCK = re.compile(re.escape(OPEN_TAG) + r"(.*?)" + re.escape(CLOSE_TAG), re.DOTALL)
_SHOWN = 200  # characters of a malformed call quoted back in its error message


@dataclass(frozen=True)
class ToolCall:
    """One call the model asked for. `index`: its position among the turn's calls (results go back in this order)."""

    name: str
    arguments: dict[str, Any]
    index: int = 0


@dataclass(frozen=True)
class ToolCallProblem:
    """A call the model tried to write but that cannot be run; `message` is what the model is told."""

    message: str
    raw: str
    index: int = 0


@dataclass
class ParsedTurn:
    """What an assistant turn asked for: the calls, the unreadable calls, and the text outside the call blocks."""

    calls: list[ToolCall] = field(default_factory=list)
    problems: list[ToolCallProblem] = field(default_factory=list)
    content: str = ""

    @property
    def wants_tools(self) -> bool:
        """True if the model tried to call anything (a malformed call too: it gets an error message and a turn)."""
        return bool(self.calls or self.problems)


class ToolCallParser(Protocol):
    """Reads the tool calls of one assistant turn; must not raise on any text (return problems instead)."""

    def __call__(self, text: str) -> ParsedTurn: ...


def _quote(raw: str) -> str:
    raw = raw.strip()
    return raw if len(raw) <= _SHOWN else raw[:_SHOWN] + "..."


def _read_call(raw: str, index: int) -> ToolCall | ToolCallProblem:
    """One `<tool_call>` body to a call, or the reason it is not one."""
    try:
        obj = json.loads(raw)
    except (ValueError, RecursionError) as exc:  # deep nesting in model output raises RecursionError
        return ToolCallProblem(f"tool call {index} is not valid JSON ({exc}): {_quote(raw)}", raw, index)
    if not isinstance(obj, dict):
        return ToolCallProblem(f"tool call {index} must be a JSON object with \"name\" and \"arguments\", got "
                               f"{type(obj).__name__}: {_quote(raw)}", raw, index)
    name = obj.get("name")
    if not isinstance(name, str) or not name.strip():
        return ToolCallProblem(f"tool call {index} has no \"name\" (a non-empty string): {_quote(raw)}", raw, index)
    arguments: Any = obj.get("arguments", {})
    if isinstance(arguments, str):  # arguments encoded as a JSON string, as OpenAI-style models write them
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except (ValueError, RecursionError) as exc:  # deep nesting in model output raises RecursionError
            return ToolCallProblem(f"tool call {index} ({name}): \"arguments\" is a string but not JSON ({exc})",
                                   raw, index)
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        return ToolCallProblem(f"tool call {index} ({name}): \"arguments\" must be a JSON object, got "
                               f"{type(arguments).__name__}", raw, index)
    return ToolCall(name.strip(), arguments, index)


def parse_hermes(text: str) -> ParsedTurn:
    """The `<tool_call>{...}</tool_call>` blocks of `text` (Qwen2.5 / Hermes). A block opened but never closed
    (a turn cut by its token limit, or a stray tag) is a problem, not a call."""
    turn = ParsedTurn()
    outside: list[str] = []
    position = 0
    for match in _BLOCK.finditer(text):
        outside.append(text[position:match.start()])
        position = match.end()
        read = _read_call(match.group(1), len(turn.calls) + len(turn.problems))
        if isinstance(read, ToolCall):
            turn.calls.append(read)
        else:
            turn.problems.append(read)
    rest = text[position:]
    if OPEN_TAG in rest:
        head, _, tail = rest.partition(OPEN_TAG)
        outside.append(head)
        turn.problems.append(ToolCallProblem(
            f"tool call {len(turn.calls) + len(turn.problems)} has {OPEN_TAG} but no {CLOSE_TAG}: {_quote(tail)}",
            tail, len(turn.calls) + len(turn.problems)))
    else:
        outside.append(rest)
    turn.content = "".join(outside).strip()
    return turn


def resolve_tool_call_parser(spec: str, *, setting: str = "rollout.agent.tool_call_parser") -> ToolCallParser:
    """The parser named by `spec`: "qwen" or "hermes" (built in: AReaL calls the format qwen), or a function of the
    user's as module.path:function or /abs/path/file.py:function."""
    spec = spec.strip()
    if spec in (HERMES, QWEN):
        return parse_hermes
    if ":" not in spec and "." not in spec:
        raise ConfigError(f"{setting} '{spec}' is not a built-in parser (choices: {QWEN}, {HERMES})",
                          hint=f"use {QWEN}, or a parser of your own as {PARSER_FORM}")
    parser: ToolCallParser = import_callable(spec, setting=setting, form=PARSER_FORM, files=True)
    return parser


def tool_message(call: ToolCall, content: str) -> dict[str, str]:
    """The `role: tool` message carrying one call's result (or its error text) back to the model."""
    return {"role": "tool", "name": call.name, "content": content}


def problem_message(problem: ToolCallProblem) -> dict[str, str]:
    """The `role: tool` message telling the model why its call could not be run, so it can write it again."""
    return {"role": "tool", "name": "", "content": f"error: {problem.message}"}


def tools_system_text(schemas: Sequence[Mapping[str, Any]]) -> str:
    """A short description of the tools and the Hermes call format, for chat templates that ignore `tools=`
    (rlkit.agent.chat puts it in the system message)."""
    lines = ["You can use these tools. Each is described by a JSON schema:"]
    lines += [json.dumps(dict(schema), sort_keys=True) for schema in schemas]
    lines.append(f"To use one, write {OPEN_TAG} then a JSON object {{\"name\": ..., \"arguments\": {{...}}}} "
                 f"then {CLOSE_TAG}. Each result comes back in a message from the tool.")
    return "\n".join(lines)
