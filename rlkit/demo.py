"""The CPU demo on the dev cluster: tiny model + prompts, submit the generate job, wait, show the result.

Run by scripts/demo.sh (`python -m rlkit.demo`). Uses the same `rlkit` commands a user types.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def write_prompts(path: Path, count: int = 16) -> Path:
    """A small arithmetic prompt file (the data the demo completes)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for i in range(count):
            f.write(json.dumps({"prompt": f"{i % 7}+{i % 5}=", "answer": str(i % 7 + i % 5)}) + "\n")
    return path


def rlkit(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "rlkit", *args], text=True, capture_output=True, check=False)


def main() -> int:
    from rlkit.models.tiny import build_tiny_model

    demo_dir = Path(os.environ.setdefault("RLKIT_DEMO_DIR", "/tmp/rlkit-demo"))
    trial = os.environ.setdefault("RLKIT_DEMO_TRIAL", time.strftime("run_%Y%m%d_%H%M%S"))
    build_tiny_model(demo_dir / "tiny-model")
    write_prompts(demo_dir / "prompts.jsonl")
    config = REPO / "configs" / "generate-cpu-demo.yaml"
    print(f"$ rlkit submit {config.relative_to(REPO)}", flush=True)
    submitted = rlkit("submit", str(config))
    print(submitted.stdout + submitted.stderr, end="", flush=True)
    if submitted.returncode != 0:
        return submitted.returncode
    name = f"demo-generate/{trial}"
    deadline = time.monotonic() + 1200
    state = "PENDING"
    while time.monotonic() < deadline:
        rows = json.loads(rlkit("status", "--json").stdout)
        state = next(r["state"] for r in rows if r["name"] == name)
        if state not in ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING"):
            break
        time.sleep(5)
    print(f"$ rlkit status {name}", flush=True)
    shown = rlkit("status", name)
    print(shown.stdout + shown.stderr, end="")
    trial_dir = Path(next(r["trial_dir"] for r in json.loads(rlkit("status", "--json").stdout) if r["name"] == name))
    completions = trial_dir / "completions.jsonl"
    if state != "COMPLETED" or not completions.is_file():
        print(f"demo: the job ended in state {state}; see `rlkit logs {name}` and `rlkit logs {name} --step server-0`")
        return 1
    lines = completions.read_text().splitlines()
    print(f"demo: {len(lines)} prompts completed in {completions}; the first two:")
    for line in lines[:2]:
        record = json.loads(line)
        for c in record["completions"]:
            print(f"  {record['prompt']!r} -> {c['text']!r} (server {record['server']}, "
                  f"{len(c['token_ids'])} tokens, mean logprob {sum(c['logprobs']) / len(c['logprobs']):.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
