"""Pure tests: vLLM/SGLang command lines and the TokenGuard ASGI middleware driven with fake receive/send."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from rlkit.servers.auth import TOKEN_ENV, Message, Receive, Scope, Send, TokenGuard
from rlkit.servers.health import ServerNotHealthy, find_free_port, wait_healthy
from rlkit.servers.sglang.command import sglang_command
from rlkit.servers.vllm.command import GUARD_MIDDLEWARE, WORKER_EXTENSION, render_flags, vllm_command, vllm_env

BASE = {"python": "/venv/bin/python", "model": "/m", "host": "127.0.0.1", "port": 8011}


def vllm(extra: dict[str, object], **kw: Any) -> list[str]:
    args: dict[str, Any] = {**BASE, "served_model_name": None, "tensor_parallel_size": 1, **kw}
    return vllm_command(extra=extra, **args)


def sglang(extra: dict[str, object], **kw: Any) -> list[str]:
    args: dict[str, Any] = {**BASE, "served_model_name": None, "tensor_parallel_size": 1, "key_file": "/t/k.yaml", **kw}
    return sglang_command(extra=extra, **args)


# ---- vLLM command line ---------------------------------------------------------------------------------------------


def test_vllm_base_command() -> None:
    assert vllm({}, served_model_name="policy", tensor_parallel_size=2) == [
        "/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server",
        "--model", "/m", "--host", "127.0.0.1", "--port", "8011", "--tensor-parallel-size", "2",
        "--served-model-name", "policy",
        "--middleware", GUARD_MIDDLEWARE,
        "--worker-extension-cls", WORKER_EXTENSION,
    ]  # fmt: skip
    assert WORKER_EXTENSION == "rlkit.servers.vllm.worker.WeightSyncExtension"


def test_vllm_scalars_and_underscores() -> None:
    tail = vllm({"max_model_len": 256, "gpu-memory-utilization": 0.5, "dtype": "bfloat16"})[-6:]
    assert tail == ["--max-model-len", "256", "--gpu-memory-utilization", "0.5", "--dtype", "bfloat16"]


def test_vllm_booleans() -> None:
    cmd = vllm({"enforce_eager": True, "disable_log_stats": False, "enable_prefix_caching": False, "seed": None})
    assert "--enforce-eager" in cmd
    assert "--no-enable-prefix-caching" in cmd  # default None ("auto", on): leaving it out would not turn it off
    assert not any("log-stats" in a for a in cmd)  # store_true flag without a --no- form: False is left out
    assert "--seed" not in cmd
    assert "--no-enforce-eager" in vllm({"enforce_eager": False})


def test_vllm_lists_and_dicts() -> None:
    cmd = vllm(
        {
            "cudagraph_capture_sizes": [1, 2, 4],
            "allowed_origins": ["http://a"],
            "compilation_config": {"mode": 0},
            "lora_modules": [],
        }
    )
    i = cmd.index("--cudagraph-capture-sizes")
    assert cmd[i + 1 : i + 4] == ["1", "2", "4"]
    assert cmd[cmd.index("--allowed-origins") + 1] == '["http://a"]'
    assert json.loads(cmd[cmd.index("--compilation-config") + 1]) == {"mode": 0}
    assert "--lora-modules" not in cmd


def test_vllm_guard_is_the_last_middleware() -> None:
    cmd = vllm({"middleware": ["pkg.Log", "pkg.Other"]})
    values = [cmd[i + 1] for i, a in enumerate(cmd) if a == "--middleware"]
    assert values == ["pkg.Log", "pkg.Other", GUARD_MIDDLEWARE]  # last added is outermost in Starlette
    assert [cmd[i + 1] for i, a in enumerate(cmd) if a == "--middleware"] == values
    single = vllm({"middleware": GUARD_MIDDLEWARE})
    assert single.count("--middleware") == 1


@pytest.mark.parametrize(
    "key", ["api_key", "port", "model", "tensor-parallel-size", "served_model_name", "worker_extension_cls"]
)
def test_vllm_reserved_extras(key: str) -> None:
    with pytest.raises(ValueError):
        vllm({key: "x"})


@pytest.mark.parametrize("key", ["--max-model-len", "max model len", "", "a=b"])
def test_bad_option_names(key: str) -> None:
    with pytest.raises(ValueError):
        vllm({key: 1})


def test_same_option_twice_and_bad_types() -> None:
    with pytest.raises(ValueError):
        render_flags({"max_model_len": 1, "max-model-len": 2})
    with pytest.raises(TypeError):
        render_flags({"x": object()})
    with pytest.raises(ValueError):
        vllm({}, tensor_parallel_size=0)


def test_vllm_env() -> None:
    assert vllm_env("s3cret") == {"VLLM_SERVER_DEV_MODE": "1", TOKEN_ENV: "s3cret"}
    with pytest.raises(ValueError):
        vllm_env("")


def test_token_never_on_vllm_argv() -> None:
    assert not any("s3cret" in a for a in vllm({"max_model_len": 256}))


# ---- SGLang command line -------------------------------------------------------------------------------------------


def test_sglang_command() -> None:
    cmd = sglang(
        {
            "mem_fraction_static": 0.7,
            "enable_torch_compile": True,
            "disable_radix_cache": False,
            "cuda_graph_bs": [1, 2],
        },
        served_model_name="policy",
        tensor_parallel_size=4,
    )
    assert cmd[:13] == [
        "/venv/bin/python", "-m", "sglang.launch_server",
        "--model-path", "/m", "--host", "127.0.0.1", "--port", "8011", "--tp-size", "4", "--config", "/t/k.yaml",
    ]  # fmt: skip
    assert cmd[13:] == [
        "--served-model-name", "policy",
        "--mem-fraction-static", "0.7", "--enable-torch-compile", "--cuda-graph-bs", "1", "2",
    ]  # fmt: skip
    assert "--middleware" not in cmd


@pytest.mark.parametrize("key", ["api_key", "admin-api-key", "tp_size", "model_path", "config", "grpc_port"])
def test_sglang_reserved_extras(key: str) -> None:
    with pytest.raises(ValueError):
        sglang({key: "x"})


# ---- TokenGuard ----------------------------------------------------------------------------------------------------


class FakeApp:
    def __init__(self) -> None:
        self.calls: list[Scope] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.calls.append(scope)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})


def drive(guard: TokenGuard, scope: Scope) -> list[Message]:
    sent: list[Message] = []

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Message) -> None:
        sent.append(message)

    asyncio.run(guard(scope, receive, send))
    return sent


def http(path: str, auth: bytes | None = None, method: str = "POST") -> dict[str, Any]:
    headers = [(b"host", b"x"), (b"content-type", b"application/json")]
    if auth is not None:
        headers.append((b"authorization", auth))
    return {"type": "http", "method": method, "path": path, "headers": headers}


def status(sent: list[Message]) -> int:
    return int(sent[0]["status"])


@pytest.fixture
def app() -> FakeApp:
    return FakeApp()


@pytest.fixture
def guard(app: FakeApp, monkeypatch: pytest.MonkeyPatch) -> TokenGuard:
    monkeypatch.setenv(TOKEN_ENV, "s3cret-token")
    return TokenGuard(app)


def test_guard_401_without_header(guard: TokenGuard, app: FakeApp) -> None:
    sent = drive(guard, http("/collective_rpc"))
    assert status(sent) == 401
    assert json.loads(sent[1]["body"]) == {"error": "missing or wrong bearer token"}
    assert (b"content-type", b"application/json") in sent[0]["headers"]
    assert app.calls == []


@pytest.mark.parametrize(
    "auth", [b"Bearer wrong", b"Bearer s3cret-toke", b"Bearer s3cret-token-x", b"Basic s3cret-token", b"s3cret-token"]
)
def test_guard_401_with_wrong_token(guard: TokenGuard, app: FakeApp, auth: bytes) -> None:
    assert status(drive(guard, http("/pause", auth))) == 401
    assert app.calls == []


def test_guard_passes_right_token(guard: TokenGuard, app: FakeApp) -> None:
    for path in ("/collective_rpc", "/v1/completions", "/update_weights", "/"):
        assert status(drive(guard, http(path, b"Bearer s3cret-token"))) == 200
    assert status(drive(guard, http("/pause", b"bearer s3cret-token"))) == 200  # the scheme is case-insensitive
    assert len(app.calls) == 5


def test_guard_two_authorization_headers_refused(guard: TokenGuard, app: FakeApp) -> None:
    scope = http("/pause", b"Bearer s3cret-token")
    scope["headers"].append((b"authorization", b"Bearer other"))
    assert status(drive(guard, scope)) == 401


def test_guard_health_open_only_exactly(guard: TokenGuard, app: FakeApp) -> None:
    assert status(drive(guard, http("/health", method="GET"))) == 200
    assert status(drive(guard, http("/health/", method="GET"))) == 401
    assert status(drive(guard, http("/healthz", method="GET"))) == 401
    assert status(drive(guard, http("/health_generate", method="GET"))) == 401


def test_guard_lifespan_passes(guard: TokenGuard, app: FakeApp) -> None:
    drive(guard, {"type": "lifespan"})
    assert app.calls == [{"type": "lifespan"}]


def test_guard_websocket(guard: TokenGuard, app: FakeApp) -> None:
    sent = drive(guard, {"type": "websocket", "path": "/v1/realtime", "headers": []})
    assert sent == [{"type": "websocket.close", "code": 1008, "reason": ""}]
    assert app.calls == []
    drive(guard, {"type": "websocket", "path": "/v1/realtime", "headers": [(b"authorization", b"Bearer s3cret-token")]})
    assert len(app.calls) == 1


@pytest.mark.parametrize("value", [None, ""])
def test_guard_fails_closed_without_env(
    value: str | None, app: FakeApp, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    if value is None:
        monkeypatch.delenv(TOKEN_ENV, raising=False)
    else:
        monkeypatch.setenv(TOKEN_ENV, value)
    with caplog.at_level(logging.WARNING, logger="rlkit.servers.auth"):
        guard = TokenGuard(app)
    assert len(caplog.records) == 1
    assert caplog.records[0].levelno == logging.ERROR  # vLLM's API server drops WARNING from non-vllm loggers
    assert "fail closed" in caplog.records[0].getMessage()
    assert status(drive(guard, http("/collective_rpc", b"Bearer "))) == 401
    assert status(drive(guard, http("/collective_rpc", b"Bearer"))) == 401
    assert status(drive(guard, http("/v1/completions"))) == 401
    assert status(drive(guard, http("/health", method="GET"))) == 200
    assert len(app.calls) == 1


def test_guard_never_logs_the_token(
    app: FakeApp, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv(TOKEN_ENV, "s3cret-token")
    with caplog.at_level(logging.DEBUG):
        guard = TokenGuard(app)
        drive(guard, http("/pause", b"Bearer wrong"))
        drive(guard, http("/pause", b"Bearer s3cret-token"))
    assert "s3cret-token" not in caplog.text


# ---- health ---------------------------------------------------------------------------------------------------------


def test_find_free_port_is_bindable() -> None:
    port = find_free_port("127.0.0.1")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))


@pytest.fixture
def health_server() -> Iterator[tuple[str, list[int]]]:
    """A local HTTP server whose /health answers 503 twice, then 200; yields its URL and the statuses sent."""
    sent: list[int] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            code = 200 if self.path == "/health" and len(sent) >= 2 else 503
            sent.append(code)
            self.send_response(code)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/", sent
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_wait_healthy_polls_until_200(health_server: tuple[str, list[int]]) -> None:
    url, sent = health_server
    wait_healthy(url, 20.0, process=None)
    assert sent == [503, 503, 200]


def test_wait_healthy_timeout_names_url_and_timeout() -> None:
    url = f"http://127.0.0.1:{find_free_port()}"
    start = time.monotonic()
    with pytest.raises(ServerNotHealthy) as info:
        wait_healthy(url, 1.5, process=None)
    assert time.monotonic() - start < 10
    assert f"{url}/health" in str(info.value)
    assert "1.5 s" in str(info.value)


def test_wait_healthy_fails_fast_when_the_process_exits() -> None:
    url = f"http://127.0.0.1:{find_free_port()}"
    process = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    try:
        start = time.monotonic()
        with pytest.raises(ServerNotHealthy, match="exited with code 3"):
            wait_healthy(url, 120.0, process=process)
        assert time.monotonic() - start < 30
    finally:
        if process.poll() is None:
            process.kill()
        process.wait()
