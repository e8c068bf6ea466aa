"""Ulysses sequence parallelism equals one rank (issue 46, part 4's done-when): one grpo step (a reference's KL
loss, the decoupled loss, chunked log-probs) and one sft step (full logits, gradient checkpointing: its recompute
in backward runs the all-to-all again) on 2 gloo ranks with `ulysses_sp_size=2` give the loss, the per-sample
log-probs and every gradient of the same step on 1 rank within 1e-5 (float32, the tiny Qwen2: 2 attention heads,
1 KV head repeated for the two ranks), packed rows split and padded rows run whole; the packed rows really ran
sequence parallel. A random tiny model of every family submit accepts splits exactly too."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from rlkit.config.schema.actor import ULYSSES_MODEL_TYPES
from tests.helpers.gloo_ranks import run_ranks
from tests.unit.trainer.test_packed_steps import TOLERANCE, assert_same, relative

WORKER = "import sys\nfrom tests.helpers.ulysses_steps import main\nmain(sys.argv[1], sys.argv[2], int(sys.argv[3]))\n"
JOBS = ["grpo", "sft_checkpointed_full_logits"]


@pytest.fixture(scope="module")
def steps(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[int, dict[str, Any]]:
    out: dict[int, dict[str, Any]] = {}
    for world in (1, 2):
        path = tmp_path_factory.mktemp("ulysses") / f"sp{world}.pt"
        run_ranks(world, ["-c", WORKER, str(tiny_model_dir), str(path), str(world)])
        out[world] = torch.load(path, weights_only=False)
    return out


def test_sequence_parallel_really_ran(steps: dict[int, dict[str, Any]]) -> None:
    assert steps[1]["sliced_rows"] == 0, "sp=1 must not touch the sequence-parallel path"
    assert steps[2]["sliced_rows"] > 0, "sp=2: no packed row was split over the sp group"


@pytest.mark.parametrize("job", JOBS)
def test_sp2_step_equals_one_rank(steps: dict[int, dict[str, Any]], job: str) -> None:
    assert steps[2][job]["packed"]["probed"], f"{job}: the model did not take packed rows"
    assert_same(steps[2][job]["packed"], steps[1][job]["packed"], f"{job}: sp=2 on 2 ranks vs 1 rank")
    assert_same(steps[2][job]["padded"], steps[1][job]["packed"], f"{job}: padded rows (no split) under sp=2")


@pytest.mark.parametrize("family", ULYSSES_MODEL_TYPES)
def test_every_served_family_splits_exactly(steps: dict[int, dict[str, Any]], family: str) -> None:
    """A random tiny model of each family submit accepts (4 heads, 2 KV heads): sp=2's packed log-probs and
    gradients are one rank's."""
    got, want = steps[2]["families"][family], steps[1]["families"][family]
    assert float((got["logp"] - want["logp"]).abs().max()) <= TOLERANCE * float(want["logp"].abs().max())
    for name, grad in want["grads"].items():
        error = relative(got["grads"][name], grad, 1e-2 * max(float(g.abs().max()) for g in want["grads"].values()))
        assert error <= TOLERANCE, f"{family}: gradient of {name} differs by {error:.3g}"
