"""An episode workflow written as a user writes one: a file outside rlkit's package, named in the config by its path
(rollout.agent.workflow=/abs/path/press_workflow.py:episode, and its tool and tool-call parser the same way).

The task: a door opens after two presses of its button, and only the `press` tool presses it. An episode earns
half a point per successful press, up to the two that open the door (and then ends: the door is open). No text the
model could write itself earns anything: the reward exists only through the tool, and the second press can only
come in a second turn, after the tool's first answer was inserted into the conversation.

The parser is this file's own (rollout.agent.tool_call_parser is pluggable): any digit in a turn is a call to
`press`. rlkit's tiny test model starts from random weights and cannot write the JSON of a Hermes `<tool_call>`;
a digit is something it samples now and then (about 15% of 8-token turns), so the policy can discover the tool
and learn to use it in both turns.
"""

from __future__ import annotations

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
