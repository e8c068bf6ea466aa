"""Packed equals padded, and one rank equals two (issue 46's done-when): one step of every job type (grpo with a
reference's KL loss, GSPO on a tied-embedding model with two passes (ppo_epochs), LoRA with the entropy bonus, the
per-sequence actor.loss_agg_modes (with the entropy bonus; with SAPO), the other policy losses (CISPO, GMPO, GPG under
LoRA); ppo's critic; sft, plain and LoRA on a tied
model; rw; dpo with its frozen reference) through the real micro-batching, losses and engine on the tiny model in
float32, on 1 and 2 gloo ranks (tests/helpers/packed_steps.py). The loss, the per-sample log-probs and values the
algorithm gets back and every parameter's gradient agree within 1e-5 (relative: a per-sample result to the largest of
the batch, a gradient to its tensor's largest, at least 1% of the step's largest), packed against padded and 1 rank
against 2."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from tests.helpers.gloo_ranks import run_ranks

WORKER = "import sys\nfrom tests.helpers.packed_steps import main\nmain(*sys.argv[1:4], int(sys.argv[4]))\n"
TOLERANCE = 1e-5


def relative(got: torch.Tensor, want: torch.Tensor, scale: float = 0.0) -> float:
    """Largest difference over the larger of `want`'s largest magnitude and `scale` (a quantity that nearly cancels
    out, a value near 0 or a bias's summed gradient, is measured against the scale of its kind, not against 0)."""
    return float((got - want).abs().max() / max(float(want.abs().max()), scale, 1e-12))


def assert_same(got: dict[str, Any], want: dict[str, Any], what: str) -> None:
    assert abs(got["loss"] - want["loss"]) <= TOLERANCE * max(1.0, abs(want["loss"])), (
        f"{what}: loss {got['loss']} != {want['loss']}")
    assert got["per_sample"].keys() == want["per_sample"].keys(), f"{what}: other samples"
    values = [torch.tensor(v) for v in want["per_sample"].values()]
    scale = max((float(v.abs().max()) for v in values if v.numel()), default=0.0)  # over every sample's values
    for key, value in want["per_sample"].items():
        error = relative(torch.tensor(got["per_sample"][key]), torch.tensor(value), scale)
        assert error <= TOLERANCE, f"{what}: per-sample {key} differs by {error:.3g}"
    assert len(got["grads"]) == len(want["grads"]) > 0, f"{what}: other optimizer steps"
    for step, (mine, theirs) in enumerate(zip(got["grads"], want["grads"], strict=True)):
        assert mine.keys() == theirs.keys() and mine, f"{what}: gradients of other parameters"
        floor = 1e-2 * max(float(g.abs().max()) for g in theirs.values())  # 1% of the step's largest gradient
        for name, grad in theirs.items():
            error = relative(mine[name], grad, floor)
            assert error <= TOLERANCE, f"{what}: step {step} gradient of {name} differs by {error:.3g}"


@pytest.fixture(scope="module")
def steps(tiny_model_dir: Path, tied_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
          ) -> dict[int, dict[str, Any]]:
    out: dict[int, dict[str, Any]] = {}
    for world in (1, 2):
        path = tmp_path_factory.mktemp("packed") / f"world{world}.pt"
        run_ranks(world, ["-c", WORKER, str(tiny_model_dir), str(tied_model_dir), str(path), "4"])
        out[world] = torch.load(path, weights_only=False)
    return out


JOBS = ["grpo", "grpo_gspo_tied", "grpo_lora", "grpo_seq_mean", "grpo_seq_norm", "grpo_cispo", "grpo_gmpo",
        "grpo_gpg_lora", "ppo_critic", "sft", "sft_lora_tied", "rw", "dpo"]


@pytest.mark.parametrize("job", JOBS)
@pytest.mark.parametrize("world", [1, 2])
def test_packed_step_equals_padded(steps: dict[int, dict[str, Any]], job: str, world: int) -> None:
    result = steps[world][job]
    assert result["packed"]["probed"], f"{job}: the model did not take packed rows"
    assert_same(result["packed"], result["padded"], f"{job} on {world} rank(s), packed vs padded")


@pytest.mark.parametrize("job", JOBS)
def test_two_ranks_step_as_one(steps: dict[int, dict[str, Any]], job: str) -> None:
    assert_same(steps[2][job]["packed"], steps[1][job]["packed"], f"{job}, packed: 2 ranks vs 1")


def test_cispo_steps_as_ppo_at_ratio_one(steps: dict[int, dict[str, Any]]) -> None:
    """The optimizer never steps here, so every ratio is 1: CISPO's gradient -A grad log pi is then PPO's (the same
    config otherwise), while its loss -A log pi is another number than PPO's -A r: the step ran CISPO's loss."""
    cispo, ppo = steps[1]["grpo_cispo"]["packed"], steps[1]["grpo"]["packed"]
    assert abs(cispo["loss"] - ppo["loss"]) > 1e-3
    assert_same({**cispo, "loss": ppo["loss"]}, ppo, "CISPO vs PPO at ratio 1")
