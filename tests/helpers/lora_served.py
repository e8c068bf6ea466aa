"""Test helpers (not a conftest) shared by the real-server LoRA tests of both backends (test_lora_vllm,
test_sglang_lora): one served adapter target driven from a background event loop as the rollout controller drives
it, and the trainer's peft model with non-zero B matrices (peft starts B at zero, which would change nothing)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from rlkit.config.schema.experiment import ExperimentConfig
from rlkit.servers.backend import Server
from rlkit.servers.http import server_client
from rlkit.trainer.lora import wrap_lora
from rlkit.trials.paths import TrialPaths
from rlkit.weights.base import PushTargets, WeightTransport

PROBE_TEXT = "12+7=19. The quick brown fox jumps over the lazy dog."
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@dataclass
class LoraServed:
    server: Server
    token: str
    model_dir: Path
    config: ExperimentConfig
    paths: TrialPaths
    probe: list[int]
    loop: asyncio.AbstractEventLoop
    transport: WeightTransport  # one for the module, as one per trainer run
    timeout: float  # of each push (the requests' own timeouts)
    argv: list[str] = field(default_factory=list)  # the server's command line, where the test started it

    def targets(self) -> PushTargets:
        return loop_targets(self.loop, self.server, self.token, self.timeout)

    def ask(self, make: Any) -> Any:
        return ask_on(self.loop, self.token, make, self.timeout)


def loop_targets(loop: asyncio.AbstractEventLoop, server: Server, token: str, timeout: float) -> PushTargets:
    """A push's targets as trainer rank 0 has them: one server, requests run on the controller's `loop`."""
    return PushTargets(servers=[server], timeout=timeout,
                       submit=lambda coro: asyncio.run_coroutine_threadsafe(coro, loop),
                       open_client=lambda: server_client(token))


def ask_on(loop: asyncio.AbstractEventLoop, token: str, make: Any, timeout: float) -> Any:
    """`make(client)` run on `loop`; its own requests carry their timeouts, this wait (2 x `timeout`) is a backstop."""

    async def main() -> Any:
        async with server_client(token) as client:
            return await make(client)

    return asyncio.run_coroutine_threadsafe(main(), loop).result(timeout=2 * timeout)


@contextmanager
def background_loop() -> Iterator[asyncio.AbstractEventLoop]:
    """An event loop running in its own thread (the rollout controller's), stopped and closed on exit."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield loop
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        loop.close()


def probe_ids(model_dir: Path) -> list[int]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    return [tokenizer.bos_token_id, *tokenizer.encode(PROBE_TEXT)]


def peft_model(served: LoraServed, seed: int) -> Any:
    """The trainer's peft model with seeded noise on every B matrix (non-zero, so it changes outputs)."""
    from transformers import AutoModelForCausalLM

    model = wrap_lora(AutoModelForCausalLM.from_pretrained(served.model_dir, dtype=torch.float32),
                      served.config.actor)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.1)
    return model.eval()


def mean_abs(a: list[float], b: list[float]) -> float:
    return sum(abs(x - y) for x, y in zip(a, b, strict=True)) / len(a)
