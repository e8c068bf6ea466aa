"""LoRA adapters into a REAL SGLang 0.5.23 server on the CPU (the session's one SGLang server, tests/conftest.py
`sglang_server`, serving the tied model): the adapter transport (rlkit.weights.lora_disk) and the fan-out's version +
fingerprint check THROUGH the adapter (rlkit.weights.fanout), as the trainer drives them, with peft on the trainer's
side (rlkit.trainer.lora), then the adapter routes directly.

The server is started through `BACKEND.launch` of a config with `actor.use_lora` (`--enable-lora --max-lora-rank
--lora-target-modules`, and `--lora-backend torch_native` since this machine has no CUDA), with the test-only kernel
shim of tests/integration/test_sglang_backend.py and one more test-only shim (tests/sglang_cpu_pin_shim): SGLang
0.5.23's LoRA code pins host memory unconditionally, which torch refuses without an NVIDIA driver; the shim makes
pinning a no-op (no number changes).

The adapters have non-zero B matrices (peft starts B at zero, which would change nothing), so the fingerprint can only
pass if the server really computes with the adapter: its probe log-probs through the adapter must match the peft
model's to 1e-3 (float32 both sides) and differ from the base model's by far more.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import torch

from rlkit.servers.backend import SamplingParams, Server
from rlkit.servers.sglang.backend import BACKEND
from rlkit.trainer.lora import iter_adapter_buckets
from rlkit.trials.paths import TrialPaths
from rlkit.weights import fanout
from rlkit.weights.base import transport_for_actor
from rlkit.weights.fingerprint import trainer_probe_logprobs
from tests.conftest import stop_sglang_server
from tests.helpers.lora_served import LoraServed, background_loop, mean_abs, peft_model, probe_ids
from tests.helpers.sglang_helpers import LORA_RANK, RunningSglang, lora_server_config

pytestmark = [pytest.mark.sglang]

TOLERANCE = 1e-3  # float32 server and trainer
TIMEOUT = 60.0


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, sglang_server: RunningSglang) -> Iterator[LoraServed]:
    """The session's SGLang server (tests/conftest.py), given its model's own weights back from disk first: the
    contract tests of test_sglang_backend, which run on it before, leave others loaded."""
    root = tmp_path_factory.mktemp("sglang_lora")
    config, paths = lora_server_config(sglang_server.model_dir), TrialPaths(root / "trial")
    with background_loop() as loop:
        served = LoraServed(sglang_server.server, sglang_server.token, sglang_server.model_dir, config, paths,
                            probe_ids(sglang_server.model_dir), loop, transport_for_actor(config.actor)(config, paths),
                            TIMEOUT, sglang_server.argv)
        served.ask(lambda c: BACKEND.load_weights_from_disk(c, served.server, served.model_dir, 0, TIMEOUT))
        served.transport.start()
        yield served
    stop_sglang_server()  # this module is its last user


def publish(served: LoraServed, model: Any, version: int) -> fanout.Published:
    trainer_lp = trainer_probe_logprobs(model, served.probe)
    published = fanout.publish(served.transport, iter_adapter_buckets(model), version, served.targets(),
                               fanout.Probe(served.probe, trainer_lp, TOLERANCE))
    assert published is not None
    return published


def sampled_logprobs(model: Any, prompt: list[int], tokens: list[int], temperature: float) -> list[float]:
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + tokens])).logits[0].float()
    logprobs = torch.log_softmax(logits[len(prompt) - 1:-1] / temperature, dim=-1)
    return logprobs.gather(1, torch.tensor(tokens)[:, None])[:, 0].tolist()


def test_adapters_through_sglang_match_peft_and_unload(served: LoraServed) -> None:
    from transformers import AutoModelForCausalLM

    started = time.monotonic()
    argv = served.argv
    assert argv[argv.index("--max-lora-rank") + 1] == str(LORA_RANK) and "--enable-lora" in argv
    for route in ("/load_lora_adapter", "/unload_lora_adapter"):  # the api key guards the adapter routes
        refused = httpx.post(f"{served.server.url}{route}", json={"lora_name": "x", "lora_path": "/tmp"},
                             trust_env=False)
        assert refused.status_code == 401, (route, refused.text)
    base = trainer_probe_logprobs(AutoModelForCausalLM.from_pretrained(served.model_dir, dtype=torch.float32),
                                  served.probe)
    first = peft_model(served, seed=1)
    first_lp = trainer_probe_logprobs(first, served.probe)
    assert mean_abs(first_lp, base) > 50 * TOLERANCE  # the adapter changes outputs: the checks below mean something

    # The trainer's push: load under a new name, version, fingerprint through the adapter (the fan-out's check).
    [sync] = publish(served, first, version=1).synced
    assert sync.fingerprint is not None and sync.fingerprint <= TOLERANCE
    assert served.server.adapter == "sglang-lora-v1"
    assert served.ask(lambda c: BACKEND.read_version(c, served.server, TIMEOUT)) == "1"
    assert served.ask(lambda c: BACKEND.list_adapters(c, served.server, TIMEOUT)) == ["sglang-lora-v1"]
    assert "reset_cache" not in sync.phases  # SGLang keys each load's KV by a fresh id: no flush needed

    # The probe through the adapter is peft's; without it, the base model's.
    through = served.ask(lambda c: BACKEND.probe_logprobs(c, served.server, served.probe, TIMEOUT))
    plain = Server(index=0, address=served.server.address, model=served.server.model, backend="sglang")
    without = served.ask(lambda c: BACKEND.probe_logprobs(c, plain, served.probe, TIMEOUT))
    assert mean_abs(through, first_lp) <= TOLERANCE and mean_abs(without, base) <= TOLERANCE
    assert mean_abs(through, without) > 50 * TOLERANCE

    # Sampled completions through the adapter carry peft's log-probs (at the temperature, n > 1 in one request).
    prompt = served.probe[:8]
    params = SamplingParams(n=2, max_new_tokens=8, temperature=0.7)
    completions = served.ask(lambda c: BACKEND.complete(c, served.server, prompt, params))
    worst = max(mean_abs(c.logprobs, sampled_logprobs(first, prompt, c.token_ids, 0.7)) for c in completions)
    assert worst <= TOLERANCE

    # The next version goes under a new name, passes, and the old name is unloaded.
    second = peft_model(served, seed=2)
    [sync2] = publish(served, second, version=2).synced
    assert sync2.fingerprint is not None and sync2.fingerprint <= TOLERANCE
    assert served.ask(lambda c: BACKEND.list_adapters(c, served.server, TIMEOUT)) == ["sglang-lora-v2"]
    # SGLang 0.5.23 remembers every name it loaded with its path (TokenizerManager.lora_ref_cache) and loads an
    # unloaded one again when a request names it: a late request for v1 is served by v1 (the directory is still
    # there: the transport keeps the previous version), not refused as by vLLM; the next push unloads it again.
    old = Server(index=0, address=served.server.address, model=served.server.model, backend="sglang",
                 adapter="sglang-lora-v1")
    again = served.ask(lambda c: BACKEND.probe_logprobs(c, old, served.probe, TIMEOUT))
    assert mean_abs(again, first_lp) <= TOLERANCE
    assert served.ask(lambda c: BACKEND.list_adapters(c, served.server, TIMEOUT)) == ["sglang-lora-v2",
                                                                                      "sglang-lora-v1"]
    never = Server(index=0, address=served.server.address, model=served.server.model, backend="sglang",
                   adapter="sglang-lora-v9")
    with pytest.raises(httpx.HTTPStatusError) as info:  # a name never loaded is refused
        served.ask(lambda c: BACKEND.complete(c, never, prompt, SamplingParams(max_new_tokens=2)))
    assert info.value.response.status_code == 400 and "sglang-lora-v9" in info.value.response.text

    # Unloaded: listed no more, a second unload says so.
    for name in ("sglang-lora-v1", "sglang-lora-v2"):
        assert served.ask(lambda c, name=name: BACKEND.unload_adapter(c, served.server, name, TIMEOUT)) is True
    assert served.ask(lambda c: BACKEND.list_adapters(c, served.server, TIMEOUT)) == []
    assert served.ask(lambda c: BACKEND.unload_adapter(c, served.server, "sglang-lora-v2", TIMEOUT)) is False
    phases = ", ".join(f"{k} {v * 1000:.0f} ms" for k, v in sync.phases.items())
    print(f"\n[sglang lora] v1 fingerprint {sync.fingerprint:.2e}, v2 {sync2.fingerprint:.2e} (adapter vs base "
          f"{mean_abs(through, without):.3f}); sampled log-probs within {worst:.2e}; v1 phases {phases}; test "
          f"{time.monotonic() - started:.1f} s")
