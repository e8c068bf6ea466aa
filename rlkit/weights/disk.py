"""Weight sync through a shared filesystem: every inference server reloads the version directory the trainer wrote
(rlkit.weights.hf_export) in place, reports the version, and (given a probe) proves by its logprobs that it serves
those weights (rlkit.weights.fingerprint).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from rlkit.errors import StepError
from rlkit.rollout.client import Server
from rlkit.servers.vllm.command import WORKER_EXTENSION
from rlkit.weights.fingerprint import RELOAD_METHOD, check_fingerprint, probe_logprobs
from rlkit.weights.server_http import ServerUnreachable, answer_json, call, server_label, timed

logger = logging.getLogger(__name__)

@dataclass
class ServerSync:
    """What syncing one server took: total and per-phase seconds, and the fingerprint difference when probed."""

    index: int
    address: str
    version: int
    seconds: float = 0.0
    phases: dict[str, float] = field(default_factory=dict)
    workers: list[dict[str, Any]] = field(default_factory=list)  # vLLM: what rlkit_reload_weights reported per rank
    fingerprint: float | None = None  # mean |server - trainer| logprob over the probe tokens


async def read_weight_version(client: httpx.AsyncClient, server: Server, timeout: float) -> str | None:
    """The weight version the server reports: vLLM `GET /weight_info`; SGLang `GET /model_info` (older releases:
    `GET /get_weight_version`)."""
    if server.backend == "sglang":
        response = await call(client, server, "GET", "/model_info", "the model info", timeout, allow_404=True)
        body = answer_json(response, server, "the model info") if response.status_code != 404 else {}
        if "weight_version" in body:
            return None if body["weight_version"] is None else str(body["weight_version"])
        response = await call(client, server, "GET", "/get_weight_version", "the weight version", timeout)
    else:
        response = await call(client, server, "GET", "/weight_info", "the weight version", timeout)
    version = answer_json(response, server, "the weight version").get("weight_version")
    return None if version is None else str(version)


async def _sync_vllm(
    client: httpx.AsyncClient, server: Server, weights_dir: Path, version: int, timeout: float, result: ServerSync
) -> None:
    phases = result.phases

    async def resume() -> None:
        await timed(phases, "resume", call(client, server, "POST", "/resume", "resume", timeout))

    try:
        await timed(phases, "pause", call(client, server, "POST", "/pause", "pause (mode keep)", timeout,
                                            params={"mode": "keep"}))
        body = {"method": RELOAD_METHOD, "kwargs": {"weights_path": str(weights_dir)}, "timeout": timeout}
        try:
            response = await timed(phases, "reload", call(client, server, "POST", "/collective_rpc",
                                                            f"the weight reload from {weights_dir}", timeout,
                                                            json=body))
        except ServerUnreachable:
            raise  # the process is gone mid-reload: the caller counts it as lost, not as misconfigured
        except StepError as exc:
            raise StepError(f"{exc}\n  fix: the server must run with --worker-extension-cls {WORKER_EXTENSION} "
                            "(rlkit.servers.vllm.command.vllm_command adds it) and be able to read the "
                            "directory") from exc
        workers = answer_json(response, server, "the weight reload").get("results")
        if not workers or not all(isinstance(w, dict) for w in workers):
            raise StepError(f"{server_label(server)}: {RELOAD_METHOD} answered {workers!r}, not one report per "
                            f"worker; is --worker-extension-cls {WORKER_EXTENSION} set?")
        result.workers = workers
        await timed(phases, "set_version", call(client, server, "POST", "/update_weight_version",
                                                  "the weight version update", timeout,
                                                  json={"new_version": str(version)}))
        # Preempts the paused requests too (they recompute their KV with the new weights on resume); without it the
        # reset refuses while any request holds blocks.
        reset = await timed(phases, "reset_cache", call(client, server, "POST", "/reset_prefix_cache",
                                                          "the prefix cache reset", timeout,
                                                          params={"reset_running_requests": "true"}))
        if answer_json(reset, server, "the prefix cache reset").get("success") is not True:
            raise StepError(f"{server_label(server)}: the prefix cache reset answered {reset.text[:300]}: KV computed "
                            "with the old weights could be reused")
    except BaseException as failure:
        if isinstance(failure, ServerUnreachable):
            raise  # nothing to resume: the process is gone
        try:
            await resume()  # always, also when the pause itself failed (it may have paused without answering)
        except StepError as resume_error:
            if isinstance(failure, StepError):
                raise StepError(f"{failure}\n  and the resume after it failed too (the server may stay paused): "
                                f"{resume_error}") from failure
            logger.error("%s (after %s: %s)", resume_error, type(failure).__name__, failure)
        raise
    await resume()


async def _sync_sglang(
    client: httpx.AsyncClient, server: Server, weights_dir: Path, version: int, timeout: float, result: ServerSync
) -> None:
    body = {"model_path": str(weights_dir), "weight_version": str(version), "flush_cache": True,
            "abort_all_requests": False}
    response = await timed(result.phases, "reload", call(client, server, "POST", "/update_weights_from_disk",
                                                           f"the weight reload from {weights_dir}", timeout,
                                                           json=body))
    answer = answer_json(response, server, "the weight reload")
    if answer.get("success") is not True:
        raise StepError(f"{server_label(server)}: /update_weights_from_disk answered {answer!r}")


async def resume_server(client: httpx.AsyncClient, server: Server, timeout: float) -> None:
    """Un-pause a vLLM server (a trainer that died during a weight push may have left it paused); idempotent."""
    if server.backend == "vllm":
        await call(client, server, "POST", "/resume", "resume", timeout)


async def sync_server(
    client: httpx.AsyncClient, server: Server, weights_dir: Path, version: int, timeout: float
) -> ServerSync:
    """Make `server` serve the weights in `weights_dir` as version `version`; StepError if it does not say so after.

    `client` must carry the server token (`weight_sync_client`). Each request waits at most `timeout` seconds.

    vLLM: `POST /pause?mode=keep` (requests in flight are frozen, not dropped) -> `POST /collective_rpc
    rlkit_reload_weights` (rlkit's worker extension: vLLM's in-place reload plus the tied-embedding repair) ->
    `POST /update_weight_version` -> `POST /reset_prefix_cache?reset_running_requests=true` -> `POST /resume`, the
    resume also after a failure -> `GET /weight_info` must report `version`.

    SGLang (written from SGLang's source, `UpdateWeightFromDiskReqInput` and `http_server.py`; NOT run: SGLang has no
    CPU build, so only a stand-in app tests it): `POST /update_weights_from_disk {"model_path", "weight_version",
    "flush_cache": true, "abort_all_requests": false}` (SGLang holds new requests and waits for running ones itself)
    -> `GET /model_info` (`weight_version`; older releases: `GET /get_weight_version`).
    """
    weights_dir = Path(weights_dir).absolute()  # the server resolves relative paths against its own cwd
    result = ServerSync(index=server.index, address=server.address, version=version)
    start = time.monotonic()
    if server.backend == "sglang":
        await _sync_sglang(client, server, weights_dir, version, timeout, result)
    elif server.backend == "vllm":
        await _sync_vllm(client, server, weights_dir, version, timeout, result)
    else:
        raise StepError(f"{server_label(server)}: no weight sync for backend {server.backend!r}")
    reported = await timed(result.phases, "check_version", read_weight_version(client, server, timeout))
    if reported != str(version):
        raise StepError(f"{server_label(server)}: reports weight version {reported!r} after the sync, not {version}")
    result.seconds = time.monotonic() - start
    return result






async def sync_all(
    client: httpx.AsyncClient,
    servers: Sequence[Server],
    weights_dir: Path,
    version: int,
    *,
    timeout: float,
    probe_ids: list[int] | None = None,
    trainer_lp: list[float] | None = None,
    tolerance: float = 1e-2,
    unreachable: list[Server] | None = None,
) -> list[ServerSync]:
    """`sync_server` on every server at once, then (given `probe_ids` and `trainer_lp`) the fingerprint of each.

    Every server is synced (and resumed) even if another fails; then one StepError lists every failure. Returns one
    `ServerSync` per server, in the order given. With an `unreachable` list, servers whose process is gone (the
    connection is refused or dropped) are put there instead of failing the sync, as long as one server is left.
    """
    if (probe_ids is None) != (trainer_lp is None):
        raise ValueError("give both probe_ids and trainer_lp, or neither")

    async def one(server: Server) -> ServerSync:
        result = await sync_server(client, server, weights_dir, version, timeout)
        if probe_ids is not None and trainer_lp is not None:
            start = time.monotonic()
            server_lp = await probe_logprobs(client, server, probe_ids, timeout=timeout)
            result.phases["probe"] = time.monotonic() - start
            result.fingerprint = check_fingerprint(server_lp, trainer_lp, tolerance, server_label=server_label(server))
        return result

    outcomes = await asyncio.gather(*(one(s) for s in servers), return_exceptions=True)
    results: list[ServerSync] = []
    failures: list[str] = []
    for server, outcome in zip(servers, outcomes, strict=True):
        if isinstance(outcome, ServerSync):
            results.append(outcome)
        elif isinstance(outcome, ServerUnreachable) and unreachable is not None:
            unreachable.append(server)
            logger.warning("%s", outcome)
        elif isinstance(outcome, StepError):
            failures.append(str(outcome))
        else:
            if not isinstance(outcome, Exception):
                raise outcome  # KeyboardInterrupt, CancelledError: do not swallow
            failures.append(f"{server_label(server)}: {type(outcome).__name__}: {outcome}")
    if unreachable and not results and not failures:
        raise ServerUnreachable(f"weight sync to version {version}: every server is unreachable "
                                f"({', '.join(server_label(s) for s in unreachable)})")
    if failures:
        raise StepError(f"weight sync to version {version} failed on {len(failures)} of {len(servers)} servers:\n"
                        + "\n".join(f"  - {f}" for f in failures))
    return results
