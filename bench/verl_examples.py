"""How many of verl's own example scripts `rlkit migrate` takes as they stand (the figure docs/status.md quotes).

Every `examples/**/*.sh` of a verl checkout that runs `verl.trainer.main_ppo`, through the real `python -m rlkit
migrate SCRIPT` with only a site's overrides (the tiny model, verl-format GSM8K Parquet rows, a private fileroot, no
container): exit 0 counts. Prints the count and writes, per script, the exit code, the last of stderr (why a
refused one was refused) and any key still "unknown". Not part of the suite: it needs a verl checkout (none here in
CI) and runs ~2 s a script.

Run: `git --git-dir=VERL.git archive HEAD examples | tar -x -C /tmp/verl` (or a checkout), then
`PYTHONPATH=. python bench/verl_examples.py /tmp/verl/examples verl-examples.json`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def site(root: Path) -> list[str]:
    """The site's overrides, its model and data built under `root` (the tiny model saying Qwen2.5's 32k positions,
    as verl's examples' lengths ask)."""
    sys.path.insert(0, str(REPO))
    from rlkit.models.tiny import build_tiny_model
    from tests.helpers.verl_rows import verl_gsm8k_parquet

    build_tiny_model(root / "model")
    config = json.loads((root / "model" / "config.json").read_text())
    (root / "model" / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 32768}))
    verl_gsm8k_parquet(root / "train.parquet")
    return [f"actor.path={root / 'model'}", f"train_dataset.path={root / 'train.parquet'}",
            f"valid_dataset.path={root / 'train.parquet'}", f"cluster.fileroot={root / 'fileroot'}",
            "launcher.slurm.container_type=none"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("examples", type=Path, help="a verl checkout's examples/ directory")
    parser.add_argument("out", type=Path, help="where to write the per-script results (JSON)")
    args = parser.parse_args()
    scripts = sorted(p for p in args.examples.rglob("*.sh") if "verl.trainer.main_ppo" in p.read_text(errors="replace"))
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        overrides = site(Path(tmp))
        for script in scripts:
            done = subprocess.run([sys.executable, "-m", "rlkit", "migrate", str(script), *overrides],
                                  capture_output=True, text=True, check=False,
                                  env={**os.environ, "PYTHONPATH": str(REPO)})
            results[str(script.relative_to(args.examples))] = {
                "rc": done.returncode, "stderr": done.stderr[-3000:],
                "unknown": [line for line in done.stdout.splitlines() if "-> unknown" in line]}
    args.out.write_text(json.dumps(results, indent=1) + "\n")
    print(f"{sum(r['rc'] == 0 for r in results.values())} of {len(results)} migrate (exit 0); per script: {args.out}")


if __name__ == "__main__":
    main()
