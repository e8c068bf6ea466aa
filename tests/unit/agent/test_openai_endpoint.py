"""The OpenAI-compatible agent endpoint (rlkit.agent.openai_endpoint, rlkit.agent.openai_workflow) with the tiny
tokenizer, a real uvicorn server on the test's loop and the official `openai` client: what an unmodified agent program
becomes (a token-exact episode), who may call, what a call may not change, and what happens to programs that fail.
The inference server is a scripted `complete` function returning ids the test chooses; the real servers and the
learning are the agent trial's (tests/integration/test_agent_e2e.py)."""

from __future__ import annotations

import asyncio
import json
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from rlkit.agent.chat import render_prompt
from rlkit.agent.context import EpisodeContext, EpisodeServices
from rlkit.agent.episode import Episode, EpisodeDropped
from rlkit.agent.openai_workflow import AgentProgram, OpenAIAgentWorkflow
from rlkit.agent.press_door import digits_press
from rlkit.agent.press_door_agent import PRESS
from rlkit.agent.press_door_agent import agent as press_agent
from rlkit.agent.tools import ToolRegistry
from rlkit.agent.trajectory import InsertedSegment, SampledSegment, TrajectoryLimits
from rlkit.config.load import load_config
from rlkit.errors import StepError
from rlkit.jobs.validate import validate
from rlkit.rewards.runner import RewardOutcome
from rlkit.servers.backend import Completion, SamplingParams
from tests.helpers.scripted_server import ScriptedServer
from tests.helpers.slurm_helpers import wait_for


def _scripted(tok: Any, texts: list[str]) -> ScriptedServer:
    """The episode tests' scripted server, answering as server 0 at weight version 5 with log-prob -0.25."""
    return ScriptedServer(tok, texts, index=0, logprob=-0.25, version=5)


def _context(tok: Any, server: ScriptedServer, row: dict[str, Any] | None = None, *, max_turns: int = 3,
             temperature: float = 1.0) -> EpisodeContext:
    async def score(prompt: str, answer: str, row: dict[str, Any]) -> RewardOutcome:
        return RewardOutcome(0.75 if "4" in answer else 0.0)

    services = EpisodeServices(score=score, tokenizer=tok, tools=ToolRegistry([]), parser=digits_press,
                               params=SamplingParams(max_new_tokens=16, temperature=temperature),
                               limits=TrajectoryLimits(max_turns, 400, 16))
    # the rollout's first prompt is the row's; the endpoint replaces it with the agent's first call
    placeholder = tok.encode("placeholder", add_special_tokens=False)
    return EpisodeContext(services, complete=server.complete, settled_version=server.settled,
                          row=row or {"prompt": "Q: 2+2= A:"}, prompt_ids=placeholder, prompt_text="", seed=3)


def _workflow(agent: Any = None, *, command: tuple[str, ...] = (), timeout: float = 30.0) -> OpenAIAgentWorkflow:
    return OpenAIAgentWorkflow(AgentProgram(agent, command, timeout))


def test_an_unmodified_openai_client_agent_becomes_a_token_exact_episode(tok: Any) -> None:
    server = _scripted(tok, ["a 7", "8 b"])  # digits: both replies call `press` (the example's parser)
    ctx = _context(tok, server)
    episode = asyncio.run(_workflow(press_agent)(ctx, ctx.row))
    t = episode.trajectory
    assert episode.reward == 1.0 and t.turns == 2 and not t.truncated
    first = render_prompt(tok, [{"role": "user", "content": "Q: 2+2= A:"}], [PRESS["function"]])
    assert list(t.prompt_ids) == tok.encode(first, add_special_tokens=False), "the first call, rendered once"
    sampled = [s for s in t.segments if isinstance(s, SampledSegment)]
    inserted = [s for s in t.segments if isinstance(s, InsertedSegment)]
    end = tok.convert_tokens_to_ids("<|im_end|>")
    assert [list(s.token_ids) for s in sampled] == [[*tok.encode(text, add_special_tokens=False), end]
                                                    for text in ("a 7", "8 b")]
    assert all(s.version == 5 and set(s.logprobs) == {-0.25} for s in sampled)
    assert len(inserted) == 1 and "the door is open" in inserted[0].text and "tool" in inserted[0].text
    second = server.requests[1][0]
    assert second == list(t.prompt_ids) + list(t.token_ids[:len(second) - len(t.prompt_ids)])
    assert sum(t.loss_mask) == sum(len(s.token_ids) for s in sampled), "only sampled tokens are trained"
    assert episode.info["openai_calls"] == 2 and episode.info["openai_segments"] == 1
    assert episode.info["openai_refused"] == 0 and episode.tools.calls == 2, "the model's calls count as tool calls"


def _async_agent_calls(calls: list[dict[str, Any]], results: list[Any]) -> Any:
    """An async agent that makes the given raw calls with httpx (to send what the openai client would not)."""

    async def agent(base_url: str, row: dict[str, Any]) -> float | None:
        async with httpx.AsyncClient(timeout=30) as client:
            for body in calls:
                reply = await client.post(f"{base_url}/chat/completions", json=body)
                results.append((reply.status_code, reply.json()))
        return 0.5

    return agent


def test_calls_the_trainer_cannot_honour_get_openai_errors_and_the_rest_is_served(tok: Any) -> None:
    user = [{"role": "user", "content": "hi"}]
    refused = [
        ({"temperature": 0.2}, "temperature"), ({"n": 2}, "n"), ({"logit_bias": {"5": 10}}, "logit_bias"),
        ({"stream_options": {"include_usage": True}}, "stream_options"),  # only with stream, as OpenAI's
        ({"tool_choice": "required"}, "tool_choice"), ({"top_p": 0.5}, "top_p"),
        ({"presence_penalty": 0.5}, "presence_penalty"), ({"response_format": {"type": "json_object"}},
                                                          "response_format"),
        ({"logprobs": True}, "logprobs"), ({"top_logprobs": 3}, "top_logprobs"),
        ({"reasoning_effort": "high"}, "reasoning_effort"), ({"modalities": ["text", "audio"]}, "modalities"),
    ]
    calls = [{"model": "any", "messages": user, **extra} for extra, _ in refused]
    calls.append({"model": "any", "messages": user, "temperature": 1.0, "max_tokens": 2, "seed": 9,  # served
                  "logprobs": False, "modalities": ["text"]})
    results: list[Any] = []
    server = _scripted(tok, ["x 1 2 3 4"])
    ctx = _context(tok, server)
    episode = asyncio.run(_workflow(_async_agent_calls(calls, results))(ctx, ctx.row))
    for (status, body), (_, param) in zip(results, refused, strict=False):
        assert status == 400 and body["error"]["param"] == param and body["error"]["type"] == "invalid_request_error"
    status, body = results[-1]
    assert status == 200 and body["choices"][0]["finish_reason"] == "length", "max_tokens 2 cut the reply"
    assert body["usage"]["completion_tokens"] == 2 and "tool_calls" not in body["choices"][0]["message"]
    assert len(server.requests) == 1 and episode.info["openai_refused"] == len(refused)
    assert episode.reward == 0.5 and episode.trajectory.turns == 1


def test_a_call_is_held_to_its_own_episodes_sampling_settings(tok: Any) -> None:
    """An evaluation episode samples at eval_gconfig's settings: the endpoint holds a call to those, not gconfig's."""
    user = [{"role": "user", "content": "hi"}]
    results: list[Any] = []
    calls = [{"messages": user, "temperature": 1.0}, {"messages": user, "temperature": 0.7}]
    ctx = _context(tok, _scripted(tok, ["a"]), temperature=0.7)
    asyncio.run(_workflow(_async_agent_calls(calls, results))(ctx, ctx.row))
    assert [status for status, _ in results] == [400, 200]
    assert "differs from this episode's temperature 0.7" in results[0][1]["error"]["message"]


def test_calls_without_the_episodes_key_are_refused_and_concurrent_episodes_never_mix(tok: Any) -> None:
    workflow = _workflow()
    seen: dict[str, list[Any]] = {}

    async def run() -> tuple[list[Episode], list[int]]:
        gate = asyncio.Event()
        statuses: list[int] = []

        async def agent(base_url: str, row: dict[str, Any]) -> float:
            async with httpx.AsyncClient(timeout=30) as client:
                first = {"messages": [{"role": "user", "content": row["prompt"]}]}
                reply = (await client.post(f"{base_url}/chat/completions", json=first)).json()
                seen[row["prompt"]] = [reply]
                if row["prompt"] == "one":
                    root = base_url.split("/e/")[0]
                    key = base_url.split("/e/")[1].split("/")[0]
                    for headers in ({}, {"Authorization": "Bearer nope"}):  # no key, another key
                        statuses.append((await client.post(f"{root}/v1/chat/completions", json=first,
                                                           headers=headers)).status_code)
                    wrong = key[:-1] + ("x" if key[-1] != "x" else "y")  # one character off, never the key itself
                    statuses.append((await client.get(f"{root}/e/{wrong}/v1/models")).status_code)
                    statuses.append((await client.get(f"{root}/v1/models",
                                                      headers={"Authorization": f"Bearer {key}"})).status_code)
                    gate.set()
                else:
                    await gate.wait()  # both episodes are live at once
                second = {"messages": [*first["messages"], reply["choices"][0]["message"],
                                       {"role": "tool", "tool_call_id": "0", "content": f"for {row['prompt']}"}]}
                seen[row["prompt"]].append((await client.post(f"{base_url}/chat/completions", json=second)).json())
                seen[row["prompt"]].append(base_url)
            return 1.0

        workflow.program = AgentProgram(agent, (), 30.0)
        server = _scripted(tok, ["a", "b", "c", "d"])
        ctxs = [_context(tok, server, {"prompt": name}) for name in ("one", "two")]
        episodes = await asyncio.gather(*(workflow(c, c.row) for c in ctxs))
        # after its episode, a key is dead
        async with httpx.AsyncClient(timeout=30) as client:
            statuses.append((await client.post(f"{seen['one'][-1]}/chat/completions",
                                               json={"messages": [{"role": "user", "content": "x"}]})).status_code)
        return list(episodes), statuses

    episodes, statuses = asyncio.run(run())
    assert statuses == [401, 401, 401, 200, 401]
    for name, episode in zip(("one", "two"), episodes, strict=True):
        text = tok.decode(list(episode.trajectory.prompt_ids) + list(episode.trajectory.token_ids))
        other = "two" if name == "one" else "one"
        assert f"for {name}" in text and f"for {other}" not in text and f"\n{other}" not in text, text
        assert episode.trajectory.turns == 2 and episode.info["openai_segments"] == 1


def test_a_call_that_rewrites_earlier_turns_starts_a_new_segment_never_a_retokenized_one(tok: Any) -> None:
    results: list[Any] = []

    async def agent(base_url: str, row: dict[str, Any]) -> None:
        async with httpx.AsyncClient(timeout=30) as client:
            first = [{"role": "user", "content": "first question"}]
            reply = (await client.post(f"{base_url}/chat/completions", json={"messages": first})).json()
            edited = dict(reply["choices"][0]["message"], content="words the model never wrote")
            again = [*first, edited, {"role": "user", "content": "and now?"}]
            results.append((await client.post(f"{base_url}/chat/completions", json={"messages": again})).json())
        return None  # reward.fn scores the last reply

    server = _scripted(tok, ["one", "4 two"])
    ctx = _context(tok, server)
    episode = asyncio.run(_workflow(agent)(ctx, ctx.row))
    t = episode.trajectory
    assert episode.info["openai_segments"] == 2 and t.turns == 1, "the rewrite began a new trajectory"
    prompt = tok.decode(list(t.prompt_ids))
    assert "words the model never wrote" in prompt and "and now?" in prompt, "the new segment's prompt: that call"
    assert sum(t.loss_mask) == len(t.token_ids), "nothing the agent wrote is trained on"
    assert episode.reward == 0.75, "None: reward.fn scored the last reply ('4 two')"


def test_programs_that_fail_hang_or_return_no_reward_drop_their_episode(tok: Any, tmp_path: Path) -> None:
    def raises(base_url: str, row: dict[str, Any]) -> float:
        raise RuntimeError("the agent's own bug")

    async def hangs(base_url: str, row: dict[str, Any]) -> float:
        await asyncio.sleep(60)
        return 1.0

    def sleeps(base_url: str, row: dict[str, Any]) -> float:  # sync: in a thread nobody can kill
        time.sleep(8)
        return 1.0

    def silent(base_url: str, row: dict[str, Any]) -> float:
        return 1.0  # never called the model: nothing to train on

    def says_yes(base_url: str, row: dict[str, Any]) -> Any:
        press_agent(base_url, row)
        return "yes"

    cases = [(_workflow(raises), "raised RuntimeError: the agent's own bug"),
             (_workflow(hangs, timeout=0.5), "ran past rollout.agent.openai.timeout (0.5 s)"),
             (_workflow(sleeps, timeout=0.5), "ran past rollout.agent.openai.timeout (0.5 s)"),
             (_workflow(silent), "made no model call"),
             (_workflow(says_yes), "returned 'yes', not its reward")]
    for workflow, says in cases:
        ctx = _context(tok, _scripted(tok, ["1", "2"]))
        started = time.monotonic()
        with pytest.raises(EpisodeDropped, match=says.replace("(", r"\(").replace(")", r"\)")):
            asyncio.run(workflow(ctx, ctx.row))
        assert time.monotonic() - started < 6, "a program past its timeout is not waited for"
    stuck = [t for t in threading.enumerate() if t.name == "rlkit-agent"]
    assert stuck and all(t.daemon for t in stuck), "the sleeping program's thread: a daemon, never joined at exit"


def test_a_failure_on_rlkits_side_is_the_steps_error_not_a_dropped_episode(tok: Any) -> None:
    """The servers failing (the pool's StepError after its retries) fails the step as in every rollout, even though the
    program, answered with a 500, raised: dropping the group would sample other prompts against dead servers."""

    class Down(ScriptedServer):
        async def complete(self, ids: list[int], params: SamplingParams) -> tuple[int, Completion]:
            raise StepError("every server failed the request after 2 retries")

    ctx = _context(tok, Down(tok, [], index=0, logprob=-0.25, version=5))
    with pytest.raises(StepError, match="could not be sampled: StepError: every server failed") as caught:
        asyncio.run(_workflow(press_agent)(ctx, ctx.row))
    assert not isinstance(caught.value, EpisodeDropped)


def _command(tmp_path: Path, body: str) -> tuple[str, ...]:
    script = tmp_path / "agent.py"
    script.write_text(textwrap.dedent(body))
    return (sys.executable, str(script))


def test_an_agent_command_gets_its_episodes_url_key_and_row_and_prints_its_reward(tok: Any, tmp_path: Path) -> None:
    command = _command(tmp_path, """
        import json, os, sys
        from openai import OpenAI
        row = json.loads(sys.stdin.readline())
        assert json.loads(os.environ["RLKIT_EPISODE_ROW"]) == row
        client = OpenAI()  # OPENAI_BASE_URL and OPENAI_API_KEY: the episode's
        reply = client.chat.completions.create(model="m", messages=[{"role": "user", "content": row["prompt"]}])
        print("some output")
        print(json.dumps(0.25 if reply.choices[0].message.content == "x 9" else -1))
        """)
    ctx = _context(tok, _scripted(tok, ["x 9"]))
    episode = asyncio.run(_workflow(command=command)(ctx, ctx.row))
    assert episode.reward == 0.25 and episode.trajectory.turns == 1
    # the same program with the key taken off its base URL and given as the API key (bearer) works the same
    bearer = _command(tmp_path, """
        import json, os, sys
        from openai import OpenAI
        base = os.environ["OPENAI_BASE_URL"].split("/e/")[0] + "/v1"
        client = OpenAI(base_url=base)
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        print("null")
        """)
    ctx = _context(tok, _scripted(tok, ["4"]))
    assert asyncio.run(_workflow(command=bearer)(ctx, ctx.row)).reward == 0.75, "null: reward.fn's score"


def test_a_failing_or_hanging_command_is_dropped_and_its_process_group_killed(tok: Any, tmp_path: Path) -> None:
    failing = _command(tmp_path, "import sys\nprint('bad things', file=sys.stderr)\nsys.exit(3)\n")
    ctx = _context(tok, _scripted(tok, []))
    with pytest.raises(EpisodeDropped, match="exited with code 3: bad things"):
        asyncio.run(_workflow(command=failing)(ctx, ctx.row))
    pid_file = tmp_path / "child.pid"
    hanging = (sys.executable, "-c", "import subprocess, sys, time\n"
               f"child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
               f"open({str(pid_file)!r}, 'w').write(str(child.pid))\ntime.sleep(120)\n")
    ctx = _context(tok, _scripted(tok, []))
    with pytest.raises(EpisodeDropped, match="process group was killed"):
        asyncio.run(_workflow(command=hanging, timeout=3.0)(ctx, ctx.row))
    child = int(pid_file.read_text())
    status = Path(f"/proc/{child}/stat")

    def gone() -> bool:  # SIGKILL is delivered asynchronously: on a loaded machine the child ran a moment longer
        try:
            return status.read_text().split()[2] == "Z"
        except FileNotFoundError:
            return True

    wait_for(gone, "the program's own child to be killed too", timeout=10, every=0.05)


def test_a_dropped_episode_drops_its_group_and_is_counted(tok: Any) -> None:
    from rlkit.rollout.groups import EpisodeGroups, Prompt

    calls = 0

    def flaky(base_url: str, row: dict[str, Any]) -> float:
        nonlocal calls
        calls += 1
        if calls == 2:
            raise ValueError("once")
        return press_agent(base_url, row)

    server = _scripted(tok, ["1"] * 20)
    services = _context(tok, server).services

    class Pool:
        async def complete(self, ids: list[int], params: SamplingParams, prefer: int | None = None) -> Any:
            index, completion = await server.complete(ids, params)
            return type("S", (), {"index": index})(), [completion]

    groups = EpisodeGroups(_workflow(flaky), services, n_samples=3, seed=1, tool_schemas=[])
    prompt = Prompt(0, {"prompt": "Q: 1+1= A:"}, "Q: 1+1= A:", tok.encode("Q", add_special_tokens=False))
    sampled = asyncio.run(groups.sample(Pool(), prompt, 0, 0, server.settled))  # type: ignore[arg-type]
    assert sampled.samples == [] and sampled.dropped_episodes == 1


def test_workflow_openai_is_checked_at_submit_with_every_problem_named(grpo_yaml: Path) -> None:
    def problems(*overrides: str) -> str:
        return "\n".join(str(e) for e in validate(load_config(grpo_yaml, list(overrides))).problems.errors)

    text = problems("rollout.agent.workflow=openai")
    assert "give the agent program as exactly one of agent (a function) and command" in text
    text = problems("rollout.agent.workflow=openai", "rollout.agent.openai.agent=rlkit.agent.press_door_agent:nope",
                    "rollout.agent.tools=[rlkit.agent.press_door:press]", "rollout.agent.code_tool.enabled=true")
    for says in ("has no attribute 'nope'", "rollout.agent.tools is set, but with workflow openai",
                 "rollout.agent.code_tool.enabled is set, but with workflow openai"):
        assert says in text, text
    text = problems("rollout.agent.workflow=tool_use", "rollout.agent.openai.command=[/bin/true]")
    assert "rollout.agent.openai.command is set, but rollout.agent.workflow is not openai" in text
    assert "rollout.agent.openai.timeout must be" in problems("rollout.agent.workflow=openai",
                                                               "rollout.agent.openai.command=[/bin/true]",
                                                               "rollout.agent.openai.timeout=0")
    assert problems("rollout.agent.workflow=openai", "rollout.agent.openai.agent=rlkit.agent.press_door_agent:agent",
                    "rollout.agent.tool_call_parser=rlkit.agent.press_door:digits_press") == ""


def test_the_demo_config_names_a_program_that_imports_no_rlkit() -> None:
    source = Path(press_agent.__code__.co_filename).read_text()
    assert "import rlkit" not in source and "from rlkit" not in source
    assert "from openai import DefaultHttpxClient, OpenAI" in source and "OpenAI(base_url=base_url" in source
    assert json.dumps(PRESS)  # the tool schema the program offers, plain JSON
