"""The rw, dpo and ppo example configs (ppo's in configs/pending/, not yet submittable; rw's and dpo's in configs/)
load, and pass the checks of their job type once a site's paths point at real files."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlkit.config.load import load_config
from rlkit.config.problems import Problems
from rlkit.config.validate_pairs import validate_critic, validate_dpo, validate_rw
from rlkit.tasks.digits_pairs import write_pair_splits

from ..conftest import CONFIGS

PENDING = sorted((CONFIGS / "pending").glob("*.yaml")) + sorted(
    path for job in ("rw", "dpo") for path in CONFIGS.glob(f"{job}*.yaml"))
CHECKS = {"rw": validate_rw, "dpo": validate_dpo, "ppo": validate_critic}


def test_each_pending_job_type_has_a_cpu_demo_and_a_gpu_example() -> None:
    names = {path.name for path in PENDING}
    assert names == {f"{job}{kind}.yaml" for job in CHECKS for kind in ("", "-cpu-demo")}


@pytest.mark.parametrize("path", PENDING, ids=lambda p: p.stem)
def test_pending_config_validates(path: Path, tmp_path: Path, fake_model: Path) -> None:
    (fake_model / "tokenizer.json").write_text("{}")
    train, held_out = write_pair_splits(tmp_path)
    config = load_config(path, [f"actor.path={fake_model}", f"train_dataset.path={train}"])
    if config.valid_dataset.path:
        config = load_config(path, [f"actor.path={fake_model}", f"train_dataset.path={train}",
                                    f"valid_dataset.path={held_out}"])
    problems = Problems()
    CHECKS[config.type](config, problems)
    assert [str(e) for e in problems.errors] == []
    on_cpu = config.launcher.slurm.container_type == "none"
    assert on_cpu == path.stem.endswith("-cpu-demo")
