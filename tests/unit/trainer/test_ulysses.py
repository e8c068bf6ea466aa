"""Ulysses sequence parallelism equals one rank (issue 46, part 4's done-when): one grpo step (a reference's KL loss,
the decoupled loss, chunked log-probs, the entropy bonus's gradient: also ppo's actor step), one ppo critic step (its
values, value loss and gradients; the critic's engine beside the actor's in one process, as ppo's trainer holds them)
and one sft step (full logits, gradient checkpointing: its recompute in backward runs the all-to-all again) on 2 gloo
ranks with `ulysses_sp_size=2` give the loss, the per-sample log-probs (values) and every gradient of the same step
on 1 rank within 1e-5 (float32, the tiny Qwen2: 2 attention heads, 1 KV head repeated for the two ranks), packed rows
split and padded rows run whole; the packed rows really ran sequence parallel. A random tiny model of every family
submit accepts splits exactly too."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from rlkit.config.schema.actor import ULYSSES_MODEL_TYPES
from tests.helpers.gloo_ranks import run_ranks
from tests.unit.trainer.test_packed_steps import TOLERANCE, assert_same, relative

WORKER = "import sys\nfrom tests.helpers.ulysses_steps import main\nmain(sys.argv[1], sys.argv[2], int(sys.argv[3]))\n"
JOBS = ["grpo", "grpo_full_logits", "ppo_critic", "sft_checkpointed_full_logits"]


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


# The critic's value-head bias: its gradient is the sum of every token's dL/dvalue, which the two sp ranks add as two
# halves that nearly cancel (returns averaging ~0): float32 rounding of those halves measured 1.03e-5 of the step's
# gradient floor at sp=2 (4.75e-8 absolute, the bias's gradient -1.1e-3), 1.01e-6 run whole; a wrong token would be
# ~1e-3. Compared on its own at this bound, every other gradient, the loss and the values at TOLERANCE.
SUMMED_BIAS, SUMMED_BIAS_TOLERANCE = "score.bias", 1e-4


def _split_off(result: dict[str, Any], name: str) -> tuple[dict[str, Any], list[torch.Tensor]]:
    """`result` without gradient `name` in any step, and that gradient per step."""
    taken = [grads.pop(name) for grads in (dict(g) for g in result["grads"]) if name in grads]
    rest = {**result, "grads": [{k: v for k, v in g.items() if k != name} for g in result["grads"]]}
    return rest, taken


@pytest.mark.parametrize("job", JOBS)
def test_sp2_step_equals_one_rank(steps: dict[int, dict[str, Any]], job: str) -> None:
    assert steps[2][job]["packed"]["probed"], f"{job}: the model did not take packed rows"
    want, want_bias = _split_off(steps[1][job]["packed"], SUMMED_BIAS)
    for mode, what in (("packed", "sp=2 on 2 ranks vs 1 rank"), ("padded", "padded rows (no split) under sp=2")):
        got, got_bias = _split_off(steps[2][job][mode], SUMMED_BIAS)
        assert_same(got, want, f"{job}: {what}")
        assert len(got_bias) == len(want_bias) == (len(want["grads"]) if job == "ppo_critic" else 0)
        for step, (mine, theirs) in enumerate(zip(got_bias, want_bias, strict=True)):
            floor = 1e-2 * max(float(g.abs().max()) for g in want["grads"][step].values())
            error = relative(mine, theirs, floor)
            assert error <= SUMMED_BIAS_TOLERANCE, f"{job}: {what}: step {step} {SUMMED_BIAS} differs by {error:.3g}"


@pytest.mark.parametrize("family", ULYSSES_MODEL_TYPES)
def test_every_served_family_splits_exactly(steps: dict[int, dict[str, Any]], family: str) -> None:
    """A random tiny model of each family submit accepts (4 heads, 2 KV heads): sp=2's packed log-probs and
    gradients are one rank's."""
    got, want = steps[2]["families"][family], steps[1]["families"][family]
    assert float((got["logp"] - want["logp"]).abs().max()) <= TOLERANCE * float(want["logp"].abs().max())
    for name, grad in want["grads"].items():
        error = relative(got["grads"][name], grad, 1e-2 * max(float(g.abs().max()) for g in want["grads"].values()))
        assert error <= TOLERANCE, f"{family}: gradient of {name} differs by {error:.3g}"
