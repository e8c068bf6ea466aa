"""The tool registry: `module:function` tools with a JSON schema, called by name with arguments the model wrote.

A call never raises to the episode: an unknown tool, arguments that do not fit the schema, a tool that raises or
one that outlives its per-call timeout each become an error text for the `tool` message, so the model sees what
went wrong and the rollout goes on. Arguments are checked against the schema's `required`, `properties` types
and `enum` only (a small subset of JSON Schema, no new dependency): enough to turn the common model mistakes into
clear messages before the function runs.

Sync tools run in a worker thread so they do not block the event loop; a thread cannot be stopped, so a sync tool
that times out keeps running in the background until it returns. Untrusted or heavy code belongs in a separate
process (the code tool), not in a sync tool.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rlkit.config.problems import Problems
from rlkit.errors import ConfigError
from rlkit.import_path import import_callable

TOOL_SCHEMA_ATTR = "tool_schema"  # a function may carry its own schema in this attribute
TOOL_FORM = "module.path:function, called as fn(**arguments) (def or async def) -> str or a JSON-able value"
UNKNOWN_TOOL = "<unknown>"  # stats key for calls to names not registered (model output: not a metrics key)
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,63}$")
_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,), "integer": (int,), "number": (int, float), "boolean": (bool,), "array": (list,),
    "object": (dict,), "null": (type(None),),
}


class ToolError(Exception):
    """Raised by a tool whose failure it describes itself (e.g. the code tool's "time limit of 10 s exceeded"): the
    model reads the message as the tool's error, and the call counts as failed."""


@dataclass(frozen=True)
class ToolConfig:
    """One tool as the config names it; `schema` None: the function's `tool_schema` attribute."""

    fn: str
    schema: Mapping[str, Any] | None = None
    timeout_s: float = 30.0


@dataclass(frozen=True)
class Tool:
    """A callable tool with the schema offered to the model."""

    name: str
    description: str
    parameters: Mapping[str, Any]
    fn: Callable[..., Any]
    timeout_s: float = 30.0

    def schema(self) -> dict[str, Any]:
        return {"name": self.name, "description": self.description, "parameters": dict(self.parameters)}


@dataclass(frozen=True)
class ToolResult:
    """One call's outcome; `content` goes into the tool message (the output, or `error: ...`)."""

    name: str
    ok: bool
    content: str
    seconds: float
    timed_out: bool = False


@dataclass
class ToolStats:
    """Per tool, for metrics."""

    calls: int = 0
    errors: int = 0
    timeouts: int = 0
    seconds: float = 0.0


def _type_names(spec: Any) -> list[str]:
    return [spec] if isinstance(spec, str) else list(spec) if isinstance(spec, list) else []


def schema_problems(schema: Any) -> list[str]:
    """What is wrong with a tool schema (empty: usable)."""
    if not isinstance(schema, Mapping):
        return [f"the schema must be a mapping with name, description and parameters, got {type(schema).__name__}"]
    problems = []
    name = schema.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        problems.append(f"name {name!r} must be a string of letters, digits, '_', '.', '-' (64 at most), "
                        "starting with a letter or '_'")
    if not isinstance(schema.get("description"), str) or not schema["description"].strip():
        problems.append("description must be a non-empty string (the model reads it to decide when to call)")
    params = schema.get("parameters", {"type": "object", "properties": {}})
    if not isinstance(params, Mapping) or params.get("type", "object") != "object":
        return [*problems, "parameters must be a JSON schema of type object"]
    properties = params.get("properties", {})
    if not isinstance(properties, Mapping):
        return [*problems, "parameters.properties must be a mapping of argument name to schema"]
    for arg, spec in properties.items():
        names = _type_names(spec.get("type", [])) if isinstance(spec, Mapping) else None
        if names is None or any(t not in _JSON_TYPES for t in names):
            problems.append(f"parameters.properties.{arg} must be a schema whose type is one of "
                            f"{', '.join(_JSON_TYPES)} (or a list of them)")
    required = params.get("required", [])
    if not isinstance(required, list) or any(r not in properties for r in required):
        problems.append(f"parameters.required must list names from parameters.properties, got {required!r}")
    return problems


def _fits(value: Any, names: list[str]) -> bool:
    if isinstance(value, bool):  # JSON true is not a number
        return "boolean" in names
    return any(isinstance(value, _JSON_TYPES[t]) for t in names)


def argument_problems(parameters: Mapping[str, Any], arguments: Mapping[str, Any]) -> list[str]:
    """What is wrong with `arguments` for a tool's `parameters` schema (empty: call it)."""
    properties: Mapping[str, Any] = parameters.get("properties", {})
    problems = [f"missing required argument '{r}'" for r in parameters.get("required", []) if r not in arguments]
    for arg, value in arguments.items():
        spec = properties.get(arg)
        if spec is None:
            problems.append(f"unknown argument '{str(arg)[:64]}' (arguments: {', '.join(properties) or 'none'})")
            continue
        names = _type_names(spec.get("type", []))
        if names and not _fits(value, names):
            problems.append(f"argument '{arg}' must be {' or '.join(names)}, got {type(value).__name__}")
        elif "enum" in spec and value not in spec["enum"]:
            problems.append(f"argument '{arg}' must be one of {json.dumps(spec['enum'])}")
    return problems


def _signature_problems(fn: Callable[..., Any], parameters: Mapping[str, Any]) -> list[str]:
    """The function cannot take the arguments the schema allows, or needs one the schema does not offer."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return []
    params = signature.parameters.values()
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return []
    accepted = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    needed = {p.name for p in params if p.default is p.empty and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    properties = set(parameters.get("properties", {}))
    required = set(parameters.get("required", []))
    problems = [f"the schema offers argument '{a}' that the function does not take" for a in sorted(properties -
                                                                                                     accepted)]
    problems += [f"the function needs argument '{a}' that the schema does not require" for a in sorted(needed -
                                                                                                      required)]
    return problems


def make_tool(fn: Callable[..., Any], schema: Mapping[str, Any] | None = None, *, timeout_s: float = 30.0,
              where: str = "tool") -> Tool:
    """A tool from a function and its schema (or the function's `tool_schema`); ConfigError naming `where` and
    every problem."""
    schema = schema if schema is not None else getattr(fn, TOOL_SCHEMA_ATTR, None)
    if schema is None:
        raise ConfigError(f"{where} has no schema", hint=f"give one in the config, or set the function's "
                          f"{TOOL_SCHEMA_ATTR} attribute to {{name, description, parameters}}")
    problems = schema_problems(schema)
    if not problems:
        problems = _signature_problems(fn, schema.get("parameters", {}))
    if not isinstance(timeout_s, int | float) or isinstance(timeout_s, bool) or not timeout_s > 0:
        problems.append(f"timeout_s must be a positive number of seconds, got {timeout_s!r}")
    if problems:
        raise ConfigError(f"{where}: {'; '.join(problems)}", hint="fix the tool's schema (or its function)")
    parameters = schema.get("parameters", {"type": "object", "properties": {}})
    return Tool(schema["name"], schema["description"], parameters, fn, float(timeout_s))


def load_tools(entries: Sequence[ToolConfig], *, setting: str = "agent.tools") -> list[Tool]:
    """Every configured tool, or one ConfigError(s) naming every problem of every entry (and duplicate names)."""
    problems = Problems()
    tools: list[Tool] = []
    for i, entry in enumerate(entries):
        where = f"{setting}[{i}] ({entry.fn})"
        with problems.check():
            fn = import_callable(entry.fn, setting=f"{setting}[{i}].fn", form=TOOL_FORM, files=True)
            tools.append(make_tool(fn, entry.schema, timeout_s=entry.timeout_s, where=where))
    seen: set[str] = set()
    for tool in tools:
        if tool.name in seen:
            problems.add(f"{setting}: two tools are named '{tool.name}'", hint="give each tool its own name")
        seen.add(tool.name)
    problems.raise_if_any()
    return tools


def _as_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if value is None:
        return ""
    try:
        return json.dumps(value, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        return str(value)


class ToolRegistry:
    """The episode's tools by name; `call` turns every failure into an error result and counts it."""

    def __init__(self, tools: Sequence[Tool], *, max_result_chars: int = 4000) -> None:
        self.tools = {t.name: t for t in tools}
        if len(self.tools) != len(tools):
            raise ValueError("two tools share a name")
        self.max_result_chars = max_result_chars
        self.stats: dict[str, ToolStats] = {name: ToolStats() for name in self.tools}

    def schemas(self) -> list[dict[str, Any]]:
        """The schemas offered to the model, in registration order."""
        return [t.schema() for t in self.tools.values()]

    def _clip(self, text: str) -> str:
        """Results go into the model's context: a tool printing megabytes must not fill it."""
        if len(text) <= self.max_result_chars:
            return text
        return f"{text[:self.max_result_chars]}\n... [{len(text) - self.max_result_chars} more characters cut]"

    async def _run(self, tool: Tool, arguments: Mapping[str, Any]) -> Any:
        if inspect.iscoroutinefunction(tool.fn):
            result = await tool.fn(**arguments)
        else:
            result = await asyncio.to_thread(tool.fn, **arguments)
        if inspect.isawaitable(result):  # a sync function that returns an awaitable (functools.partial of async)
            result = await result
        return result

    async def call(self, name: str, arguments: Mapping[str, Any]) -> ToolResult:
        """Run one call; never raises (but for cancellation of the caller)."""
        started = time.monotonic()
        tool = self.tools.get(name)
        timed_out = False
        if tool is None:
            ok, content = False, (f"error: unknown tool '{name[:64]}' "
                                  f"(available: {', '.join(self.tools) or 'none'})")
        elif problems := argument_problems(tool.parameters, arguments):
            ok, content = False, f"error: bad arguments for tool '{name}': {'; '.join(problems)}"
        else:
            try:
                ok, content = True, _as_text(await asyncio.wait_for(self._run(tool, arguments), tool.timeout_s))
            except ToolError as exc:  # the tool's own account of its failure, told as it is
                ok, content = False, f"error: {exc}"
            except TimeoutError:
                ok, timed_out = False, True
                content = f"error: tool '{name}' timed out after {tool.timeout_s:g} s"
            except Exception as exc:
                ok, content = False, f"error: tool '{name}' raised {type(exc).__name__}: {exc}"
        seconds = time.monotonic() - started
        stats = self.stats.setdefault(name if tool is not None else UNKNOWN_TOOL, ToolStats())
        stats.calls += 1
        stats.errors += not ok
        stats.timeouts += timed_out
        stats.seconds += seconds
        return ToolResult(name, ok, self._clip(content), seconds, timed_out)

    def metrics(self) -> dict[str, float]:
        """Counters per tool since the start, as `tools/<name>/<counter>`."""
        out: dict[str, float] = {}
        for name, s in self.stats.items():
            out.update({f"tools/{name}/calls": s.calls, f"tools/{name}/errors": s.errors,
                        f"tools/{name}/timeouts": s.timeouts, f"tools/{name}/seconds": s.seconds})
        return out

