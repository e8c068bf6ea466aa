"""AReaL's one-node GPU examples (tests/data/areal/current/gsm8k_{grpo,ppo}.yaml, unchanged) render with site
settings only, keeping their own `cluster.n_nodes: 1`, and the real controller accepts the scripts (sbatch
--test-only): 4 SGLang servers of one GPU and a 4-rank trainer in one allocation on one node of the dev cluster
(gres gpu:8, as the files say). Nothing is submitted; SGLang and Apptainer are not run here.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlkit.launch.slurm import sbatch_test_only
from rlkit.launch.submit import prepare
from tests.conftest import REPO

pytestmark = [pytest.mark.slurm]
EXAMPLES = REPO / "tests" / "data" / "areal" / "current"
# no Apptainer here; the files' n_nodes and GPUs per node are kept; the steps run the nodes' python3, which holds SGLang
# (this venv has none: rlkit.checks.host_python)
SITE = ["launcher.slurm.container_type=none", "launcher.python=python3"]


@pytest.fixture
def site(tmp_path: Path) -> list[str]:
    """Where the model, the data and the trial files are: a stand-in model directory (never served) saying the
    examples' server context, and GSM8K-format rows."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"max_position_embeddings": 32768}))
    (model / "tokenizer.json").write_text("{}")
    data = tmp_path / "gsm8k.jsonl"
    data.write_text(json.dumps({"question": "1+1?", "answer": "1 + 1 = 2\n#### 2"}) + "\n")
    return [*SITE, f"actor.path={model}", f"cluster.fileroot={tmp_path / 'fileroot'}", f"train_dataset.path={data}",
            f"valid_dataset.path={data}"]


@pytest.mark.parametrize(("example", "job_type"), [("gsm8k_grpo", "grpo"), ("gsm8k_ppo", "ppo")])
def test_the_controller_accepts_an_areal_one_node_example(example: str, job_type: str, site: list[str],
                                                          tmp_path: Path) -> None:
    prepared = prepare(EXAMPLES / f"{example}.yaml", [*site, f"type={job_type}"], dry_run=True)
    assert not prepared.warnings, [w.message for w in prepared.warnings]
    assert prepared.config.cluster.n_nodes == 1 and prepared.plan.packed
    assert "#SBATCH --nodes=1\n" in prepared.script and "#SBATCH --gres=gpu:8\n" in prepared.script
    verdict = sbatch_test_only(prepared.script)
    assert "to start at" in verdict, verdict  # the controller's own answer: it would run the job
    assert not (tmp_path / "fileroot").exists(), "nothing written"
