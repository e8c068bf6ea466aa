"""Disk weight sync without vLLM: write_weights on real tiny models, the fingerprint check, and the disk delivery, the
fan-out's checks and the probe against stand-in HTTP apps (the stand-ins only mimic vLLM's and SGLang's routes; the
real vLLM run is in tests/integration/test_weight_sync.py, SGLang cannot run here)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM

from rlkit.errors import StepError
from rlkit.models.tiny import MARKER, build_tiny_model
from rlkit.servers import http as server_http
from rlkit.servers.backend import Server
from rlkit.weights import hf_export
from rlkit.weights.fingerprint import check_fingerprint, probe_logprobs, trainer_probe_logprobs
from rlkit.weights.hf_export import remove_old_versions, version_dir, write_weights
from tests.helpers.sync_helpers import sync_all, sync_server

PROBE = [1, 20, 21, 14, 26, 32, 40, 50]


# ---- check_fingerprint -----------------------------------------------------------------------------------------


def test_fingerprint_within_tolerance_returns_the_mean() -> None:
    assert check_fingerprint([-1.0, -2.0], [-1.0004, -2.0012], 1e-3, server_label="s0") == pytest.approx(8e-4)


def test_fingerprint_above_tolerance_says_why() -> None:
    with pytest.raises(StepError) as info:
        check_fingerprint([-1.0, -2.0, -3.0], [-1.0, -2.5, -3.1], 1e-3, server_label="server 2 (h:1)")
    message = str(info.value)
    assert "server 2 (h:1)" in message
    assert "0.2 on average" in message and "max 0.5" in message and "tolerance 0.001" in message
    assert "tie_word_embeddings" in message and "rlkit_reload_weights" in message and "dtype" in message


def test_fingerprint_rejects_other_probes_and_nan() -> None:
    with pytest.raises(StepError, match="not the same probe"):
        check_fingerprint([-1.0], [-1.0, -2.0], 1.0, server_label="s")
    with pytest.raises(StepError, match="not the same probe"):
        check_fingerprint([], [], 1.0, server_label="s")
    with pytest.raises(StepError, match="does not serve"):
        check_fingerprint([float("nan")], [-1.0], 1.0, server_label="s")


# ---- write_weights ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("weights")
    return {
        "untied": build_tiny_model(root / "untied", tie_word_embeddings=False),
        "tied": build_tiny_model(root / "tied", tie_word_embeddings=True),
    }


def perturbed(model_dir: Path, seed: int = 1) -> Any:
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():  # a tied weight is one parameter: it stays tied
            param.add_(torch.randn(param.shape, generator=generator) * 0.05)
    return model


def logits(model: Any) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=torch.tensor([PROBE])).logits


def keys(path: Path) -> set[str]:
    with safe_open(str(path), "pt") as f:
        return set(f.keys())


@pytest.mark.parametrize("kind", ["untied", "tied"])
def test_write_weights_is_a_complete_model(models: dict[str, Path], tmp_path: Path, kind: str) -> None:
    model = perturbed(models[kind])
    state = model.state_dict()
    assert "lm_head.weight" in state  # transformers lists the tied alias too
    out = write_weights(state, models[kind], version_dir(tmp_path / "weights", 1), None)
    assert out == tmp_path / "weights" / "version-1"
    assert sorted(p.name for p in out.iterdir()) == sorted(
        p.name for p in models[kind].iterdir() if p.name != MARKER
    )  # the same files as the source model, weights replaced, the tiny-build marker left out
    assert [p.name for p in out.parent.iterdir()] == ["version-1"]  # no temporary directory left
    written = keys(out / "model.safetensors")
    assert ("lm_head.weight" in written) == (kind == "untied")  # tied: only the canonical key, as save_pretrained
    assert "model.embed_tokens.weight" in written
    loaded = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    assert (loaded.lm_head.weight is loaded.model.embed_tokens.weight) == (kind == "tied")
    assert torch.equal(logits(loaded), logits(model))
    assert trainer_probe_logprobs(loaded, PROBE) == trainer_probe_logprobs(model, PROBE)
    assert not torch.equal(logits(loaded), logits(AutoModelForCausalLM.from_pretrained(models[kind])))


def test_write_weights_dtype_and_shards(models: dict[str, Path], tmp_path: Path) -> None:
    model = perturbed(models["tied"])
    out = write_weights(model.state_dict(), models["tied"], tmp_path / "bf16", torch.bfloat16, max_shard_bytes=100_000)
    index = json.loads((out / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 2 and shards[0] == f"model-00001-of-{len(shards):05d}.safetensors"
    assert not (out / "model.safetensors").exists()
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
    with safe_open(str(out / shards[0]), "pt") as f:
        assert all(f.get_tensor(k).dtype == torch.bfloat16 for k in f.keys())  # noqa: SIM118 (safe_open has no __iter__)
    loaded = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    assert loaded.lm_head.weight is loaded.model.embed_tokens.weight
    expected = {k: v.to(torch.bfloat16).float() for k, v in model.state_dict().items()}
    assert all(torch.equal(v, expected[k]) for k, v in loaded.state_dict().items())


def test_write_weights_refuses_a_broken_tie(models: dict[str, Path], tmp_path: Path) -> None:
    state = dict(perturbed(models["tied"]).state_dict())
    state["lm_head.weight"] = state["lm_head.weight"] + 1.0
    with pytest.raises(ValueError, match="broke the tie"):
        write_weights(state, models["tied"], tmp_path / "v", None)
    assert not (tmp_path / "v").exists()


def test_write_weights_is_atomic(models: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    state = perturbed(models["untied"]).state_dict()
    out = write_weights(state, models["untied"], tmp_path / "version-3", None)
    before = (out / "model.safetensors").read_bytes()
    with pytest.raises(FileExistsError):
        write_weights(state, models["untied"], out, None)  # a version is written once
    assert (out / "model.safetensors").read_bytes() == before

    import safetensors.torch

    def disk_full(*_args: Any, **_kwargs: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(safetensors.torch, "save_file", disk_full)
    with pytest.raises(OSError, match="No space"):
        write_weights(state, models["untied"], tmp_path / "version-4", None)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["version-3"]  # nothing half-written, no temp dir


def test_remove_old_versions(tmp_path: Path) -> None:
    for name in ["version-1", "version-2", "version-3", ".version-1.abc.tmp", ".version-4.abc.tmp", "other"]:
        (tmp_path / name).mkdir()
    removed = remove_old_versions(tmp_path, keep={2, 3})
    assert sorted(p.name for p in removed) == [".version-1.abc.tmp", "version-1"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [".version-4.abc.tmp", "other", "version-2", "version-3"]
    assert remove_old_versions(tmp_path / "missing", keep=set()) == []


# ---- sync_server and probe_logprobs against stand-in apps ----------------------------------------------------------


class StandInServer:
    """A stand-in for a vLLM (dev mode) or SGLang server's weight routes: records calls, fails where told to.

    Pure ASGI; not vLLM or SGLang code. Its answers copy the JSON shapes of vLLM 0.32 (read in its source) and of
    SGLang's http_server.py.
    """

    def __init__(self, *, fail: str | None = None, report_version: str | None = None) -> None:
        self.calls: list[str] = []
        self.bodies: dict[str, Any] = {}
        self.fail = fail
        self.version = "0"
        self.report_version = report_version
        self.paused = False

    def answer(self, path: str, query: str, body: Any) -> tuple[int, Any]:
        if path == self.fail:
            return 500, {"error": "stand-in failure"}
        if path == "/pause":
            self.paused = True
            return 200, {"status": "paused"}
        if path == "/resume":
            self.paused = False
            return 200, {"status": "resumed"}
        if path == "/collective_rpc":
            return 200, {"results": [{"rank": 0, "tied": [], "refreshed": [], "seconds": 0.01}]}
        if path == "/update_weight_version":
            self.version = body["new_version"]
            return 200, {"success": True, "new_version": self.version}
        if path == "/reset_prefix_cache":
            return 200, {"success": "reset_running_requests=true" in query}
        if path in ("/weight_info", "/get_weight_version"):
            return 200, {"weight_version": self.report_version or self.version}
        if path == "/update_weights_from_disk":
            self.version = body["weight_version"]
            return 200, {"success": True, "message": "Succeeded to update model weights.", "num_paused_requests": 0}
        if path == "/model_info":
            return 404, {"detail": "Not Found"}  # an SGLang release before /model_info carried the version
        if path == "/v1/completions":
            ids = body["prompt"]
            return 200, {"choices": [{"index": 0, "text": "x", "prompt_logprobs": [None] + [
                {str(t): {"logprob": -0.5 * i, "rank": 1, "decoded_token": "t"}} for i, t in enumerate(ids[1:], 1)
            ]}]}
        if path == "/generate":
            ids = body["input_ids"]
            return 200, {"text": "x", "meta_info": {"input_token_logprobs": [[None, ids[0], None]] + [
                [-0.5 * i, t, None] for i, t in enumerate(ids[1:], 1)
            ]}}
        return 404, {"detail": "Not Found"}

    async def __call__(self, scope: dict[str, Any], receive: Callable[..., Any], send: Callable[..., Any]) -> None:
        assert scope["type"] == "http"
        raw = b""
        while True:
            message = await receive()
            raw += message.get("body", b"")
            if not message.get("more_body"):
                break
        path, query = scope["path"], scope["query_string"].decode()
        self.calls.append(path + (f"?{query}" if query else ""))
        self.bodies[path] = json.loads(raw) if raw else None
        status, content = self.answer(path, query, self.bodies[path])
        data = json.dumps(content).encode()
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": data})


def server(backend: str = "vllm", index: int = 3) -> Server:
    return Server(index=index, address=f"10.0.0.{index}:8000", model="/m", backend=backend)


def run(app: Any, step: Callable[[httpx.AsyncClient], Any]) -> Any:
    """Run `step(client)` with a client whose requests go to the ASGI `app` (or through an httpx transport)."""
    transport = app if isinstance(app, httpx.AsyncBaseTransport) else httpx.ASGITransport(app=app)

    async def main() -> Any:
        async with httpx.AsyncClient(transport=transport) as client:
            return await step(client)

    return asyncio.run(main())


def test_sync_server_vllm_sequence(tmp_path: Path) -> None:
    app = StandInServer()
    result = run(app, lambda c: sync_server(c, server(), tmp_path / "version-7", 7, 30.0))
    assert app.calls == ["/pause?mode=keep", "/collective_rpc", "/update_weight_version",
                         "/reset_prefix_cache?reset_running_requests=true", "/resume", "/weight_info"]
    assert app.bodies["/collective_rpc"] == {"method": "rlkit_reload_weights",
                                             "kwargs": {"weights_path": str(tmp_path / "version-7")}, "timeout": 30.0}
    assert app.bodies["/update_weight_version"] == {"new_version": "7"}
    assert result.version == 7 and result.index == 3 and result.workers[0]["rank"] == 0
    assert set(result.phases) == {"pause", "reload", "set_version", "reset_cache", "resume", "check_version"}


@pytest.mark.parametrize("failing", ["/pause", "/collective_rpc", "/update_weight_version", "/reset_prefix_cache"])
def test_sync_server_resumes_after_a_failure(tmp_path: Path, failing: str) -> None:
    app = StandInServer(fail=failing)
    with pytest.raises(StepError) as info:
        run(app, lambda c: sync_server(c, server(), tmp_path, 2, 30.0))
    assert "server 3 (10.0.0.3:8000)" in str(info.value) and failing in str(info.value)
    assert app.calls[-1] == "/resume" and not app.paused
    if failing == "/collective_rpc":
        assert "--worker-extension-cls rlkit.servers.vllm.worker.WeightSyncExtension" in str(info.value)


def test_sync_server_checks_the_reported_version(tmp_path: Path) -> None:
    app = StandInServer(report_version="1")
    with pytest.raises(StepError, match=r"server 3 \(10.0.0.3:8000\): reports weight version '1' .* not 2"):
        run(app, lambda c: sync_server(c, server(), tmp_path, 2, 30.0))


def test_sync_server_timeout_names_the_wait(tmp_path: Path) -> None:
    calls: list[str] = []

    async def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request.url.path)
        if request.url.path == "/collective_rpc":
            raise httpx.ReadTimeout("timed out", request=request)
        return httpx.Response(200, json={"status": "ok"})

    with pytest.raises(StepError) as info:
        run(httpx.MockTransport(handler), lambda c: sync_server(c, server(index=5), tmp_path / "v9", 9, 2.5))
    message = str(info.value)
    assert "server 5 (10.0.0.5:8000): no answer after 2.5 s while waiting for the weight reload from" in message
    assert calls == ["/pause", "/collective_rpc", "/resume"]


@pytest.mark.parametrize("backend", ["vllm", "sglang"])
def test_probe_logprobs_stand_in(backend: str) -> None:
    app = StandInServer()
    values = run(app, lambda c: probe_logprobs(c, server(backend), PROBE))
    assert values == [-0.5 * i for i in range(1, len(PROBE))]
    if backend == "vllm":
        assert app.bodies["/v1/completions"] == {"model": "/m", "prompt": PROBE, "max_tokens": 1, "temperature": 0,
                                                 "prompt_logprobs": 0}


def test_sync_all_reports_every_failure(tmp_path: Path) -> None:
    good, bad = StandInServer(), StandInServer(fail="/collective_rpc")
    apps = {"10.0.0.1:8000": good, "10.0.0.2:8000": bad}

    async def dispatch(scope: dict[str, Any], receive: Callable[..., Any], send: Callable[..., Any]) -> None:
        host = dict(scope["headers"])[b"host"].decode()
        await apps[host](scope, receive, send)

    servers = [server(index=1), server(index=2)]
    trainer_lp = [-0.5 * i for i in range(1, len(PROBE))]
    with pytest.raises(StepError) as info:
        run(dispatch, lambda c: sync_all(c, servers, tmp_path, 5, timeout=10.0, probe_ids=PROBE,
                                         trainer_lp=trainer_lp))
    assert "failed on 1 of 2 servers" in str(info.value) and "server 2 (10.0.0.2:8000)" in str(info.value)
    assert good.calls[-1] == "/v1/completions" and bad.calls[-1] == "/resume"
    del apps["10.0.0.2:8000"]
    results = run(dispatch, lambda c: sync_all(c, servers[:1], tmp_path, 6, timeout=10.0, probe_ids=PROBE,
                                               trainer_lp=trainer_lp))
    assert results[0].fingerprint == 0.0 and "probe" in results[0].phases


def test_tied_weight_aliases(models: dict[str, Path]) -> None:
    assert hf_export.tied_weight_aliases(models["tied"]) == {"lm_head.weight": "model.embed_tokens.weight"}
    assert hf_export.tied_weight_aliases(models["untied"]) == {}


def _dying_transport(die_at: str, dying: set[str]) -> httpx.MockTransport:
    """Stand-ins for servers; those in `dying` die while answering `die_at`: that request's connection drops without
    an answer (RemoteProtocolError, as when vLLM is SIGKILLed mid-request) and every later one is refused."""
    dead: set[str] = set()
    apps: dict[str, StandInServer] = {}

    async def handler(request: httpx.Request) -> httpx.Response:
        host = request.url.netloc.decode()
        if host in dead:
            raise httpx.ConnectError("All connection attempts failed", request=request)
        if request.url.path == die_at and host in dying:
            dead.add(host)
            raise httpx.RemoteProtocolError("Server disconnected without sending a response.", request=request)
        app = apps.setdefault(host, StandInServer())
        body = json.loads(request.content) if request.content else None
        status, content = app.answer(request.url.path, request.url.query.decode(), body)
        return httpx.Response(status, json=content)

    return httpx.MockTransport(handler)


@pytest.mark.parametrize("die_at", ["/pause", "/collective_rpc", "/update_weight_version", "/reset_prefix_cache",
                                    "/resume", "/weight_info", "/v1/completions"])
def test_a_server_dying_in_any_phase_is_lost_not_a_failed_sync(tmp_path: Path, die_at: str) -> None:
    """Killed mid-push, a server is put among the unreachable ones (the trainer goes on with the rest), never reported
    as a failed or misconfigured sync (a CI run once took a reload cut off by SIGKILL for a missing worker extension
    and stopped the trainer)."""
    servers = [server(index=1), server(index=2)]
    trainer_lp = [-0.5 * i for i in range(1, len(PROBE))]
    lost: list[Server] = []
    transport = _dying_transport(die_at, {"10.0.0.2:8000"})
    results = run(transport, lambda c: sync_all(c, servers, tmp_path, 5, timeout=10.0, probe_ids=PROBE,
                                                trainer_lp=trainer_lp, unreachable=lost))
    assert [r.index for r in results] == [1] and [s.index for s in lost] == [2]
    everyone = _dying_transport(die_at, {"10.0.0.1:8000", "10.0.0.2:8000"})
    with pytest.raises(server_http.ServerUnreachable, match="weight sync to version 5: every server is unreachable"):
        run(everyone, lambda c: sync_all(c, servers, tmp_path, 5, timeout=10.0, probe_ids=PROBE,
                                         trainer_lp=trainer_lp, unreachable=[]))


def test_write_weights_replace_swaps_a_saver_checkpoint_whole(models: dict[str, Path], tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A saver checkpoint saved again (a resume from an older recover checkpoint reaches its step again) replaces the
    old one; a failed write leaves the old one untouched and no temp or aside directory."""
    first = perturbed(models["untied"], seed=1).state_dict()
    second = perturbed(models["untied"], seed=2).state_dict()
    out = write_weights(first, models["untied"], tmp_path / "step4", None)
    old = (out / "model.safetensors").read_bytes()
    assert write_weights(second, models["untied"], out, None, replace=True) == out
    new = (out / "model.safetensors").read_bytes()
    assert new != old
    assert [p.name for p in tmp_path.iterdir()] == ["step4"]  # no .step4.old, no temp directory

    import safetensors.torch

    def disk_full(*_args: Any, **_kwargs: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(safetensors.torch, "save_file", disk_full)
    with pytest.raises(OSError, match="No space"):
        write_weights(first, models["untied"], out, None, replace=True)
    assert (out / "model.safetensors").read_bytes() == new
    assert [p.name for p in tmp_path.iterdir()] == ["step4"]


def test_write_weights_takes_the_tokenizer_of_tokenizer_dir(models: dict[str, Path], tmp_path: Path) -> None:
    """A model trained with tokenizer_path set (its model directory has no tokenizer) is saved as a model on its own:
    the tokenizer it was trained with goes next to the weights (a next stage or a server loads it from there)."""
    from transformers import AutoTokenizer

    from rlkit.weights.hf_export import TOKENIZER_FILES

    bare = tmp_path / "bare"
    bare.mkdir()
    for item in models["untied"].iterdir():
        if item.is_file() and item.name not in TOKENIZER_FILES:
            (bare / item.name).write_bytes(item.read_bytes())
    state = AutoModelForCausalLM.from_pretrained(bare).state_dict()
    without = write_weights(state, bare, tmp_path / "without", None)
    assert not any((without / name).exists() for name in TOKENIZER_FILES)
    out = write_weights(state, bare, tmp_path / "with", None, tokenizer_dir=models["untied"])
    copied = sorted(name for name in TOKENIZER_FILES if (out / name).is_file())
    assert copied and copied == sorted(name for name in TOKENIZER_FILES if (models["untied"] / name).is_file())
    text = "Q: 12+30= A: 42"
    original = AutoTokenizer.from_pretrained(models["untied"])
    assert AutoTokenizer.from_pretrained(out).encode(text) == original.encode(text)
