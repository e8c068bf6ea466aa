"""Weight sync through a shared filesystem: the trainer writes a complete HF model directory per version, every
inference server reloads it in place, and a logprob fingerprint proves that the server really serves those weights.

A version number reported by a server says only that a version was set, not which weights produce its logits (see
the tied-embedding note in `rlkit.servers.vllm_worker`). `probe_logprobs` + `trainer_probe_logprobs` +
`check_fingerprint` compare the server's logprobs of a fixed token sequence with the trainer's own.

torch, safetensors and transformers are imported inside the functions that need them (trainer side only).
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import re
import shutil
import tempfile
import time
from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import httpx

from rlkit.errors import StepError
from rlkit.fsutil import fsync_dir, fsync_path, replace_dir
from rlkit.models.tiny import MARKER as TINY_MARKER
from rlkit.rollout.client import SERVER_GONE_ERRORS, Server
from rlkit.servers.vllm import WORKER_EXTENSION

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)

WEIGHTS_NAME = "model.safetensors"
WEIGHTS_INDEX_NAME = "model.safetensors.index.json"
MAX_SHARD_BYTES = 2 * 1024**3
RELOAD_METHOD = "rlkit_reload_weights"  # rlkit.servers.vllm_worker.WeightSyncExtension.rlkit_reload_weights
# Files of the source model directory that are not copied: its weights (replaced) and rlkit's tiny-build marker,
# which describes the weights of an untouched build.
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".gguf", ".h5", ".msgpack")
_SKIP_FILES = frozenset({WEIGHTS_INDEX_NAME, "pytorch_model.bin.index.json", TINY_MARKER})
_VERSION_DIR = re.compile(r"^version-(\d+)$")
_VERSION_TMP = re.compile(r"^\.version-(\d+)\..*\.tmp$")

T = TypeVar("T")


# ---- writing a version -------------------------------------------------------------------------------------------


def version_dir(weights_root: Path, version: int) -> Path:
    """The directory of weight version `version` under `weights_root`: `weights_root/version-<N>`."""
    if version < 0:
        raise ValueError(f"weight versions are >= 0, got {version}")
    return Path(weights_root) / f"version-{version}"


def tied_weight_aliases(model_dir: Path) -> dict[str, str]:
    """`{alias: canonical}` state-dict keys that the model in `model_dir` ties (empty if it does not tie).

    Read from the config (`tie_word_embeddings`, of its text config for composite models) and the transformers class
    named in `architectures` (`_tied_weights_keys`, e.g. `{"lm_head.weight": "model.embed_tokens.weight"}`); when
    transformers does not know the model, `lm_head.weight` is taken as tied to `model.embed_tokens.weight`.
    """
    import transformers

    try:
        config = transformers.AutoConfig.from_pretrained(model_dir)
        ties = bool(getattr(config.get_text_config(), "tie_word_embeddings", False))
        architectures = list(getattr(config, "architectures", None) or ())
    except (ValueError, KeyError, OSError):  # a model type this transformers does not know: read the file
        raw = json.loads((Path(model_dir) / "config.json").read_text())
        text = raw.get("text_config") or {}
        ties = bool(raw.get("tie_word_embeddings", text.get("tie_word_embeddings", False)))
        architectures = list(raw.get("architectures") or ())
    if not ties:
        return {}
    for arch in architectures:
        keys = getattr(getattr(transformers, arch, None), "_tied_weights_keys", None)
        if isinstance(keys, Mapping) and keys:
            return {str(k): str(v) for k, v in keys.items()}
    return {"lm_head.weight": "model.embed_tokens.weight"}


def _resolve_ties(tensors: dict[str, torch.Tensor], aliases: Mapping[str, str]) -> dict[str, torch.Tensor]:
    """Drop tied alias keys (as `save_pretrained` does), after checking that they still equal their canonical key."""
    import torch

    out = dict(tensors)
    for alias, canonical in aliases.items():
        if alias not in out:
            continue
        if canonical not in out:  # only the alias was given: store it under the canonical name
            out[canonical] = out.pop(alias)
            continue
        a, c = out[alias], out[canonical]
        same = a.shape == c.shape and (a is c or torch.equal(a, c.to(a.dtype)))
        if not same:
            raise ValueError(
                f"the config ties {alias} to {canonical} but the state dict holds different values for them: "
                "the training broke the tie. Untie in the config (tie_word_embeddings=false) or keep them tied"
            )
        del out[alias]
    return out


def _prepare(state_dict: Mapping[str, Any], dtype: torch.dtype | None) -> dict[str, torch.Tensor]:
    """CPU, contiguous, floating tensors cast to `dtype`; keys that are views of one tensor stay one tensor."""
    import torch

    prepared: dict[str, torch.Tensor] = {}
    done: dict[tuple[Any, ...], torch.Tensor] = {}
    for name, value in state_dict.items():
        tensor = value.full_tensor() if hasattr(value, "full_tensor") else value  # a DTensor
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"state dict entry {name!r} is a {type(value).__name__}, not a tensor")
        tensor = tensor.detach()
        view = (tensor.device, tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape),
                tuple(tensor.stride()), tensor.dtype)
        if view not in done:
            out = tensor.to("cpu")
            if dtype is not None and out.is_floating_point():
                out = out.to(dtype)
            done[view] = out.contiguous()
        prepared[name] = done[view]
    return prepared


def _own_storage(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A copy for every tensor whose storage another one uses too: safetensors refuses shared storage."""
    seen: set[int] = set()
    out: dict[str, torch.Tensor] = {}
    for name, tensor in tensors.items():
        ptr = tensor.untyped_storage().data_ptr()
        out[name] = tensor.clone() if ptr in seen else tensor
        seen.add(out[name].untyped_storage().data_ptr())
    return out


def _shards(tensors: dict[str, torch.Tensor], max_shard_bytes: int) -> list[dict[str, torch.Tensor]]:
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, tensor in tensors.items():
        if shards[-1] and size + tensor.nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = tensor
        size += tensor.nbytes
    return shards


def write_weights(
    state_dict: Mapping[str, torch.Tensor],
    model_dir: Path,
    out_dir: Path,
    dtype: torch.dtype | None,
    *,
    max_shard_bytes: int = MAX_SHARD_BYTES,
    replace: bool = False,
) -> Path:
    """Write `state_dict` as a complete HF model directory `out_dir` and return it.

    - weights: `model.safetensors`, or `model-0000i-of-0000n.safetensors` shards plus `model.safetensors.index.json`
      when they exceed `max_shard_bytes`; floating tensors cast to `dtype` (None: as given)
    - every other top-level file of `model_dir` (config.json, generation_config.json, tokenizer and chat template
      files, custom code) is copied; config.json's `dtype` is set to `dtype` when one is given
    - tied models: a transformers state dict holds both `model.embed_tokens.weight` and `lm_head.weight` (the same
      tensor). Only the canonical key is written, as `save_pretrained` does; transformers and vLLM tie on load.
      Different values under a tied pair raise `ValueError`.

    Written into a temporary directory beside `out_dir`, every file fsynced, then renamed to `out_dir` in one step: a
    server never sees a partial version. `out_dir` must not exist yet (`FileExistsError`): a version is immutable.
    With `replace` (saver checkpoints, written again after a resume) an existing `out_dir` is replaced by
    rename-aside, rename-in, delete (`rlkit.fsutil.replace_dir`).
    """
    from safetensors.torch import save_file

    model_dir, out_dir = Path(model_dir), Path(out_dir)
    if out_dir.exists() and not replace:
        raise FileExistsError(f"{out_dir} already exists: weight versions are written once (remove it first)")
    if not (model_dir / "config.json").is_file():
        raise FileNotFoundError(f"{model_dir} has no config.json: give the directory of the model being trained")
    tensors = _own_storage(_resolve_ties(_prepare(state_dict, dtype), tied_weight_aliases(model_dir)))
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", suffix=".tmp", dir=out_dir.parent))
    try:
        for item in sorted(model_dir.iterdir()):
            if not item.is_file() or item.name.startswith(".") or item.name in _SKIP_FILES:
                continue
            if item.name.endswith(_WEIGHT_SUFFIXES):
                continue
            shutil.copyfile(item, tmp / item.name)
        if dtype is not None:
            config_path = tmp / "config.json"
            config = json.loads(config_path.read_text())
            dtype_name = str(dtype).removeprefix("torch.")
            config["dtype"] = dtype_name
            if "torch_dtype" in config:
                config["torch_dtype"] = dtype_name
            config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        shards = _shards(tensors, max_shard_bytes)
        if len(shards) == 1:
            save_file(shards[0], str(tmp / WEIGHTS_NAME), metadata={"format": "pt"})
        else:
            weight_map: dict[str, str] = {}
            for i, shard in enumerate(shards, start=1):
                name = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
                save_file(shard, str(tmp / name), metadata={"format": "pt"})
                weight_map.update(dict.fromkeys(shard, name))
            index = {"metadata": {"total_size": sum(t.nbytes for t in tensors.values())}, "weight_map": weight_map}
            (tmp / WEIGHTS_INDEX_NAME).write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
        for item in tmp.iterdir():
            item.chmod(0o644)  # servers may run as another user on the shared filesystem
            fsync_path(item)
        tmp.chmod(0o755)
        fsync_dir(tmp)
        if replace:
            replace_dir(tmp, out_dir)
        else:
            os.rename(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    fsync_dir(out_dir.parent)
    return out_dir


def remove_old_versions(weights_root: Path, keep: set[int]) -> list[Path]:
    """Delete the `version-<N>` directories under `weights_root` whose N is not in `keep`; return what was removed.

    Also removes temporary directories left by interrupted writes of versions older than every kept one (never those
    of newer versions: they may be being written now).
    """
    root = Path(weights_root)
    if not root.is_dir():
        return []
    newest_kept = max(keep, default=-1)
    removed: list[Path] = []
    for entry in sorted(root.iterdir()):
        if not entry.is_dir() or entry.is_symlink():
            continue
        done, tmp = _VERSION_DIR.match(entry.name), _VERSION_TMP.match(entry.name)
        if (done and int(done.group(1)) not in keep) or (tmp and int(tmp.group(1)) < newest_kept):
            shutil.rmtree(entry)
            removed.append(entry)
    return removed


# ---- syncing servers -----------------------------------------------------------------------------------------------


def server_label(server: Server) -> str:
    return f"server {server.index} ({server.address})"


def weight_sync_client(token: str, *, max_connections: int = 32) -> httpx.AsyncClient:
    """An HTTP client for the functions below: bearer token on every request, no proxy from the environment.

    Timeouts are given per request by each function.
    """
    return httpx.AsyncClient(
        headers={"Authorization": f"Bearer {token}"},
        trust_env=False,
        limits=httpx.Limits(max_connections=max_connections),
    )


class ServerUnreachable(StepError):
    """The server did not accept the connection or dropped it: its process is gone (or going)."""


async def _call(
    client: httpx.AsyncClient,
    server: Server,
    method: str,
    path: str,
    what: str,
    timeout: float,
    *,
    allow_404: bool = False,
    **kwargs: Any,
) -> httpx.Response:
    """One HTTP request; StepError naming `what`, the server and the timeout if it times out, fails or is not 2xx."""
    try:
        response = await client.request(method, f"{server.url}{path}", timeout=httpx.Timeout(timeout), **kwargs)
    except httpx.TimeoutException as exc:
        raise StepError(f"{server_label(server)}: no answer after {timeout:g} s while waiting for {what} "
                        f"({method} {path}): {type(exc).__name__}") from exc
    except SERVER_GONE_ERRORS as exc:
        raise ServerUnreachable(f"{server_label(server)}: {what} ({method} {path}) failed, the server is "
                                f"unreachable: {type(exc).__name__}: {exc}") from exc
    except httpx.HTTPError as exc:
        raise StepError(f"{server_label(server)}: {what} ({method} {path}) failed: "
                        f"{type(exc).__name__}: {exc}") from exc
    if response.status_code >= 400 and not (allow_404 and response.status_code == 404):
        raise StepError(f"{server_label(server)}: {what} ({method} {path}) answered HTTP {response.status_code}: "
                        f"{response.text[:1000]}")
    return response


def _json(response: httpx.Response, server: Server, what: str) -> Any:
    try:
        return response.json()
    except ValueError as exc:
        raise StepError(f"{server_label(server)}: {what} did not answer JSON: {response.text[:300]!r}") from exc


async def _timed(phases: dict[str, float], name: str, step: Awaitable[T]) -> T:
    start = time.monotonic()
    try:
        return await step
    finally:
        phases[name] = time.monotonic() - start


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
        response = await _call(client, server, "GET", "/model_info", "the model info", timeout, allow_404=True)
        if response.status_code != 404 and "weight_version" in (body := _json(response, server, "the model info")):
            return None if body["weight_version"] is None else str(body["weight_version"])
        response = await _call(client, server, "GET", "/get_weight_version", "the weight version", timeout)
    else:
        response = await _call(client, server, "GET", "/weight_info", "the weight version", timeout)
    version = _json(response, server, "the weight version").get("weight_version")
    return None if version is None else str(version)


async def _sync_vllm(
    client: httpx.AsyncClient, server: Server, weights_dir: Path, version: int, timeout: float, result: ServerSync
) -> None:
    phases = result.phases

    async def resume() -> None:
        await _timed(phases, "resume", _call(client, server, "POST", "/resume", "resume", timeout))

    try:
        await _timed(phases, "pause", _call(client, server, "POST", "/pause", "pause (mode keep)", timeout,
                                            params={"mode": "keep"}))
        body = {"method": RELOAD_METHOD, "kwargs": {"weights_path": str(weights_dir)}, "timeout": timeout}
        try:
            response = await _timed(phases, "reload", _call(client, server, "POST", "/collective_rpc",
                                                            f"the weight reload from {weights_dir}", timeout,
                                                            json=body))
        except ServerUnreachable:
            raise  # the process is gone mid-reload: the caller counts it as lost, not as misconfigured
        except StepError as exc:
            raise StepError(f"{exc}\n  fix: the server must run with --worker-extension-cls {WORKER_EXTENSION} "
                            "(rlkit.servers.vllm.vllm_command adds it) and be able to read the directory") from exc
        workers = _json(response, server, "the weight reload").get("results")
        if not workers or not all(isinstance(w, dict) for w in workers):
            raise StepError(f"{server_label(server)}: {RELOAD_METHOD} answered {workers!r}, not one report per "
                            f"worker; is --worker-extension-cls {WORKER_EXTENSION} set?")
        result.workers = workers
        await _timed(phases, "set_version", _call(client, server, "POST", "/update_weight_version",
                                                  "the weight version update", timeout,
                                                  json={"new_version": str(version)}))
        # Preempts the paused requests too (they recompute their KV with the new weights on resume); without it the
        # reset refuses while any request holds blocks.
        reset = await _timed(phases, "reset_cache", _call(client, server, "POST", "/reset_prefix_cache",
                                                          "the prefix cache reset", timeout,
                                                          params={"reset_running_requests": "true"}))
        if _json(reset, server, "the prefix cache reset").get("success") is not True:
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
    response = await _timed(result.phases, "reload", _call(client, server, "POST", "/update_weights_from_disk",
                                                           f"the weight reload from {weights_dir}", timeout,
                                                           json=body))
    answer = _json(response, server, "the weight reload")
    if answer.get("success") is not True:
        raise StepError(f"{server_label(server)}: /update_weights_from_disk answered {answer!r}")


async def resume_server(client: httpx.AsyncClient, server: Server, timeout: float) -> None:
    """Un-pause a vLLM server (a trainer that died during a weight push may have left it paused); idempotent."""
    if server.backend == "vllm":
        await _call(client, server, "POST", "/resume", "resume", timeout)


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
    reported = await _timed(result.phases, "check_version", read_weight_version(client, server, timeout))
    if reported != str(version):
        raise StepError(f"{server_label(server)}: reports weight version {reported!r} after the sync, not {version}")
    result.seconds = time.monotonic() - start
    return result


# ---- fingerprint -------------------------------------------------------------------------------------------------


async def probe_logprobs(
    client: httpx.AsyncClient, server: Server, probe_ids: list[int], *, timeout: float = 60.0
) -> list[float]:
    """The server's logprob of each probe token given the tokens before it: `len(probe_ids) - 1` values.

    The first token has no logprob (nothing precedes it).

    vLLM: `POST /v1/completions {"prompt": probe_ids, "max_tokens": 1, "temperature": 0, "prompt_logprobs": 0}`;
    `choices[0].prompt_logprobs` is `[null, {"<id>": {"logprob", "rank", "decoded_token"}}, ...]`, raw logprobs of the
    model's logits (no sampling settings applied). SGLang (not run here): `POST /generate` with `input_ids`,
    `return_logprob` and `logprob_start_len=0`; `meta_info.input_token_logprobs` is `[[logprob|null, id, text], ...]`.
    """
    if len(probe_ids) < 2:
        raise ValueError("a probe needs at least 2 tokens (the first one has no logprob)")
    what = "probe logprobs"
    if server.backend == "sglang":
        body: dict[str, Any] = {"input_ids": probe_ids, "sampling_params": {"temperature": 0, "max_new_tokens": 1},
                                "return_logprob": True, "logprob_start_len": 0}
        response = await _call(client, server, "POST", "/generate", what, timeout, json=body)
        entries = _json(response, server, what)["meta_info"]["input_token_logprobs"]
        values = [entry[0] for entry in entries[1:]]
        ids = [entry[1] for entry in entries[1:]]
    else:
        body = {"model": server.model, "prompt": probe_ids, "max_tokens": 1, "temperature": 0, "prompt_logprobs": 0}
        response = await _call(client, server, "POST", "/v1/completions", what, timeout, json=body)
        entries = _json(response, server, what)["choices"][0]["prompt_logprobs"]
        ids = list(probe_ids[1:])
        values = [(entry or {}).get(str(token), {}).get("logprob")
                  for entry, token in zip(entries[1:], ids, strict=False)]
    if len(values) != len(probe_ids) - 1 or ids != list(probe_ids[1:]) or any(v is None for v in values):
        raise StepError(f"{server_label(server)}: {what} do not cover the {len(probe_ids) - 1} probe tokens: "
                        f"{response.text[:500]}")
    return [float(v) for v in values]


def trainer_probe_logprobs(model: Any, probe_ids: list[int]) -> list[float]:
    """The same numbers as `probe_logprobs` from a transformers causal LM: log_softmax in float32, token i given 0..i-1.

    Runs in eval mode (no dropout) under `torch.no_grad()` and restores the training mode. An FSDP-sharded model
    must be called on every rank, as any forward.
    """
    import torch

    if len(probe_ids) < 2:
        raise ValueError("a probe needs at least 2 tokens (the first one has no logprob)")
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([probe_ids], device=device)).logits[0].float()
    finally:
        model.train(was_training)
    logprobs = torch.log_softmax(logits[:-1], dim=-1)
    targets = torch.tensor(probe_ids[1:], device=logits.device)
    return logprobs.gather(1, targets[:, None])[:, 0].cpu().tolist()


def check_fingerprint(server_lp: list[float], trainer_lp: list[float], tolerance: float, *, server_label: str) -> float:
    """Mean |server - trainer| over the probe tokens; StepError (mean, max, tolerance, likely causes) above `tolerance`.

    Float32 serving of the same weights matches to ~1e-5; bfloat16 serving differs by ~1e-2, so the tolerance must
    fit the server's `--dtype`.
    """
    if len(server_lp) != len(trainer_lp) or not server_lp:
        raise StepError(f"{server_label}: {len(server_lp)} server logprobs against {len(trainer_lp)} trainer "
                        "logprobs: not the same probe")
    diffs = [abs(s - t) for s, t in zip(server_lp, trainer_lp, strict=True)]
    mean, worst = sum(diffs) / len(diffs), max(diffs)
    if math.isnan(mean) or mean > tolerance:
        raise StepError(
            f"{server_label} does not serve the trainer's weights: its probe logprobs differ from the trainer's by "
            f"{mean:.3g} on average (max {worst:.3g}) over {len(diffs)} tokens; tolerance {tolerance:g}.\n"
            "  fix: if the model ties its embeddings (tie_word_embeddings), the server must reload through rlkit's "
            f"worker extension ({RELOAD_METHOD}, --worker-extension-cls {WORKER_EXTENSION}): vLLM 0.32's plain "
            "reload_weights leaves the output head stale. A small difference everywhere is a dtype gap (server "
            "--dtype bfloat16 against a float32 trainer): raise the tolerance or serve in the trainer's dtype. Also "
            "check that the server reloaded the directory the trainer wrote (weights_dir) and that both use the same "
            "tokenizer."
        )
    return mean


# ---- all servers -------------------------------------------------------------------------------------------------


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


__all__ = [
    "MAX_SHARD_BYTES",
    "ServerSync",
    "ServerUnreachable",
    "check_fingerprint",
    "probe_logprobs",
    "read_weight_version",
    "remove_old_versions",
    "resume_server",
    "server_label",
    "sync_all",
    "sync_server",
    "tied_weight_aliases",
    "trainer_probe_logprobs",
    "version_dir",
    "weight_sync_client",
    "write_weights",
]
