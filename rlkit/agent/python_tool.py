"""The code tool as the model meets it: the registry's `python` tool (its schema and the call that runs the sandbox,
rlkit.agent.code_tool) and the line the trainer logs at start about the isolation this node gives."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from rlkit.agent.code_tool import CodeTool, run_python


def isolation_summary(tool: CodeTool) -> str:
    """One line for the trainer's log at start: what isolation a trivial run gets on this node, and what that means
    for the model's calls under the tool's `isolation` setting."""
    result = run_python("pass", limits=tool.limits, scratch_root=tool.scratch_root, python=tool.python,
                        hide=tool.hide, isolation=tool.isolation)
    also = f"; {'; '.join(result.notes)}" if result.notes else ""
    if result.ok and result.isolated:
        return f"isolation on this node: full (namespaces, private /proc, read-only mounts, hidden paths){also}"
    if result.ok:
        return f"isolation on this node: partial, runs go on (isolation: best_effort){also}"
    if result.error is not None and result.error.startswith("the code was not run"):
        return f"isolation on this node: not available, every call will be refused: {result.error}"
    return f"a trial run failed: {result.error}"


PYTHON_TOOL_SCHEMA = {
    "name": "python",
    "description": "Run a Python program and get what it prints (no network, no subprocesses, limited time and "
                   "memory).",
    "parameters": {"type": "object", "properties": {"code": {"type": "string", "description": "the program"}},
                   "required": ["code"]},
}


def python_tool(code_tool: CodeTool) -> Callable[..., Awaitable[str]]:
    """The registry's `python` tool (rlkit.agent.tools.make_tool with PYTHON_TOOL_SCHEMA) running `code_tool`."""

    from rlkit.agent.tools import ToolError

    told: set[str] = set()

    async def python(code: str) -> str:
        result = await code_tool.run(code)
        for note in result.notes:  # isolation that did not hold on this node: said once in the trainer's log
            if note not in told:
                told.add(note)
                print(f"rlkit code tool: {note}", flush=True)
        if not result.ok:
            raise ToolError(result.tool_text())
        return result.output

    return python
