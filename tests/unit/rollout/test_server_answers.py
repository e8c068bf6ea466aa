"""What the pool does with a server that answers, but wrongly (a broken or foreign process on the address): an
answer of another shape, or completions no sampler could have produced, is refused with the server named and the
request goes to another server; a body that never ends is cut at rollout.request_timeout. Before, a `null` field
escaped as a bare TypeError, NaN log-probs and out-of-range token ids went on to the trainer, and a trickling body
held the request forever (httpx's read timeout is per chunk).

The servers are httpx.MockTransport stand-ins answering vLLM's /v1/completions and SGLang's /generate shapes.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest

from rlkit.errors import StepError
from rlkit.servers.backend import Completion, SamplingParams, Server
from rlkit.servers.pool import ServerPool

Handler = Callable[[httpx.Request], httpx.Response]
GOOD = {"choices": [{"index": 0, "text": "7", "token_ids": [7, 8], "logprobs": {"token_logprobs": [-0.1, -0.2]},
                     "finish_reason": "stop"}]}


def _vllm(choice: dict[str, Any] | None = None, body: Any = None) -> Handler:
    """A stand-in answering `body`, or GOOD with its one choice's fields updated by `choice` (NaN kept as NaN)."""
    answer = body if body is not None else {"choices": [{**GOOD["choices"][0], **(choice or {})}]}
    return lambda request: httpx.Response(200, content=json.dumps(answer).encode())


def _sample(handlers: dict[str, Handler], *, backend: str = "vllm", timeout: float = 5.0, retries: int = 1,
            retry_delay: float = 0.0) -> tuple[ServerPool, Server | Exception, list[Completion]]:
    servers = [Server(index=i, address=a, model="/m", backend=backend) for i, a in enumerate(handlers)]
    pool = ServerPool(servers, "token", timeout=timeout, retries=retries, max_in_flight=4, retry_delay=retry_delay)

    async def main() -> tuple[Server | Exception, list[Completion]]:
        await pool.aclose()
        pool._client = httpx.AsyncClient(transport=httpx.MockTransport(
            lambda request: handlers[request.url.netloc.decode()](request)))
        try:
            return await pool.complete([1, 2], SamplingParams(n=1, max_new_tokens=4))
        except StepError as exc:
            return exc, []
        finally:
            await pool.aclose()

    return (pool, *asyncio.run(main()))


BROKEN = {
    "choices null": ({}, {"choices": None}, "TypeError"),
    "logprobs null": ({"logprobs": None}, None, "TypeError"),
    "a null log-prob": ({"logprobs": {"token_logprobs": [None, -0.2]}}, None, "TypeError"),
    "choices a string": ({}, {"choices": "x"}, "TypeError"),
    "no choice": ({}, {"choices": []}, "answered 0 completions for n=1"),
    "NaN log-prob": ({"logprobs": {"token_logprobs": [float("nan"), -0.2]}}, None, "log-prob nan"),
    "infinite log-prob": ({"logprobs": {"token_logprobs": [-0.1, float("-inf")]}}, None, "log-prob -inf"),
    "negative token id": ({"token_ids": [7, -1]}, None, "token id -1"),
    "string token id": ({"token_ids": ["7", 8]}, None, "token id '7'"),
    "more tokens than asked": ({"token_ids": list(range(9)), "logprobs": {"token_logprobs": [-0.1] * 9}}, None,
                               "9 tokens, more than the 4 asked for"),
    "a log-prob missing": ({"token_ids": [7, 8, 9]}, None, "3 token ids but 2 log-probs"),
    "text not a string": ({"text": 7}, None, "text of type int"),
}


@pytest.mark.parametrize("case", list(BROKEN))
def test_a_broken_answer_is_refused_and_the_request_goes_to_another_server(case: str) -> None:
    choice, body, _ = BROKEN[case]
    pool, server, completions = _sample({"a:1": _vllm(choice, body), "b:1": _vllm()})
    assert isinstance(server, Server) and server.address == "b:1", server
    assert completions[0].token_ids == [7, 8] and pool.rerouted == 1


def test_a_positive_value_is_taken_for_vllm_s_logits_modes() -> None:
    """vllm.extra_args.logprobs_mode raw_logits / processed_logits (accepted at submit) puts logits where the
    log-probs go, often above 0: refusing them would fail every request of such a run."""
    pool, server, completions = _sample({"a:1": _vllm({"logprobs": {"token_logprobs": [2.5, -0.2]}})})
    assert isinstance(server, Server) and server.address == "a:1", server
    assert completions[0].logprobs == [2.5, -0.2] and pool.rerouted == 0


@pytest.mark.parametrize("case", list(BROKEN))
def test_a_broken_answer_everywhere_is_a_step_error_naming_server_and_problem(case: str) -> None:
    choice, body, why = BROKEN[case]
    _, error, _ = _sample({"a:1": _vllm(choice, body)})
    assert isinstance(error, StepError) and "a request failed 2 times" in str(error), error
    assert "server 0 (a:1)" in str(error) and why in str(error), str(error)


@pytest.mark.parametrize("meta", [None, {"finish_reason": "abort", "output_token_logprobs": [[-0.1, 7, None]]},
                                  {"finish_reason": {"type": "stop"}, "output_token_logprobs": [[-0.1]]}])
def test_an_sglang_answer_of_another_shape_is_a_step_error(meta: Any) -> None:
    handler = _vllm(body={"text": "7", "output_ids": [7], "meta_info": meta})
    _, error, _ = _sample({"a:1": handler}, backend="sglang")
    assert isinstance(error, StepError) and "server 0 (a:1): /generate answered" in str(error), error


def test_a_body_that_never_ends_is_cut_at_the_request_timeout() -> None:
    """Each chunk comes well within httpx's read timeout, so only a deadline on the whole answer stops it."""
    async def trickle() -> AsyncIterator[bytes]:
        yield b'{"choices": ['
        while True:
            await asyncio.sleep(0.05)
            yield b" "

    started = time.monotonic()
    pool, server, _ = _sample({"a:1": lambda request: httpx.Response(200, content=trickle()), "b:1": _vllm()},
                              timeout=0.5)
    assert isinstance(server, Server) and server.address == "b:1" and pool.rerouted == 1, server
    _, error, _ = _sample({"a:1": lambda request: httpx.Response(200, content=trickle())}, timeout=0.5, retries=0)
    assert isinstance(error, StepError) and "no complete answer within 0.5 s" in str(error), error
    assert time.monotonic() - started < 10


def test_retries_on_a_server_that_failed_back_off_and_the_error_carries_its_answer() -> None:
    """A burst of 503s (an overloaded or restarting server) is waited out, 0.1, 0.2, 0.4 s here, not hammered in
    a few milliseconds into a failed step; when it lasts, the error quotes the server's answer (vLLM says why)."""
    arrivals: list[float] = []

    def storm(request: httpx.Request) -> httpx.Response:
        arrivals.append(time.monotonic())
        if len(arrivals) <= 3:
            return httpx.Response(503, text="engine is sleeping")
        return _vllm()(request)

    _, server, completions = _sample({"a:1": storm}, retries=3, retry_delay=0.1)
    assert isinstance(server, Server) and completions[0].token_ids == [7, 8], server
    gaps = [later - earlier for earlier, later in itertools.pairwise(arrivals)]
    assert [round(g, 1) >= want for g, want in zip(gaps, (0.1, 0.2, 0.4), strict=True)] == [True] * 3, gaps
    _, error, _ = _sample({"a:1": lambda request: httpx.Response(400, text="prompt is too long")}, retries=1)
    assert isinstance(error, StepError) and "it answered 'prompt is too long'" in str(error), error
