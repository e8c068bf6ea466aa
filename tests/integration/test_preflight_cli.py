"""The site preflight through the real CLI against the dev cluster's partition (4 nodes of 64 CPUs, 500 GB and
gpu:8): every mismatch at once, exit 2, nothing written or submitted; `--no-preflight` leaves it to Slurm's one
terse line."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import run_rlkit
from tests.integration.test_cli_errors import _test_jobs, assert_refused_whole

pytestmark = pytest.mark.slurm


def test_a_layout_the_partition_cannot_hold_is_refused_with_every_mismatch(grpo_yaml: Path, rlkit_home: Path,
                                                                          tmp_path: Path) -> None:
    before = _test_jobs(tmp_path)
    too_big = ["cluster.n_gpus_per_node=16", "allocation_mode=vllm:d1+fsdp:d16", "launcher.trainer_cpus_per_gpu=8",
               "launcher.inference_server_mem_per_gpu=900000", "train_dataset.batch_size=8"]
    result = run_rlkit("submit", str(grpo_yaml), *too_big, "trial_name=big")
    assert_refused_whole(result, ["the trainer component asks for 16 GPUs per node; the nodes of partition debug have "
                                  "at most 8", "the trainer component asks for 128 CPUs per node (16 tasks x 8)",
                                  "the server component asks for 900000 MB of memory per node; partition debug "
                                  "allows at most 512000"], tmp_path, rlkit_home)
    err = result.stderr
    for fix in ("cluster.n_gpus_per_node", "launcher.trainer_cpus_per_gpu", "launcher.inference_server_mem_per_gpu"):
        assert fix in err, (fix, err)

    # the same job without the preflight: Slurm's own answer, one line for all of it
    bare = run_rlkit("submit", str(grpo_yaml), *too_big, "trial_name=big", "--no-preflight")
    assert_refused_whole(bare, ["Requested node configuration is not available"], tmp_path, rlkit_home)
    assert _test_jobs(tmp_path) == before


def test_more_nodes_than_the_partition_has_and_an_unknown_partition(grpo_yaml: Path, rlkit_home: Path,
                                                                   tmp_path: Path) -> None:
    before = _test_jobs(tmp_path)
    wide = run_rlkit("submit", str(grpo_yaml), "cluster.n_nodes=8", "allocation_mode=vllm:d1+fsdp:d6")
    assert_refused_whole(wide, ["the trainer component needs 6 nodes with 1 GPUs, 1 CPUs and 1000 MB each; partition "
                                "debug has 4"], tmp_path, rlkit_home)

    unknown = run_rlkit("submit", str(grpo_yaml), "launcher.slurm.partition=nosuch")
    assert_refused_whole(unknown, ["launcher.slurm.partition=nosuch is not a partition of this cluster"], tmp_path,
                         rlkit_home)
    assert "use one of: debug" in unknown.stderr
    assert _test_jobs(tmp_path) == before
