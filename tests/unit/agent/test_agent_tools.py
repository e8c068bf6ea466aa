"""The tool registry: tools loaded from module:function with their schemas, arguments checked, and every failure
(unknown tool, bad arguments, raising, timing out) an error text for the model, counted per tool."""

from __future__ import annotations

import asyncio
import json
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rlkit.agent.tools import (
    UNKNOWN_TOOL,
    Tool,
    ToolConfig,
    ToolRegistry,
    argument_problems,
    load_tools,
    make_tool,
    schema_problems,
)
from rlkit.errors import ConfigError, ConfigErrors

USER_TOOLS = '''
import asyncio, time

def add(a, b):
    return a + b
add.tool_schema = {"name": "add", "description": "Add two integers.",
                   "parameters": {"type": "object", "required": ["a", "b"],
                                  "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}}

async def lookup(key, default=None):
    await asyncio.sleep(0)
    return {"alpha": 1, "beta": [2, 3]}.get(key, default)

def no_schema(x):
    return x

def needs_two(a, b):
    return a
'''
LOOKUP = {"name": "lookup", "description": "Look a key up in the table.",
          "parameters": {"type": "object", "required": ["key"],
                         "properties": {"key": {"type": "string", "enum": ["alpha", "beta", "gamma"]},
                                        "default": {"type": ["integer", "null"]}}}}


@pytest.fixture
def user_tools(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A tools module written as a user would, outside the package, imported by path."""
    import sys

    name = "rlkit_test_user_tools"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(USER_TOOLS))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    sys.modules.pop(name, None)


def schema(name: str, properties: dict[str, Any], required: list[str] | None = None) -> dict[str, Any]:
    return {"name": name, "description": f"the {name} tool",
            "parameters": {"type": "object", "properties": properties, "required": required or []}}


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_load_tools_from_the_attribute_and_from_config(user_tools: str) -> None:
    tools = load_tools([ToolConfig(f"{user_tools}:add"), ToolConfig(f"{user_tools}:lookup", LOOKUP, timeout_s=2)])
    assert [t.name for t in tools] == ["add", "lookup"] and tools[1].timeout_s == 2.0
    registry = ToolRegistry(tools)
    assert registry.schemas()[1] == LOOKUP
    assert run(registry.call("add", {"a": 2, "b": 40})).content == "42"
    result = run(registry.call("lookup", {"key": "beta"}))
    assert result.ok and json.loads(result.content) == [2, 3]
    assert run(registry.call("lookup", {"key": "gamma"})).content == ""  # None -> empty text


def test_load_tools_names_every_problem_at_once(user_tools: str) -> None:
    entries = [ToolConfig(f"{user_tools}:no_schema"),
               ToolConfig(f"{user_tools}:needs_two", schema("needs_two", {"a": {"type": "integer"},
                                                                          "c": {"type": "integer"}}, ["a"])),
               ToolConfig(f"{user_tools}.add"),
               ToolConfig(f"{user_tools}:add", timeout_s=0),
               ToolConfig(f"{user_tools}:add"), ToolConfig(f"{user_tools}:add")]
    with pytest.raises(ConfigErrors) as caught:
        load_tools(entries)
    message = str(caught.value)
    assert "agent.tools[0] (rlkit_test_user_tools:no_schema) has no schema" in message and "tool_schema" in message
    assert "offers argument 'c' that the function does not take" in message
    assert "needs argument 'b' that the schema does not require" in message
    assert "agent.tools[2].fn 'rlkit_test_user_tools.add' has no ':'" in message
    assert "timeout_s must be a positive number" in message
    assert "two tools are named 'add'" in message
    assert len(caught.value.errors) == 5


@pytest.mark.parametrize(("bad", "expected"), [
    ("not a mapping", "must be a mapping"),
    ({"name": "has space", "description": "d"}, "name 'has space' must be"),
    ({"name": "t", "description": ""}, "description must be a non-empty string"),
    ({"name": "t", "description": "d", "parameters": {"type": "array"}}, "of type object"),
    ({"name": "t", "description": "d", "parameters": {"properties": {"x": {"type": "text"}}}}, "properties.x must be"),
    ({"name": "t", "description": "d", "parameters": {"properties": {}, "required": ["x"]}}, "required must list"),
])
def test_schema_problems(bad: Any, expected: str) -> None:
    problems = schema_problems(bad)
    assert any(expected in p for p in problems), problems


def test_schema_with_no_parameters_is_a_tool_without_arguments() -> None:
    tool = make_tool(lambda: "pong", {"name": "ping", "description": "Answer pong."})
    assert tool.parameters == {"type": "object", "properties": {}}
    assert run(ToolRegistry([tool]).call("ping", {})).content == "pong"


def test_argument_problems() -> None:
    params = LOOKUP["parameters"]
    assert argument_problems(params, {"key": "alpha", "default": None}) == []
    assert argument_problems(params, {"key": "alpha", "default": 3}) == []
    assert argument_problems(params, {}) == ["missing required argument 'key'"]
    assert argument_problems(params, {"key": 3}) == ["argument 'key' must be string, got int"]
    assert argument_problems(params, {"key": "delta"}) == ['argument \'key\' must be one of ["alpha", "beta", "gamma"]']
    assert argument_problems(params, {"key": "alpha", "default": True}) == [
        "argument 'default' must be integer or null, got bool"]  # JSON true is not an integer
    assert argument_problems(params, {"key": "alpha", "extra": 1}) == [
        "unknown argument 'extra' (arguments: key, default)"]
    numbers = {"properties": {"x": {"type": "number"}, "n": {"type": "integer"}}}
    assert argument_problems(numbers, {"x": 1, "n": 2}) == []
    assert argument_problems(numbers, {"x": 1.5, "n": 2.0}) == ["argument 'n' must be integer, got float"]


def slow_sync(seconds: float) -> str:
    time.sleep(seconds)
    return "late"


async def slow_async(seconds: float) -> str:
    await asyncio.sleep(seconds)
    return "late"


def boom(**kwargs: Any) -> str:
    raise ValueError("the table is on fire")


def huge() -> str:
    return "x" * 10_000


SECONDS = {"seconds": {"type": "number"}}
TOOL_TIMEOUT = 0.5


@pytest.fixture
def registry() -> ToolRegistry:
    # half a second: room enough for a thread to start and a quick call to answer on a loaded machine (0.2 s was
    # not, in a suite run with 11 runnable processes on two cores)
    tools = [make_tool(slow_sync, schema("slow_sync", SECONDS, ["seconds"]), timeout_s=TOOL_TIMEOUT),
             make_tool(slow_async, schema("slow_async", SECONDS, ["seconds"]), timeout_s=TOOL_TIMEOUT),
             make_tool(boom, schema("boom", {"why": {"type": "string"}})),
             make_tool(huge, schema("huge", {}))]
    return ToolRegistry(tools, max_result_chars=300)


@pytest.mark.parametrize("name", ["slow_sync", "slow_async"])
def test_a_tool_past_its_timeout_is_an_error_within_the_timeout(registry: ToolRegistry, name: str) -> None:
    result = run(registry.call(name, {"seconds": 1.5 if name == "slow_sync" else 30}))
    assert not result.ok and result.timed_out and result.content == f"error: tool '{name}' timed out after 0.5 s"
    assert 0.5 <= result.seconds < 1.2  # the caller waited its timeout, not the tool (a sync one runs on, unseen)
    assert registry.stats[name].timeouts == 1 and registry.stats[name].errors == 1
    assert run(registry.call(name, {"seconds": 0.01})).content == "late"


def test_failures_become_error_text_and_are_counted(registry: ToolRegistry) -> None:
    async def calls() -> list[Any]:
        return await asyncio.gather(registry.call("boom", {"why": "x"}), registry.call("nope" * 40, {}),
                                    registry.call("slow_async", {"seconds": "1"}), registry.call("huge", {}))

    raised, unknown, bad_args, long = run(calls())
    assert raised.content == "error: tool 'boom' raised ValueError: the table is on fire" and not raised.ok
    assert unknown.content.startswith("error: unknown tool 'nopenope") and len(unknown.content) < 200
    assert "available: slow_sync, slow_async, boom, huge" in unknown.content
    assert bad_args.content == "error: bad arguments for tool 'slow_async': argument 'seconds' must be number, got str"
    assert long.ok and long.content.startswith("x" * 300) and long.content.endswith("[9700 more characters cut]")
    assert registry.stats[UNKNOWN_TOOL].calls == 1  # a name the model made up is not a metrics key
    metrics = registry.metrics()
    assert metrics["tools/boom/calls"] == 1 and metrics["tools/boom/errors"] == 1
    assert metrics["tools/huge/errors"] == 0 and metrics["tools/slow_sync/calls"] == 0
    assert metrics["tools/slow_async/errors"] == 1 and metrics["tools/huge/seconds"] >= 0


def test_registry_rejects_duplicate_names() -> None:
    tool = Tool("t", "d", {"type": "object", "properties": {}}, huge)
    with pytest.raises(ValueError, match="share a name"):
        ToolRegistry([tool, tool])


def test_make_tool_without_schema_says_where_to_put_one() -> None:
    with pytest.raises(ConfigError, match="has no schema") as caught:
        make_tool(huge)
    assert "tool_schema" in str(caught.value)
