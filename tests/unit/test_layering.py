"""The login-node side stays light: config, launch and status never pull in torch, vLLM or transformers."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HEAVY = ("torch", "vllm", "transformers", "sglang", "safetensors", "xxhash")
PROGRAM = f"""
import sys
import rlkit.cli, rlkit.config.load, rlkit.config.validate, rlkit.launch.submit, rlkit.launch.render, rlkit.status
from rlkit.launch.submit import prepare
from rlkit.servers.backend import backend_for
backend_for("sglang")  # the planner and validation may ask a backend; its module stays light
for config in sys.argv[1:]:
    prepare(config, [], dry_run=True)
print(" ".join(sorted({{m.split(".")[0] for m in sys.modules}} & set({HEAVY!r}))))
"""


def test_validating_and_rendering_imports_no_heavy_package(generate_yaml: Path, grpo_yaml: Path) -> None:
    """A generate and a grpo config are loaded, validated (reward function included), planned and rendered."""
    out = subprocess.run([sys.executable, "-c", PROGRAM, str(generate_yaml), str(grpo_yaml)], capture_output=True,
                         text=True, check=True)
    assert out.stdout.strip() == "", f"imported on the login-node path: {out.stdout}"
