"""The login-node side stays light: config, launch, jobs and status never pull in torch, vLLM, transformers or the
trainer (rlkit.trainer), and config never imports rlkit.trainer at all."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO

HEAVY = ("torch", "vllm", "transformers", "sglang", "safetensors", "xxhash")
REPORT = f"""
heavy = {{m.split(".")[0] for m in sys.modules}} & set({HEAVY!r})
trainer = {{m for m in sys.modules if m == "rlkit.trainer" or m.startswith("rlkit.trainer.")}}
print("loaded:", " ".join(sorted(heavy | trainer)))
"""
PROGRAM = f"""
import pkgutil, sys
import rlkit.config, rlkit.launch, rlkit.jobs
for package in (rlkit.config, rlkit.launch, rlkit.jobs):
    for module in pkgutil.iter_modules(package.__path__, package.__name__ + "."):
        if module.name != "rlkit.jobs.run":  # the in-job dispatcher: imports the step, by design
            __import__(module.name)
import rlkit.cli.main, rlkit.cli.status, rlkit.trials.stage_runs, rlkit.cli.status_stages
from rlkit.launch.submit import prepare
from rlkit.servers.backend import backend_for
backend_for("sglang")  # the planner and validation may ask a backend; its module stays light
for config in sys.argv[1:]:
    prepare(config, [], dry_run=True)
    print("prepared:", config)
{REPORT}"""
STATUS = f"""
import sys
import rlkit.cli.main

sys.argv = ["rlkit", "status"]
try:
    rlkit.cli.main.main()
except SystemExit as end:
    assert end.code == 0, end.code
{REPORT}"""


def test_validating_and_rendering_imports_no_heavy_package(generate_yaml: Path, grpo_yaml: Path, fake_model: Path,
                                                           tmp_path: Path) -> None:
    """Every module of config, launch and jobs is imported; a generate, a grpo and an sft config, and the rw, dpo and
    ppo demo configs (their model and data made under tmp_path), are loaded, validated (the grpo reward function
    included), planned and rendered."""
    from rlkit.tasks.digits import write_dataset
    from rlkit.tasks.digits_pairs import write_pair_splits

    demo = tmp_path / "demo"
    demo.mkdir()
    (demo / "tiny-model").symlink_to(fake_model)
    write_pair_splits(demo, train=16, held_out=16)
    write_dataset(demo / "digits.jsonl", count=16)
    demos = [str(REPO / "configs" / f"{kind}-cpu-demo.yaml") for kind in ("rw", "dpo", "ppo")]
    sft_data = grpo_yaml.with_name("sft.jsonl")
    sft_data.write_text("".join(json.dumps({"prompt": f"{i}+1=", "response": str(i + 1)}) + "\n" for i in range(8)))
    sft_yaml = grpo_yaml.with_name("sft.yaml")
    sft_yaml.write_text(re.sub(r"train_dataset: \{path: [^,]+,", f"train_dataset: {{path: {sft_data}, type: sft, "
                                                                  "max_length: 64,", grpo_yaml.read_text())
                        .replace("type: grpo", "type: sft")
                        .replace("allocation_mode: vllm:d1+fsdp:d2", "allocation_mode: fsdp:d2"))
    env = {**os.environ, "RLKIT_DEMO_DIR": str(demo), "RLKIT_FILEROOT": str(tmp_path / "fileroot")}
    out = subprocess.run([sys.executable, "-c", PROGRAM, str(generate_yaml), str(grpo_yaml), str(sft_yaml), *demos],
                         capture_output=True, text=True, check=True, env=env)
    assert _loaded(out.stdout) == "", f"imported on the login-node path: {out.stdout}"
    assert out.stdout.count("prepared:") == 6, out.stdout


def _loaded(stdout: str) -> str:
    """What the report line names (heavy packages and rlkit.trainer modules imported)."""
    reports = [line for line in stdout.splitlines() if line.startswith("loaded:")]
    assert len(reports) == 1, stdout
    return reports[0].removeprefix("loaded:").strip()


def test_rlkit_status_imports_no_heavy_package_nor_the_trainer(rlkit_home: Path) -> None:
    """`rlkit status` (no trials recorded here) runs through the real CLI entry point."""
    out = subprocess.run([sys.executable, "-c", STATUS], capture_output=True, text=True, check=True,
                         env={**os.environ, "RLKIT_HOME": str(rlkit_home)})
    assert _loaded(out.stdout) == "", f"imported by rlkit status: {out.stdout}"
