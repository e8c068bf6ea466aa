"""The rw and dpo example configs (configs/pending/, not yet submittable) load, and pass the checks of their
job type once a site's paths point at real files."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlkit.config.load import load_config
from rlkit.config.problems import Problems
from rlkit.config.validate_pairs import validate_dpo, validate_rw
from rlkit.tasks.digits_pairs import write_pair_splits

from ..conftest import CONFIGS

PENDING = sorted((CONFIGS / "pending").glob("*.yaml"))
CHECKS = {"rw": validate_rw, "dpo": validate_dpo}


def test_each_pending_job_type_has_a_cpu_demo_and_a_gpu_example() -> None:
    names = {path.name for path in PENDING}
    assert names == {f"{job}{kind}.yaml" for job in CHECKS for kind in ("", "-cpu-demo")}


@pytest.mark.parametrize("path", PENDING, ids=lambda p: p.stem)
def test_pending_config_validates(path: Path, tmp_path: Path, fake_model: Path) -> None:
    (fake_model / "tokenizer.json").write_text("{}")
    train, _ = write_pair_splits(tmp_path)
    config = load_config(path, [f"actor.path={fake_model}", f"train_dataset.path={train}"])
    problems = Problems()
    CHECKS[config.type](config, problems)
    assert [str(e) for e in problems.errors] == []
    on_cpu = config.launcher.slurm.container_type == "none"
    assert on_cpu == path.stem.endswith("-cpu-demo")
