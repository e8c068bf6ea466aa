"""The CPU agent example's task (configs/grpo-agent-cpu-demo.yaml, `rlkit demo agent`, whose episodes are the agent
program rlkit/agent/press_door_agent.py; `episode` below is the same task as a workflow against rlkit's context): a
door that only a tool opens.

A door opens after two presses of its button, and only the `press` tool presses it. An episode earns half a point
per successful press, up to the two that open the door (and then ends: the door is open). No text the model could
write itself earns anything: the reward exists only through the tool, and the second press can only come in a
second turn, after the tool's first answer was inserted into the conversation.

The tool-call parser is the task's own (rollout.agent.tool_call_parser is pluggable): any digit in a turn is a call
to `press`. The tiny demo model starts from random weights and cannot write the JSON of a Hermes `<tool_call>`; a
digit is something it samples now and then (about 15% of 8-token turns), so the policy can discover the tool and
learn to use it in both turns. The prompts are the digits task's (rlkit.tasks.digits); the reward is the episode's.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rlkit.agent.context import EpisodeContext
from rlkit.agent.episode import Episode
from rlkit.agent.tool_calls import ParsedTurn, ToolCall


def press() -> str:
    return "the door is open"


press.tool_schema = {"name": "press", "description": "Press the button that opens the door.",  # type: ignore[attr-defined]
                     "parameters": {"type": "object", "properties": {}}}


def digits_press(text: str) -> ParsedTurn:
    """A turn with any digit in it calls `press` (once)."""
    turn = ParsedTurn(content=text)
    if any(c.isdigit() for c in text):
        turn.calls.append(ToolCall("press", {}))
    return turn


async def episode(ctx: EpisodeContext, row: dict[str, Any]) -> Episode:
    presses = 0
    turn = await ctx.generate()
    while turn is not None and turn.wants_tools:
        ok_before = ctx.tally.calls - ctx.tally.errors
        if not await ctx.run_tool_calls(turn):
            break
        presses += ctx.tally.calls - ctx.tally.errors - ok_before
        if presses >= 2:
            break  # the door is open
        turn = await ctx.generate()
    return ctx.finish(min(presses, 2) / 2, presses=float(presses))


def write_held_out(out: Path, prompts: int = 4) -> Path:
    """`prompts` digits-task rows none of which is in the training set (rlkit.tasks.digits draws both terms from
    0-49), for evaluation with the training episodes."""
    rows = [{"prompt": f"Q: {60 + i}+{71 + i}= A:", "answer": str(131 + 2 * i)} for i in range(prompts)]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return out
