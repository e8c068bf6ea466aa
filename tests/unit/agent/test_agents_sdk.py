"""A real OpenAI Agents SDK program (configs/agents_sdk_agent.py: Agent, @function_tool, Runner.run, no rlkit import)
trained through the agent endpoint: run as `rollout.agent.openai.command` by OpenAIAgentWorkflow from the SDK's own
venv (scripts/agents-env.sh; RLKIT_AGENTS_PYTHON, which scripts/test.sh exports), against the real uvicorn endpoint
with the scripted server of test_openai_endpoint.py. Each of the SDK's models (the default Responses one, the
chat-completions one, each streamed; the Responses one also chained by previous_response_id) makes one token-exact
trajectory with the tool call and its result in it.
One program run per case: the venv's `import agents` alone costs ~2.5 CPU-s here."""

from __future__ import annotations

import ast
import asyncio
import os
import subprocess
from typing import Any

import pytest

from rlkit.agent.context import EpisodeContext, EpisodeServices
from rlkit.agent.episode import Episode
from rlkit.agent.tool_calls import parse_hermes
from rlkit.agent.tools import ToolRegistry
from rlkit.agent.trajectory import InsertedSegment, SampledSegment, TrajectoryLimits
from rlkit.rewards.runner import RewardOutcome
from rlkit.servers.backend import SamplingParams
from tests.conftest import CONFIGS, REPO
from tests.unit.agent.test_openai_endpoint import _scripted, _workflow

PROGRAM = CONFIGS / "agents_sdk_agent.py"
CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 17, "b": 25}}\n</tool_call>'
ANSWER = "17 + 25 = 42"
ROW = {"prompt": "What is 17 + 25?", "answer": "42"}


@pytest.fixture(scope="module")
def agents_python() -> str:
    """The Agents SDK venv's python: RLKIT_AGENTS_PYTHON, else the default venv when it holds the locked versions.
    Absent, the tests fail (never skip) with how to install it."""
    configured = os.environ.get("RLKIT_AGENTS_PYTHON", "")
    if configured:
        assert os.access(configured, os.X_OK), f"RLKIT_AGENTS_PYTHON={configured} is not an executable"
        return configured
    check = subprocess.run(["bash", str(REPO / "scripts/agents-env.sh"), "--check"], capture_output=True, text=True,
                           check=False)
    assert check.returncode == 0, f"no Agents SDK venv (scripts/test.sh installs it): {check.stderr.strip()}"
    return check.stdout.splitlines()[-1]


def _context(tok: Any, texts: list[str]) -> tuple[EpisodeContext, Any]:
    """An episode whose replies are `texts`, read by the Hermes parser (rlkit's default, as a model writes calls)."""
    async def score(prompt: str, answer: str, row: dict[str, Any]) -> RewardOutcome:
        return RewardOutcome(0.25)  # not the program's reward: a test can tell which one the episode got

    server = _scripted(tok, texts)
    services = EpisodeServices(score=score, tokenizer=tok, tools=ToolRegistry([]), parser=parse_hermes,
                               params=SamplingParams(max_new_tokens=64, temperature=1.0),
                               limits=TrajectoryLimits(3, 1000, 64))
    placeholder = tok.encode("placeholder", add_special_tokens=False)
    ctx = EpisodeContext(services, complete=server.complete, settled_version=server.settled, row=dict(ROW),
                         prompt_ids=placeholder, prompt_text="", seed=3)
    return ctx, server


def _run(tok: Any, python: str, *args: str) -> tuple[Episode, Any]:
    ctx, server = _context(tok, [CALL, ANSWER])
    workflow = _workflow(command=(python, str(PROGRAM), *args), timeout=60.0)
    return asyncio.run(workflow(ctx, ctx.row)), server


def _responses_calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, int]]:
    """(previous_response_id, input items) of each Responses call the endpoint parses."""
    from rlkit.agent import openai_endpoint

    calls: list[tuple[Any, int]] = []
    parse = openai_endpoint.parse_responses

    def spy(body: Any, *args: Any) -> Any:
        given = body.get("input") if isinstance(body, dict) else None
        calls.append((body.get("previous_response_id"), len(given) if isinstance(given, list) else 1))
        return parse(body, *args)

    monkeypatch.setattr(openai_endpoint, "parse_responses", spy)
    return calls


@pytest.mark.parametrize("args", [(), ("--stream",), ("--chain",), ("chat",), ("chat", "--stream")],
                         ids=["responses", "responses-streamed", "responses-chained", "chat", "chat-streamed"])
def test_an_agents_sdk_program_is_one_token_exact_episode(tok: Any, agents_python: str, args: tuple[str, ...],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _responses_calls(monkeypatch)
    episode, server = _run(tok, agents_python, *args)
    if "chat" in args:
        assert calls == [], "the chat-completions model never calls the Responses route"
    elif "--chain" in args:
        (first, _), (previous, items) = calls
        assert first is None and previous and items == 1, "the second call named the first response, sent its output"
    else:
        assert [previous for previous, _ in calls] == [None, None] and calls[1][1] > 1, "whole conversations"
    t = episode.trajectory
    assert episode.reward == 1.0, "the program's printed reward: the tool was used and the answer given"
    assert episode.info["openai_segments"] == 1 and episode.info["openai_calls"] == 2, "one trajectory, two turns"
    assert t.turns == 2 and not t.truncated and episode.tools.calls == 1
    prompt = tok.decode(list(t.prompt_ids))
    assert "Add with the add tool" in prompt and "What is 17 + 25?" in prompt, "instructions and the row's prompt"
    assert '"name": "add"' in prompt and '"a"' in prompt, "the @function_tool's schema, rendered once"
    end = tok.convert_tokens_to_ids("<|im_end|>")
    sampled = [s for s in t.segments if isinstance(s, SampledSegment)]
    inserted = [s for s in t.segments if isinstance(s, InsertedSegment)]
    assert [list(s.token_ids) for s in sampled] == [[*tok.encode(text, add_special_tokens=False), end]
                                                    for text in (CALL, ANSWER)], "the tool call, then the answer"
    assert len(inserted) == 1 and "tool" in inserted[0].text and "42" in inserted[0].text, "add(17, 25)'s result"
    assert all(s.version == 5 and set(s.logprobs) == {-0.25} for s in sampled)
    mask = [m for s in t.segments for m in ([1] * len(s.token_ids) if isinstance(s, SampledSegment)
                                              else [0] * len(s.token_ids))]
    assert list(t.loss_mask) == mask and sum(mask) == sum(len(s.token_ids) for s in sampled)
    second = server.requests[1][0]
    assert second == list(t.prompt_ids) + list(t.token_ids[:len(second) - len(t.prompt_ids)]), \
        "the second turn continued the first token for token"


def test_the_program_imports_the_sdk_and_no_rlkit() -> None:
    tree = ast.parse(PROGRAM.read_text())
    imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom) and node.module}
    assert imported == {"asyncio", "json", "sys", "agents", "openai"}, imported
