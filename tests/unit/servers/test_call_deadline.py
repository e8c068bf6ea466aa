"""The whole-answer deadline of the servers' control calls (rlkit.servers.http.call) and of the teacher's scoring
requests: a server that trickles a byte every 50 ms stays inside httpx's per-chunk read timeout, so before, the call
(a version check, a prefix-cache reset, a weight reload, a LoRA load, a fingerprint probe, a scoring batch) waited on
it forever. The servers are httpx.MockTransport stand-ins.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

import rlkit.rollout.teacher as teacher
from rlkit.errors import StepError
from rlkit.rollout.teacher import TeacherScorer
from rlkit.servers.backend import Server, backend_for
from rlkit.servers.http import call
from rlkit.types import Sample

TIMEOUT = 0.15


async def _trickle() -> AsyncIterator[bytes]:
    """A byte every 50 ms for 2 s (ending, so a call without the deadline fails its test instead of hanging)."""
    yield b'{"choices": ['
    for _ in range(40):
        await asyncio.sleep(0.05)
        yield b" "


def _trickling(request: httpx.Request) -> httpx.Response:
    return httpx.Response(200, content=_trickle())


def _client(handler: Callable[[httpx.Request], httpx.Response]) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.MockTransport(handler))


def test_a_trickling_answer_is_cut_at_the_timeout_naming_server_call_and_seconds() -> None:
    server = Server(index=3, address="h:9", model="/m", backend="vllm")

    async def main() -> None:
        async with _client(_trickling) as client:
            await call(client, server, "GET", "/weight_info", "the weight version", TIMEOUT)

    started = time.monotonic()
    with pytest.raises(StepError) as caught:
        asyncio.run(main())
    assert time.monotonic() - started < 1.5
    assert str(caught.value) == ("server 3 (h:9): no complete answer within 0.15 s to the weight version "
                                 "(GET /weight_info)")


CONTROL: dict[str, Callable[[Any, httpx.AsyncClient, Server], Awaitable[object]]] = {
    "version check": lambda b, c, s: b.read_version(c, s, TIMEOUT),
    "prefix-cache reset": lambda b, c, s: b.reset_prefix_cache(c, s, TIMEOUT),
    "adapter list": lambda b, c, s: b.list_adapters(c, s, TIMEOUT),
    "LoRA load": lambda b, c, s: b.load_adapter(c, s, "a", Path("/x"), 1, TIMEOUT),
    "fingerprint probe": lambda b, c, s: b.probe_logprobs(c, s, [1, 2, 3], TIMEOUT),
    "weight reload": lambda b, c, s: b.load_weights_from_disk(c, s, Path("/w"), 1, TIMEOUT),
}


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
@pytest.mark.parametrize("what", list(CONTROL))
def test_every_control_call_of_both_engines_has_the_deadline(engine: str, what: str) -> None:
    server = Server(index=0, address="h:1", model="/m", backend=engine)

    async def main() -> None:
        async with _client(_trickling) as client:
            await CONTROL[what](backend_for(engine), client, server)

    with pytest.raises(StepError, match=r"no complete answer within 0\.15 s"):
        asyncio.run(main())


def _scores(request: httpx.Request) -> httpx.Response:
    """vLLM's prompt_logprobs answer: each prompt token's own log-prob (rank 1), the first position null."""
    prompts = json.loads(request.content)["prompt"]
    choices = [{"index": i, "prompt_logprobs": [None] + [{str(t): {"logprob": -0.5, "rank": 1}} for t in seq[1:]]}
               for i, seq in enumerate(prompts)]
    return httpx.Response(200, json={"choices": choices})


def _score(monkeypatch: pytest.MonkeyPatch, handlers: dict[str, Callable[[httpx.Request], httpx.Response]],
           retries: int) -> tuple[TeacherScorer, list[Sample]]:
    monkeypatch.setattr(teacher, "server_client", lambda token, max_connections: _client(
        lambda request: handlers[request.url.netloc.decode()](request)))
    servers = [Server(index=i, address=a, model="/t", backend="vllm") for i, a in enumerate(handlers)]
    scorer = TeacherScorer(servers, "token", topk=0, request_batch=2, timeout=TIMEOUT, retries=retries,
                           max_in_flight=2)
    samples = [Sample([1, 2], [3, 4], [-1.0, -1.0], 0.0, 0, True, 0), Sample([5], [6], [-1.0], 0.0, 0, True, 0)]
    scorer.score(samples)
    return scorer, samples


def test_a_teacher_trickling_its_scores_is_cut_and_the_batch_scored_elsewhere(
        monkeypatch: pytest.MonkeyPatch) -> None:
    started = time.monotonic()
    scorer, samples = _score(monkeypatch, {"slow:1": _trickling, "good:1": _scores}, retries=1)
    assert time.monotonic() - started < 1.5
    assert scorer.failures == 1 and scorer.requests == 2
    assert [s.teacher_logp for s in samples] == [[-0.5, -0.5], [-0.5]]


def test_a_teacher_trickling_on_every_try_is_a_step_error_within_the_timeouts(
        monkeypatch: pytest.MonkeyPatch) -> None:
    started = time.monotonic()
    with pytest.raises(StepError) as caught:
        _score(monkeypatch, {"slow:1": _trickling}, retries=1)
    assert time.monotonic() - started < 1.5
    assert "could not score a batch of 2 samples in 2 tries" in str(caught.value)
    assert "server 0 (slow:1): no complete answer within 0.15 s to scoring 2 sequences" in str(caught.value)
