"""The site the verl migration tests migrate onto (test_verl_migrate, test_verl_estimators)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.helpers.verl_rows import verl_gsm8k_parquet


@pytest.fixture(scope="module")
def site(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """Where the model, the data and the trial files live on this machine (the scripts' own are another site's):
    the tiny model saying 32768 positions (as Qwen's), GSM8K rows in verl's Parquet form, no container."""
    root = tmp_path_factory.mktemp("verl-site")
    model = root / "model"
    shutil.copytree(tiny_model_dir, model)
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 32768}))
    data = verl_gsm8k_parquet(root / "train.parquet")  # as verl's examples/data_preprocess/gsm8k.py writes it
    return [f"actor.path={model}", f"train_dataset.path={data}", f"valid_dataset.path={data}",
            f"cluster.fileroot={root / 'fileroot'}", "launcher.slurm.container_type=none"]
