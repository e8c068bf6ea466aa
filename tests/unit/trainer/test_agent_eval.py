"""Evaluation during training of an agent run (rollout.agent + evaluator): each held-out row runs through the episode
workflow training uses (rlkit.rollout.agent_setup.episode_groups, then its `for_params` at eval_gconfig's settings),
through the rollout controller and its real server pool and vLLM client, and the evaluation logs its reward and the
episodes' agent metrics under `eval/`.

The server is a STAND-IN: an httpx.MockTransport answering vLLM's /v1/completions shape with scripted text (a tool
call until the tool's answer is in the prompt, then the answer), tokenized with the tiny model's tokenizer. No vLLM
runs here (the agent trial with real servers is tests/integration/test_agent_e2e.py).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from rlkit.config.load import config_from_mapping
from rlkit.config.schema.experiment import ExperimentConfig
from rlkit.rewards.runner import RewardOutcome
from rlkit.rollout.agent_setup import episode_groups
from rlkit.rollout.controller import RolloutController
from rlkit.rollout.groups import Prompt
from rlkit.servers.backend import SamplingParams, Server
from rlkit.servers.pool import ServerPool
from rlkit.trainer.evaluator import Evaluator

CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
TOOLS = '''
def add(a: int, b: int) -> int:
    return a + b


add.tool_schema = {"name": "add", "description": "Add.",
                   "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                                  "required": ["a", "b"]}}
'''


def _config(tmp_path: Path, model: Path, *overrides: str) -> ExperimentConfig:
    tools = tmp_path / "eval_tools.py"
    tools.write_text(TOOLS)
    valid = tmp_path / "valid.jsonl"
    valid.write_text(json.dumps({"prompt": "add 2 and 3", "answer": "5"}) + "\n")
    data = {"experiment_name": "e", "trial_name": "t", "type": "grpo", "allocation_mode": "vllm:d1+fsdp:d1",
            "actor": {"path": str(model)},
            "gconfig": {"n_samples": 4, "max_new_tokens": 64, "temperature": 1.0},
            "eval_gconfig": {"n_samples": 2, "temperature": 0.5},
            "rollout": {"agent": {"workflow": "tool_use", "tools": [f"{tools}:add"], "max_turns": 2}},
            "valid_dataset": {"path": str(valid)}, "evaluator": {"freq_steps": 5}}
    return config_from_mapping(data, list(overrides))


class _Reward:
    """reward.fn as the rollout calls it: 1 for an answer with the sum in it."""

    async def score(self, prompt: str, completion: str, row: dict[str, Any]) -> RewardOutcome:
        return RewardOutcome(float(row["answer"] in completion))


class ScriptedServer:
    """vLLM's /v1/completions: a tool call, then (once the tool's answer is in the prompt) the answer; a prompt with
    `loop` in it gets tool calls forever. Records every request body; `on_request` lets a test act meanwhile."""

    def __init__(self, tok: Any) -> None:
        self.tok = tok
        self.bodies: list[dict[str, Any]] = []
        self.on_request: Any = None

    def handle(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        self.bodies.append(body)
        if self.on_request is not None:
            self.on_request(body)
        prompt = self.tok.decode(body["prompt"])
        answered = "<|im_start|>tool" in prompt or "<tool_response>" in prompt
        text = CALL if "loop" in prompt or not answered else "The sum is 5"
        ids = [*self.tok.encode(text, add_special_tokens=False), self.tok.convert_tokens_to_ids("<|im_end|>")]
        ids = ids[:body["max_tokens"]]
        choices = [{"index": k, "text": text, "token_ids": ids, "logprobs": {"token_logprobs": [-0.5] * len(ids)},
                    "finish_reason": "stop" if len(ids) < body["max_tokens"] else "length"} for k in range(body["n"])]
        return httpx.Response(200, json={"choices": choices})


def _controller(config: ExperimentConfig, tok: Any, server: ScriptedServer) -> RolloutController:
    """The rollout controller rank 0 builds for an agent run (its sampler from rollout.agent), its pool on the
    scripted server; not started: the test runs the evaluation on its own event loop."""
    reward = _Reward()
    sampler = episode_groups(config, tok, reward)
    assert sampler is not None
    ctrl = RolloutController(
        name_resolve=None, expected_servers=1, token="tok", prompts=[Prompt(0, {}, "x", [1])],  # type: ignore[arg-type]
        params=SamplingParams(), reward=reward, decode=tok.decode, batch_size=1,  # type: ignore[arg-type]
        max_offpolicyness=0, max_concurrent=8, queue_size=None, request_timeout=5.0, request_retries=0,
        setup_timeout=5.0, seed=config.seed, shuffle=False, start_version=3, sampler=sampler)
    pool = ServerPool([Server(index=0, address="a:1", model="/m", backend="vllm")], "tok", timeout=5.0, retries=0,
                      max_in_flight=8)
    pool._client = httpx.AsyncClient(transport=httpx.MockTransport(server.handle))
    ctrl.pool = pool
    return ctrl


def _evaluate(evaluator: Evaluator, ctrl: RolloutController) -> Any:
    async def run() -> Any:
        try:
            return await evaluator._evaluate()
        finally:
            assert ctrl.pool is not None
            await ctrl.pool.aclose()

    return asyncio.run(run())


def _rows(*texts: str) -> list[Prompt]:
    return [Prompt(i, {"prompt": text, "answer": "5"}, text, [1]) for i, text in enumerate(texts)]


def test_an_agent_run_evaluates_with_its_episodes_and_logs_their_metrics(tmp_path: Path, tiny_model_dir: Path,
                                                                        tok: Any) -> None:
    config = _config(tmp_path, tiny_model_dir)
    server = ScriptedServer(tok)
    ctrl = _controller(config, tok, server)
    evaluator = Evaluator(config, _rows("add 2 and 3", "loop: add 2 and 3"), ctrl, ctrl.sampler)
    metrics = _evaluate(evaluator, ctrl).metrics()

    # 2 prompts x eval_gconfig.n_samples 2 episodes: the first two call the tool once and answer in their second
    # turn (reward 1), the `loop` ones call it in both of their max_turns 2 turns and are truncated (reward 0)
    assert (metrics["eval/n"], metrics["eval/version"], metrics["eval/version_mismatches"]) == (4, 3, 0)
    assert metrics["eval/reward"] == pytest.approx(0.5)
    assert metrics["eval/agent/turns"] == 2.0
    assert metrics["eval/agent/tool_calls"] == pytest.approx(1.5)  # (1 + 1 + 2 + 2) / 4
    assert metrics["eval/agent/tool_errors"] == 0.0
    assert metrics["eval/agent/used_tools"] == 1.0
    assert metrics["eval/agent/truncated"] == pytest.approx(0.5)
    assert metrics["eval/agent/truncated_by/max_turns"] == 2.0
    assert 0 < metrics["eval/agent/masked_fraction"] < 1, "tool answers are inserted (masked) tokens"
    assert not any(k.startswith("agent/") for k in metrics), "training's names stay training's"

    assert len(server.bodies) == 4 * 2
    assert {(b["n"], b["temperature"]) for b in server.bodies} == {(1, 0.5)}, "one turn per request, at eval_gconfig's"
    first = tok.decode(server.bodies[0]["prompt"])
    assert "add" in first and "<|im_start|>user\nadd 2 and 3" in first, "the chat template, with the tool offered"
    assert any("5" in tok.decode(b["prompt"]) and "<|im_start|>tool" in tok.decode(b["prompt"])
               for b in server.bodies), "the tool's answer went back into the next turn's prompt"
    # the evaluation's tool calls are its own: training's per-tool counters (tools/add/*) did not move
    assert ctrl.sampler.metrics().get("tools/add/calls", 0) == 0
    assert evaluator.sampler.metrics()["tools/add/calls"] == 6


def test_an_episode_during_which_a_weight_update_began_is_left_out(tmp_path: Path, tiny_model_dir: Path,
                                                                  tok: Any) -> None:
    """A push that begins while an episode is between turns: its next turn comes from the next version, so the
    episode is counted as a version mismatch and neither its reward nor its agent metrics are the evaluation's."""
    config = _config(tmp_path, tiny_model_dir, "eval_gconfig.n_samples=1")
    server = ScriptedServer(tok)
    ctrl = _controller(config, tok, server)

    def push_during_the_first_turn(body: dict[str, Any]) -> None:
        if ctrl.updates == 0:
            ctrl.begin_update()
            ctrl.end_update(4)

    server.on_request = push_during_the_first_turn
    evaluator = Evaluator(config, _rows("add 2 and 3"), ctrl, ctrl.sampler)
    outcome = _evaluate(evaluator, ctrl)
    metrics = outcome.metrics()
    assert len(server.bodies) == 2, "the episode ran both turns, the second at version 4"
    assert (metrics["eval/n"], metrics["eval/version_mismatches"], metrics["eval/version"]) == (0, 1, 3)
    assert outcome.rewards == [] and not any(k.startswith("eval/agent/") for k in metrics)


def test_evaluation_episodes_keep_the_training_limits_and_a_push_waits_for_them(tmp_path: Path, tiny_model_dir: Path,
                                                                                     tok: Any) -> None:
    """eval_gconfig.max_new_tokens may shorten an evaluation turn; the episode's token limit and max_turns are
    training's."""
    config = _config(tmp_path, tiny_model_dir, "eval_gconfig.max_new_tokens=16")
    ctrl = _controller(config, tok, ScriptedServer(tok))
    evaluator = Evaluator(config, _rows("add 2 and 3"), ctrl, ctrl.sampler)
    trained, evaluated = ctrl.sampler.services.limits, evaluator.sampler.services.limits  # type: ignore[attr-defined]
    assert (trained.max_tokens_per_turn, evaluated.max_tokens_per_turn) == (64, 16)
    assert (evaluated.max_turns, evaluated.max_total_tokens) == (trained.max_turns, trained.max_total_tokens)
    # a push waits for a running evaluation as long as an episode may take: each turn's request and tool calls
    assert evaluator.wait_s == 2 * (config.rollout.request_timeout + config.rollout.agent.tool_timeout)
    asyncio.run(ctrl.pool.aclose())  # type: ignore[union-attr]
