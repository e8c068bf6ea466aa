"""LoRA on SGLang servers without SGLang: the launch options, the adapter routes (a stand-in answering with SGLang
0.5.23's shapes, read in entrypoints/http_server.py, managers/io_struct.py and tokenizer_control_mixin.py), the
`/generate` bodies naming the adapter (`lora_path`), and the adapter transport on SGLang servers (no cache flush: each
load gets a fresh cache key). The real server runs in tests/integration/test_sglang_lora.py."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from rlkit.config.load import load_config
from rlkit.errors import StepError
from rlkit.servers.backend import SamplingParams
from rlkit.servers.sglang import lora
from rlkit.servers.sglang.backend import BACKEND
from rlkit.servers.sglang.lora import LORA_MODULES as SGLANG_LORA_MODULES
from rlkit.trials.paths import TrialPaths
from rlkit.weights.lora_disk import LoraDiskTransport
from tests.unit.servers.test_lora_servers import adapter_tensors
from tests.unit.weights.test_weights_disk import StandInServer, run, server
from tests.unit.weights.test_weights_fanout import loop, stand_ins, targets_on  # noqa: F401 - loop is a fixture


class SglangLoraStandIn(StandInServer):
    """StandInServer plus SGLang's LoRA routes and /v1/models, with the adapters it holds."""

    def __init__(self, adapters: tuple[str, ...] = (), **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.adapters = dict.fromkeys(adapters, "/old")

    def answer(self, path: str, query: str, body: Any) -> tuple[int, Any]:
        if path == self.fail:
            return 500, {"error": "stand-in failure"}
        if path == "/load_lora_adapter":
            if not Path(body["lora_path"]).is_dir():
                return 400, {"success": False, "error_message": "no such directory", "loaded_adapters": None}
            self.adapters[body["lora_name"]] = body["lora_path"]
            return 200, {"success": True, "error_message": None, "loaded_adapters": dict(self.adapters)}
        if path == "/unload_lora_adapter":
            if self.adapters.pop(body["lora_name"], None) is None:
                return 400, {"success": False, "error_message": f"LoRA with name {body['lora_name']} does not "
                             "exist. Loaded LoRAs: dict_keys([])", "loaded_adapters": None}
            return 200, {"success": True, "error_message": None, "loaded_adapters": dict(self.adapters)}
        if path == "/v1/models":
            return 200, {"object": "list", "data": [{"id": "/m", "root": "/m", "parent": None}] + [
                {"id": name, "root": where, "parent": "/m"} for name, where in self.adapters.items()]}
        if path == "/flush_cache":
            return 400, "Cache not flushed. Please check if there are running or waiting requests."
        if path == "/generate" and body.get("lora_path") not in (None, *self.adapters):
            return 400, {"error": {"message": f"The following requested LoRA adapters are not loaded: "
                                              f"{body['lora_path']}"}}
        return super().answer(path, query, body)


def sglang_lora_config(grpo_yaml: Path, *more: str) -> Any:
    return load_config(grpo_yaml, ["allocation_mode=sglang:d1+fsdp:d2", "actor.use_lora=true",
                                   "actor.target_modules=[q_proj,v_proj]", *more])


def launch_argv(config: Any, tmp_path: Path) -> list[str]:
    return BACKEND.launch(config, python="py", model="/m", host="0.0.0.0", port=1, tp=1, token="t",
                          secret_dir=tmp_path, index=0).argv


def test_launch_enables_lora_with_rank_and_modules_only_with_use_lora(
        grpo_yaml: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lora, "_has_cuda", lambda: True)
    plain = launch_argv(load_config(grpo_yaml, ["allocation_mode=sglang:d1+fsdp:d2"]), tmp_path)
    assert not any(arg.startswith("--") and "lora" in arg for arg in plain)
    argv = launch_argv(sglang_lora_config(grpo_yaml, "actor.lora_rank=24"), tmp_path)
    at = argv.index("--enable-lora")
    assert argv[at:] == ["--enable-lora", "--max-lora-rank", "24", "--lora-target-modules", "q_proj", "v_proj"]
    every = launch_argv(sglang_lora_config(grpo_yaml, "actor.target_modules=[all-linear]"), tmp_path)
    assert every[every.index("--lora-target-modules") + 1:] == ["all"]  # SGLang's spelling of peft's all-linear
    monkeypatch.setattr(lora, "_has_cuda", lambda: False)  # no CUDA: the torch kernels, not csgmv's Triton ones
    cpu = launch_argv(sglang_lora_config(grpo_yaml), tmp_path)
    assert cpu[-2:] == ["--lora-backend", "torch_native"]
    chosen = launch_argv(sglang_lora_config(grpo_yaml, "sglang.extra_args={lora_backend: triton}"), tmp_path)
    assert chosen.count("--lora-backend") == 1 and chosen[chosen.index("--lora-backend") + 1] == "triton"


def test_the_module_list_is_sglangs_dense_choices() -> None:
    # SGLang 0.5.23's --lora-target-modules choices (utils/common.py SUPPORTED_LORA_TARGET_MODULES), dense models'
    assert set(SGLANG_LORA_MODULES) - {"all-linear"} == {"q_proj", "k_proj", "v_proj", "o_proj", "qkv_proj",
                                                         "gate_proj", "up_proj", "down_proj", "gate_up_proj"}


def test_generate_bodies_name_the_adapter_in_lora_path() -> None:
    app = SglangLoraStandIn(adapters=("exp-v1",))
    s = server("sglang")
    run(app, lambda c: BACKEND.probe_logprobs(c, s, [1, 2, 3], 5.0))
    assert "lora_path" not in app.bodies["/generate"]  # the base model: no adapter named
    s.adapter = "exp-v1"
    assert run(app, lambda c: BACKEND.probe_logprobs(c, s, [1, 2, 3], 5.0)) == [-0.5, -1.0]
    assert app.bodies["/generate"] == {"input_ids": [1, 2, 3], "return_logprob": True, "logprob_start_len": 0,
                                       "sampling_params": {"temperature": 0, "max_new_tokens": 1},
                                       "lora_path": "exp-v1"}

    bodies: list[dict[str, Any]] = []

    def generate(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        bodies.append(body)
        n = len(body["input_ids"]) if isinstance(body["input_ids"][0], list) else body["sampling_params"]["n"]
        result = {"text": "x", "output_ids": [7], "meta_info": {"output_token_logprobs": [[-0.1, 7, None]],
                                                                "finish_reason": {"type": "length"}}}
        return httpx.Response(200, json=[result] * n)

    run(httpx.MockTransport(generate), lambda c: BACKEND.complete(c, s, [1], SamplingParams(n=2)))
    run(httpx.MockTransport(generate), lambda c: BACKEND.complete(c, s, [1], SamplingParams(n=2, seed=5)))
    # One name (a string) covers every sample of n and every prompt of the seeded batch (io_struct
    # GenerateReqInput._normalize_lora_paths).
    assert [b["lora_path"] for b in bodies] == ["exp-v1", "exp-v1"]
    assert bodies[1]["input_ids"] == [[1], [1]]


def test_adapter_routes(tmp_path: Path) -> None:
    app = SglangLoraStandIn(adapters=("exp-v1",))
    s = server("sglang")
    report = run(app, lambda c: BACKEND.load_adapter(c, s, "exp-v2", tmp_path, 2, 5.0))
    assert app.bodies["/load_lora_adapter"] == {"lora_name": "exp-v2", "lora_path": str(tmp_path)}
    assert app.bodies["/update_weight_version"] == {"new_version": "2", "abort_all_requests": False}
    assert app.version == "2" and set(report["seconds"]) == {"load_adapter", "set_version"}
    assert report["loaded"] == ["exp-v1", "exp-v2"]
    assert run(app, lambda c: BACKEND.list_adapters(c, s, 5.0)) == ["exp-v1", "exp-v2"]  # not the base model
    assert run(app, lambda c: BACKEND.unload_adapter(c, s, "exp-v1", 5.0)) is True
    assert run(app, lambda c: BACKEND.unload_adapter(c, s, "exp-v1", 5.0)) is False  # "does not exist"
    with pytest.raises(StepError, match="--enable-lora") as info:  # SGLang's 400 {"success": false}, with the fix
        run(app, lambda c: BACKEND.load_adapter(c, s, "exp-v3", tmp_path / "gone", 3, 5.0))
    assert "HTTP 400" in str(info.value) and "server 3" in str(info.value)
    app.fail = "/unload_lora_adapter"
    with pytest.raises(StepError, match="HTTP 500"):  # any other failure of an unload is not "not loaded"
        run(app, lambda c: BACKEND.unload_adapter(c, s, "exp-v2", 5.0))


def test_adapter_transport_on_sglang_servers_never_flushes_the_cache(
        loop: asyncio.AbstractEventLoop, grpo_yaml: Path, tmp_path: Path) -> None:  # noqa: F811 - the fixture
    config = sglang_lora_config(grpo_yaml)
    assert not BACKEND.adapter_cache_by_name
    transport = LoraDiskTransport(config, TrialPaths(tmp_path / "trial"))
    apps = {"10.0.0.1:8000": SglangLoraStandIn(adapters=("test-exp-v2", "someone-elses"))}
    servers = [server("sglang", index=1)]
    outcomes = transport.push(iter([adapter_tensors()]), 3, targets_on(loop, servers, stand_ins(apps)))
    assert outcomes is not None and outcomes[0].sync is not None, outcomes
    # The first push of a trainer (where vLLM's cache is reset) leaves SGLang's alone: /flush_cache would refuse
    # while requests run, and the new load's lora_id keys its KV anyway.
    assert apps["10.0.0.1:8000"].calls == ["/v1/models", "/load_lora_adapter", "/update_weight_version",
                                           "/unload_lora_adapter"]
    assert set(outcomes[0].sync.phases) == {"load_adapter", "set_version", "unload_old"}
    assert servers[0].adapter == "test-exp-v3" and set(apps["10.0.0.1:8000"].adapters) == {"test-exp-v3",
                                                                                             "someone-elses"}
