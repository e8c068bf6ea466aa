"""The agent program of the CPU agent example (configs/grpo-agent-cpu-demo.yaml, `rlkit demo agent`): the
press-the-door task of rlkit/agent/press_door.py written the way agents are written for OpenAI's API, with the
official client and no rlkit import. rlkit calls `agent(base_url, row)` once per episode; the episode's
key is part of `base_url`, so the client's own api_key is not used. One HTTP client serves every episode: building
one loads the CA bundle (~60 ms of CPU), more than the episode's own calls cost.

The model calls `press` (the example's parser reads any digit in a reply as that call: the tiny random model cannot
write JSON); the program runs the tool itself, sends its result back, and returns half a point per press, up to the
two that open the door.
"""

from __future__ import annotations

from typing import Any

from openai import DefaultHttpxClient, OpenAI

PRESS: Any = {"type": "function", "function": {"name": "press", "description": "Press the button that opens the door.",
                                          "parameters": {"type": "object", "properties": {}}}}
HTTP = DefaultHttpxClient()  # shared by the episodes' clients (thread-safe); openai's own defaults


def agent(base_url: str, row: dict[str, Any]) -> float:
    client = OpenAI(base_url=base_url, api_key="in-the-url", http_client=HTTP)
    messages: list[Any] = [{"role": "user", "content": row["prompt"]}]
    presses = 0
    while presses < 2:
        reply = client.chat.completions.create(model="policy", messages=messages, tools=[PRESS]).choices[0].message
        messages.append(reply.model_dump(exclude_none=True))
        if not reply.tool_calls:
            break
        for call in reply.tool_calls:
            presses += 1
            messages.append({"role": "tool", "tool_call_id": call.id, "content": "the door is open"})
    return min(presses, 2) / 2
