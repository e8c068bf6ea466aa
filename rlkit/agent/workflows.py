"""Episode workflows: the built-in tool-use loop, and finding the user's workflow named in rollout.agent.workflow.

A workflow is `async def episode(ctx, row) -> rlkit.agent.episode.Episode` (ctx: rlkit.agent.context). The built-in
`tool_use` is the loop most agent tasks start from: sample a turn; while the turn calls tools and the limits allow,
run the calls, give the results back, and sample again; the reward (reward.fn) scores the last turn's text.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import Any

from rlkit.agent.context import EpisodeContext
from rlkit.agent.episode import Episode
from rlkit.config.schema.agent import (
    BUILTIN_WORKFLOWS,
    OPENAI_WORKFLOW,
    TOOL_USE_WORKFLOW,
    VERIFIERS_WORKFLOW,
    AgentConfig,
)
from rlkit.errors import ConfigError
from rlkit.import_path import import_callable

Workflow = Callable[[EpisodeContext, dict[str, Any]], Awaitable[Episode]]
WORKFLOW_FORM = "module.path:function or /abs/path/file.py:function, an async def episode(ctx, row) -> Episode"


async def tool_use(ctx: EpisodeContext, row: dict[str, Any]) -> Episode:
    """Turns until one calls no tool (or a limit ends the episode); the reward of the last turn's text."""
    while True:
        turn = await ctx.generate()
        if turn is None or not turn.wants_tools or not await ctx.run_tool_calls(turn):
            break
    return ctx.finish(await ctx.reward())


def resolve_workflow(spec: str, *, setting: str = "rollout.agent.workflow",
                     agent: AgentConfig | None = None) -> Workflow:
    """The workflow `spec` names: the built-in tool_use, the built-in openai (its program from `agent.openai`), the
    built-in verifiers (its environment from `agent.verifiers`), or the user's async function. ConfigError with the
    fix."""
    spec = spec.strip()
    if spec == TOOL_USE_WORKFLOW:
        return tool_use
    if spec == OPENAI_WORKFLOW:
        from rlkit.agent.openai_workflow import OpenAIAgentWorkflow, resolve_program

        program = resolve_program((agent or AgentConfig()).openai)
        return OpenAIAgentWorkflow(program)
    if spec == VERIFIERS_WORKFLOW:
        from rlkit.agent.verifiers_workflow import VerifiersWorkflow, resolve_environment

        return VerifiersWorkflow(resolve_environment((agent or AgentConfig()).verifiers))
    if ":" not in spec and "." not in spec:
        raise ConfigError(f"{setting} '{spec}' is not a built-in workflow (choices: {', '.join(BUILTIN_WORKFLOWS)})",
                          hint=f"use {TOOL_USE_WORKFLOW}, {OPENAI_WORKFLOW}, or a workflow of your own as "
                               f"{WORKFLOW_FORM}")
    fn = import_callable(spec, setting=setting, form=WORKFLOW_FORM, files=True)
    if not inspect.iscoroutinefunction(fn):
        raise ConfigError(f"{setting} '{spec}' is not an async function: the rollout awaits it on its event loop",
                          hint="define it as `async def episode(ctx, row)`")
    workflow: Workflow = fn
    return workflow
