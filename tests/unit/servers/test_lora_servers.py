"""LoRA on the server side without vLLM: the launch options, the adapter routes (stand-ins answering with vLLM 0.32's
shapes, read in entrypoints/serve/lora/api_router.py and openai/models/serving.py), requests naming the adapter, and
the adapter transport (rlkit.weights.lora_disk) with its new-name-per-version rule. The real server runs in
tests/integration/test_lora_vllm.py."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from rlkit.config.load import load_config
from rlkit.servers.backend import SamplingParams
from rlkit.servers.pool import ServerPool
from rlkit.servers.vllm.backend import BACKEND
from rlkit.servers.vllm.flags import VLLM_FLAGS
from rlkit.trials.paths import TrialPaths
from rlkit.weights.base import transport_for_actor
from rlkit.weights.hf_export import version_dir
from rlkit.weights.lora_disk import LoraDiskTransport, adapter_name
from tests.unit.weights.test_weights_disk import StandInServer, run, server
from tests.unit.weights.test_weights_fanout import loop, stand_ins, targets_on  # noqa: F401 - loop is a fixture

LORA_ROUTES = ("/v1/load_lora_adapter", "/v1/unload_lora_adapter", "/v1/models")


class LoraStandIn(StandInServer):
    """StandInServer plus vLLM's runtime LoRA routes and /v1/models, with the adapters it holds."""

    def __init__(self, adapters: tuple[str, ...] = (), **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.adapters = dict.fromkeys(adapters, "/old")

    def answer(self, path: str, query: str, body: Any) -> tuple[int, Any]:
        if path == self.fail:
            return 500, {"error": {"message": "stand-in failure", "code": 500}}
        if path == "/v1/load_lora_adapter":
            if body["lora_name"] in self.adapters:
                return 400, {"error": {"message": "has already been loaded", "code": 400}}
            self.adapters[body["lora_name"]] = body["lora_path"]
            return 200, f"Success: LoRA adapter '{body['lora_name']}' added successfully."
        if path == "/v1/unload_lora_adapter":
            if self.adapters.pop(body["lora_name"], None) is None:
                return 404, {"error": {"message": "cannot be found", "code": 404}}
            return 200, "Success"
        if path == "/v1/models":
            return 200, {"object": "list", "data": [{"id": "/m", "root": "/m", "parent": None}] + [
                {"id": name, "root": where, "parent": "/m"} for name, where in self.adapters.items()]}
        if path == "/v1/completions" and body.get("model") not in ("/m", *self.adapters):
            return 404, {"error": {"message": f"The model `{body.get('model')}` does not exist.", "code": 404}}
        return super().answer(path, query, body)


def lora_yaml_config(grpo_yaml: Path, *more: str) -> Any:
    return load_config(grpo_yaml, ["actor.use_lora=true", "actor.target_modules=[q_proj,v_proj]", *more])


def argv_env(config: Any, tmp_path: Path) -> tuple[list[str], dict[str, str]]:
    launch = BACKEND.launch(config, python="py", model="/m", host="0.0.0.0", port=1, tp=1, token="t",
                            secret_dir=tmp_path, index=0)
    return launch.argv, launch.env


def test_launch_enables_runtime_lora_only_with_use_lora(grpo_yaml: Path, tmp_path: Path) -> None:
    plain, plain_env = argv_env(load_config(grpo_yaml, []), tmp_path)
    assert "--enable-lora" not in plain and "VLLM_ALLOW_RUNTIME_LORA_UPDATING" not in plain_env
    argv, env = argv_env(lora_yaml_config(grpo_yaml, "actor.lora_rank=24"), tmp_path)
    assert env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True" and env["RLKIT_SERVER_TOKEN"] == "t"
    at = argv.index("--enable-lora")
    assert argv[at:] == ["--enable-lora", "--max-lora-rank", "32", "--max-loras", "2", "--max-cpu-loras", "2"]
    assert {a[2:].replace("-", "_") for a in argv[at:] if a.startswith("--")} <= VLLM_FLAGS  # vLLM 0.32's options
    more, _ = argv_env(lora_yaml_config(grpo_yaml, "vllm.extra_args={max_loras: 4}"), tmp_path)
    assert more.count("--max-loras") == 1 and more[more.index("--max-loras") + 1] == "4"
    assert more[more.index("--max-cpu-loras") + 1] == "4"  # vLLM refuses a CPU cache smaller than max_loras


def test_requests_name_the_adapter_once_set() -> None:
    app = LoraStandIn(adapters=("exp-v1",))
    s = server()
    assert s.request_model == "/m"
    run(app, lambda c: BACKEND.probe_logprobs(c, s, [1, 2, 3], 5.0))
    assert app.bodies["/v1/completions"]["model"] == "/m"
    s.adapter = "exp-v1"
    assert run(app, lambda c: BACKEND.probe_logprobs(c, s, [1, 2, 3], 5.0)) == [-0.5, -1.0]
    assert app.bodies["/v1/completions"]["model"] == "exp-v1"

    seen: list[str] = []

    def complete(request: httpx.Request) -> httpx.Response:
        seen.append(json.loads(request.content)["model"])
        return httpx.Response(200, json={"choices": []})

    run(httpx.MockTransport(complete), lambda c: BACKEND.complete(c, s, [1], SamplingParams()))
    assert seen == ["exp-v1"]


def test_adapter_routes(tmp_path: Path) -> None:
    app = LoraStandIn(adapters=("exp-v1",))
    s = server()
    report = run(app, lambda c: BACKEND.load_adapter(c, s, "exp-v2", tmp_path, 2, 5.0))
    assert app.bodies["/v1/load_lora_adapter"] == {"lora_name": "exp-v2", "lora_path": str(tmp_path)}
    assert app.version == "2" and set(report["seconds"]) == {"load_adapter", "set_version"}
    assert run(app, lambda c: BACKEND.list_adapters(c, s, 5.0)) == ["exp-v1", "exp-v2"]  # not the base model
    assert run(app, lambda c: BACKEND.unload_adapter(c, s, "exp-v1", 5.0)) is True
    assert run(app, lambda c: BACKEND.unload_adapter(c, s, "exp-v1", 5.0)) is False  # 404: not loaded
    from rlkit.errors import StepError

    with pytest.raises(StepError, match="--enable-lora") as info:  # a name that is loaded: vLLM's 400, with the fix
        run(app, lambda c: BACKEND.load_adapter(c, s, "exp-v2", tmp_path, 3, 5.0))
    assert "HTTP 400" in str(info.value) and "server 3" in str(info.value)


def adapter_tensors(scale: float = 1.0) -> dict[str, torch.Tensor]:
    prefix = "base_model.model.model.layers.0.self_attn"
    return {f"{prefix}.{m}.lora_{ab}.weight": torch.full((4, 4), scale) for m in ("q_proj", "v_proj") for ab in "AB"}


def test_adapter_transport_loads_a_new_name_and_unloads_the_runs_older_ones(
        loop: asyncio.AbstractEventLoop, grpo_yaml: Path, tmp_path: Path) -> None:  # noqa: F811 - the fixture
    config = lora_yaml_config(grpo_yaml)
    assert transport_for_actor(config.actor) is LoraDiskTransport and LoraDiskTransport.adapters_only
    paths = TrialPaths(tmp_path / "trial")
    transport = LoraDiskTransport(config, paths)
    assert transport.push(iter([None]), 3, None) is None  # another rank: only the gathers
    old = adapter_name(config, 2)
    assert old == "test-exp-v2"
    apps = {"10.0.0.1:8000": LoraStandIn(adapters=(old, "someone-elses")), "10.0.0.2:8000": LoraStandIn()}
    servers = [server(index=1), server(index=2)]
    for s in servers:
        s.adapter = old
    began: list[int] = []
    outcomes = transport.push(iter([adapter_tensors()]), 3, targets_on(loop, servers, stand_ins(apps), began))
    assert outcomes is not None and [o.sync.index for o in outcomes if o.sync] == [1, 2] and began == [1]
    written = version_dir(paths.weights, 3)
    assert sorted(p.name for p in written.iterdir()) == ["adapter_config.json", "adapter_model.safetensors"]
    assert transport.sent_bytes == sum(p.stat().st_size for p in written.iterdir())  # one copy, whatever the servers
    assert json.loads((written / "adapter_config.json").read_text())["target_modules"] == ["q_proj", "v_proj"]
    assert [s.adapter for s in servers] == ["test-exp-v3", "test-exp-v3"]
    assert set(apps["10.0.0.1:8000"].adapters) == {"test-exp-v3", "someone-elses"}  # only the run's own go
    assert apps["10.0.0.2:8000"].adapters == {"test-exp-v3": str(written.absolute())}
    assert apps["10.0.0.1:8000"].version == "3" and "/pause" not in apps["10.0.0.1:8000"].calls
    # the trainer's first push resets the prefix cache (a restarted trainer may reuse a name and path)
    assert set(outcomes[0].sync.phases) == {"load_adapter", "set_version", "reset_cache", "unload_old"}
    apps["10.0.0.1:8000"].calls.clear()

    # A server whose load fails keeps serving (and being asked for) the adapter it had; it is named.
    apps["10.0.0.2:8000"].fail = "/v1/load_lora_adapter"
    outcomes = transport.push(iter([adapter_tensors(2.0)]), 4, targets_on(loop, servers, stand_ins(apps)))
    assert outcomes is not None and outcomes[0].sync is not None and outcomes[1].failure is not None
    assert "server 2" in outcomes[1].failure and "load_lora_adapter" in outcomes[1].failure
    assert [s.adapter for s in servers] == ["test-exp-v4", "test-exp-v3"]
    assert "/reset_prefix_cache" not in apps["10.0.0.1:8000"].calls  # later pushes use new names: nothing stale

    # A restarted trainer (a new transport) pushing a version a server still holds: unloaded, reloaded, cache reset.
    again = LoraDiskTransport(config, paths)
    again.start()
    apps["10.0.0.2:8000"].fail = None
    outcomes = again.push(iter([adapter_tensors(3.0)]), 4, targets_on(loop, servers, stand_ins(apps)))
    assert outcomes is not None and all(o.sync is not None for o in outcomes)
    assert apps["10.0.0.1:8000"].calls[-5:] == ["/v1/models", "/v1/unload_lora_adapter", "/v1/load_lora_adapter",
                                                "/update_weight_version", "/reset_prefix_cache"]
    assert [s.adapter for s in servers] == ["test-exp-v4", "test-exp-v4"]
    assert set(apps["10.0.0.2:8000"].adapters) == {"test-exp-v4"}

    with pytest.raises(ValueError, match="LoRA adapter only"):  # full weights by mistake (mis-wired buckets)
        transport.push(iter([{"model.embed_tokens.weight": torch.zeros(2)}]), 5,
                       targets_on(loop, servers, stand_ins(apps)))


def test_the_pool_follows_a_servers_new_adapter() -> None:
    async def main() -> list[str | None]:
        pool = ServerPool([server(index=1)], "t", timeout=1.0, retries=0, max_in_flight=1)
        try:
            kept = pool.servers[0]
            kept.in_flight = 1
            moved = server(index=1)
            moved.adapter = "exp-v7"
            pool.set_servers([moved])
            assert pool.servers[0] is kept and kept.in_flight == 1  # counters kept
            return [s.adapter for s in pool.servers]
        finally:
            await pool.aclose()

    assert asyncio.run(main()) == ["exp-v7"]
