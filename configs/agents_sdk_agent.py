"""An OpenAI Agents SDK program (openai-agents 0.24, `pip install openai-agents`) as rlkit trains it, with no rlkit
import: rlkit runs it once per episode as `rollout.agent.openai.command` (docs/guides/agents.md), with
OPENAI_BASE_URL and OPENAI_API_KEY set to the episode's and the dataset row as JSON on stdin; its last line of output
is the episode's reward. Run it from the venv that holds the SDK (scripts/agents-env.sh), not rlkit's:

    rollout.agent.openai.command: [~/.cache/rlkit-agents/venv/bin/python, /path/to/agents_sdk_agent.py]

The agent answers sums with an `add` tool; the reward is half a point for having used the tool and half for the row's
answer in the final output. `chat` as the first argument uses the SDK's chat-completions model instead of its
default (the Responses API), `--stream` runs it with `Runner.run_streamed`, `--chain` sends only what is new each turn
(`auto_previous_response_id`: the Responses API's previous_response_id).
"""

import asyncio
import json
import sys

from agents import Agent, OpenAIChatCompletionsModel, Runner, ToolCallOutputItem, function_tool, set_tracing_disabled
from openai import AsyncOpenAI


@function_tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


async def main(args: list[str]) -> None:
    row = json.loads(sys.stdin.readline())
    set_tracing_disabled(True)  # the key is the episode's, not OpenAI's: send no traces
    # a model name alone: the SDK's default provider, the Responses API, a client from OPENAI_BASE_URL/OPENAI_API_KEY
    model = OpenAIChatCompletionsModel("policy", AsyncOpenAI()) if "chat" in args else "policy"
    agent = Agent(name="calculator", instructions="Add with the add tool, then give the sum.", tools=[add],
                  model=model)
    chain = "--chain" in args  # each call names the previous response and sends only what is new
    if "--stream" in args:
        result = Runner.run_streamed(agent, row["prompt"], max_turns=3, auto_previous_response_id=chain)
        async for _ in result.stream_events():
            pass
    else:
        result = await Runner.run(agent, row["prompt"], max_turns=3, auto_previous_response_id=chain)
    used_tool = any(isinstance(item, ToolCallOutputItem) for item in result.new_items)
    print(json.dumps(0.5 * used_tool + 0.5 * (row["answer"] in str(result.final_output))))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
