"""The pure parts of the training engine: learning-rate schedule, attention fallback, minibatch index layout,
full-weight buckets."""

from __future__ import annotations

import importlib.util
import math
from types import SimpleNamespace

import pytest

from rlkit.errors import StepError
from rlkit.trainer.batch import local_indices
from rlkit.trainer.engine import TrainEngine, attention_implementation, lr_multiplier
from rlkit.trainer.skipped_steps import MAX_SKIPPED_IN_A_ROW, ZERO_IN_A_ROW_WARNING, SkippedSteps


def lr(step: int, total: int = 100, *, warmup: float = 0.1, schedule: str = "constant", min_lr: float = 0.0) -> float:
    return lr_multiplier(step, total, warmup_proportion=warmup, schedule=schedule, min_lr_ratio=min_lr)


# --- lr_multiplier ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("schedule", ["constant", "linear", "cosine"])
def test_warmup_is_linear_from_one_over_warmup(schedule: str) -> None:
    # 10% of 100 steps = 10 warmup steps: (step + 1) / 10
    assert [lr(s, schedule=schedule) for s in range(10)] == pytest.approx([(s + 1) / 10 for s in range(10)])
    assert lr(0, schedule=schedule) == pytest.approx(0.1)
    assert lr(9, schedule=schedule) == pytest.approx(1.0)
    assert lr(10, schedule=schedule) == pytest.approx(1.0)  # decay starts from the peak


def test_constant_after_warmup() -> None:
    assert [lr(s) for s in (10, 50, 99, 100, 500)] == [1.0] * 5
    assert lr(0, warmup=0.0) == 1.0  # no warmup at all


def test_linear_decays_to_min_lr_ratio_at_the_end() -> None:
    # after 10 warmup steps, 90 steps to go from 1 to 0.2: step 55 is half-way (0.6), step 100 the end (0.2)
    assert lr(55, schedule="linear", min_lr=0.2) == pytest.approx(0.6)
    assert lr(100, schedule="linear", min_lr=0.2) == pytest.approx(0.2)
    assert lr(1000, schedule="linear", min_lr=0.2) == pytest.approx(0.2)  # clamped past the end
    assert lr(100, schedule="linear") == pytest.approx(0.0)
    assert lr(40, schedule="linear", min_lr=0.0) == pytest.approx(1 - 30 / 90)


@pytest.mark.parametrize("min_lr", [0.0, 0.1, 0.5])
def test_cosine_half_way_and_end(min_lr: float) -> None:
    assert lr(55, schedule="cosine", min_lr=min_lr) == pytest.approx(min_lr + (1 - min_lr) / 2)
    assert lr(100, schedule="cosine", min_lr=min_lr) == pytest.approx(min_lr)
    # no warmup, 8 steps: step 0 is the peak, step 2 a quarter of the way: min + (1 - min) * (1 + cos(pi / 4)) / 2
    assert lr(0, total=8, warmup=0.0, schedule="cosine", min_lr=min_lr) == pytest.approx(1.0)
    expected = min_lr + (1 - min_lr) * (1 + math.cos(math.pi / 4)) / 2
    assert lr(2, total=8, warmup=0.0, schedule="cosine", min_lr=min_lr) == pytest.approx(expected)


def test_unknown_schedule_raises() -> None:
    with pytest.raises(ValueError, match="unknown lr_scheduler_type 'step'"):
        lr(50, schedule="step")
    with pytest.raises(ValueError, match="unknown lr_scheduler_type"):
        lr(0, warmup=0.0, schedule="exponential")


# --- attention_implementation -----------------------------------------------------------------------------------

def test_flash_attention_falls_back_to_sdpa_here() -> None:
    assert importlib.util.find_spec("flash_attn") is None, "this test expects a machine without flash-attn"
    assert attention_implementation("flash_attention_2") == "sdpa"


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_other_implementations_stay(impl: str) -> None:
    assert attention_implementation(impl) == impl


# --- local_indices -----------------------------------------------------------------------------------------------

def local(n: int, rank: int, world: int, n_mb: int = 2) -> list[list[int]]:
    return local_indices(n, n_mb, rank, world)


def test_local_indices_single_rank_is_strided_minibatches() -> None:
    assert local(8, 0, 1) == [[0, 2, 4, 6], [1, 3, 5, 7]]
    assert local(8, 0, 1, n_mb=4) == [[0, 4], [1, 5], [2, 6], [3, 7]]


def test_local_indices_two_ranks_by_hand() -> None:
    assert local(8, 0, 2) == [[0, 4], [1, 5]]
    assert local(8, 1, 2) == [[2, 6], [3, 7]]


@pytest.mark.parametrize("world", [1, 2, 3])
def test_local_indices_union_over_ranks_is_the_one_rank_minibatch(world: int) -> None:
    single = local(8, 0, 1)
    per_rank = [local(8, r, world) for r in range(world)]
    for k in range(2):
        parts = [mine[k] for mine in per_rank]
        assert sorted(i for part in parts for i in part) == single[k]
        assert sum(len(p) for p in parts) == len(single[k])  # no index on two ranks
    assert sorted(i for mine in per_rank for mb in mine for i in mb) == list(range(8))


def test_local_indices_three_ranks_by_hand() -> None:
    assert [local(8, r, 3) for r in range(3)] == [[[0, 6], [1, 7]], [[2], [3]], [[4], [5]]]


def test_full_buckets_cover_every_weight_once_in_order_and_respect_the_size() -> None:
    import torch
    from torch import nn

    model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 4), nn.Linear(4, 100))  # 288, 144 (+16, +400) bytes
    engine = SimpleNamespace(model=model)
    buckets = list(TrainEngine.iter_full_buckets(engine, 300, torch.float32))  # type: ignore[arg-type]
    names = [name for bucket in buckets for name in bucket]  # type: ignore[union-attr]
    assert names == list(model.state_dict())
    for bucket in buckets:
        assert bucket is not None
        size = sum(t.numel() * t.element_size() for t in bucket.values())
        assert size <= 300 or len(bucket) == 1, f"bucket of {size} bytes holds {len(bucket)} tensors"
    assert len(buckets) == 4  # [0.w 0.b] (288 B; 1.w would pass 300), [1.w 1.b], [2.w] (1600 B alone), [2.b]
    half = list(TrainEngine.iter_full_buckets(engine, 10**6, torch.bfloat16))  # type: ignore[arg-type]
    assert len(half) == 1 and all(t.dtype == torch.bfloat16 for t in half[0].values())  # type: ignore[union-attr]
    with pytest.raises(ValueError, match="positive size"):
        next(TrainEngine.iter_full_buckets(engine, 0))  # type: ignore[arg-type]


# --- a non-finite gradient norm -----------------------------------------------------------------------------------

@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_a_step_whose_gradient_norm_is_not_finite_leaves_weights_and_optimizer_unchanged(
        bad: float, capsys: pytest.CaptureFixture[str]) -> None:
    """A NaN loss (a NaN reward or log-prob slipping through, an overflow) gives a NaN norm; clipping by it made every
    gradient NaN and AdamW then wrote NaN into every weight, for good and without a word (the metrics log drops
    non-finite values). The step is skipped instead, as verl and AReaL do."""
    import torch

    engine = TrainEngine.__new__(TrainEngine)
    engine.rank, engine.optimizer_steps, engine.total_optimizer_steps, engine.skipped = 0, 3, 10, SkippedSteps()
    engine.config = SimpleNamespace(optimizer=SimpleNamespace(
        gradient_clipping=1.0, warmup_steps_proportion=0.0, lr_scheduler_type="constant", min_lr_ratio=0.0, lr=0.1))
    engine.model = torch.nn.Linear(2, 1)
    engine.optimizer = torch.optim.AdamW(engine.model.parameters(), lr=0.1)
    before = [p.detach().clone() for p in engine.model.parameters()]
    (engine.model(torch.ones(1, 2)).sum() * bad).backward()
    assert not math.isfinite(engine._clip_and_step())
    assert all(torch.equal(p, b) for p, b in zip(engine.model.parameters(), before, strict=True))
    assert engine.optimizer_steps == 3 and not engine.optimizer.state, "no step taken, no moments started"
    assert all(p.grad is None for p in engine.model.parameters())
    assert "this optimizer step is skipped" in capsys.readouterr().out
    engine.model(torch.ones(1, 2)).sum().backward()  # the next, finite step is taken as usual
    assert math.isfinite(engine._clip_and_step()) and engine.optimizer_steps == 4
    assert all(torch.isfinite(p).all() for p in engine.model.parameters())
    # a loss broken for good: the trainer stops after MAX_SKIPPED_IN_A_ROW skipped steps in a row, not at the end
    for _ in range(MAX_SKIPPED_IN_A_ROW - 1):
        (engine.model(torch.ones(1, 2)).sum() * bad).backward()
        engine._clip_and_step()
    (engine.model(torch.ones(1, 2)).sum() * bad).backward()
    with pytest.raises(StepError, match=f"NaN or infinite at {MAX_SKIPPED_IN_A_ROW} optimizer steps in a row"):
        engine._clip_and_step()


def test_a_step_whose_gradient_is_exactly_zero_leaves_weights_and_moments_unchanged() -> None:
    """A batch with nothing to learn from (every GRPO group flat, no KL term) gives a gradient of exactly zero.
    AdamW would still move every weight by its moments from the last real gradient, at nearly full size for several
    steps; the step is skipped and counted instead, and the learning-rate schedule goes on counting steps."""
    import torch

    engine = TrainEngine.__new__(TrainEngine)
    engine.rank, engine.optimizer_steps, engine.total_optimizer_steps, engine.skipped = 0, 0, 10, SkippedSteps()
    engine.config = SimpleNamespace(optimizer=SimpleNamespace(
        gradient_clipping=1.0, warmup_steps_proportion=0.0, lr_scheduler_type="constant", min_lr_ratio=0.0, lr=0.1))
    engine.model = torch.nn.Linear(2, 1)
    engine.optimizer = torch.optim.AdamW(engine.model.parameters(), lr=0.1, weight_decay=0.01)
    engine.model(torch.ones(1, 2)).sum().backward()  # one real gradient: the moments start
    assert engine._clip_and_step() > 0 and engine.optimizer_steps == 1
    weights = [p.detach().clone() for p in engine.model.parameters()]
    moments = [engine.optimizer.state[p]["exp_avg"].clone() for p in engine.model.parameters()]
    for step in (2, 3):
        (engine.model(torch.ones(1, 2)).sum() * 0.0).backward()  # all advantages zero: a zero gradient
        assert engine._clip_and_step() == 0.0 and engine.optimizer_steps == step
    assert all(torch.equal(p, w) for p, w in zip(engine.model.parameters(), weights, strict=True)), "no drift"
    assert all(torch.equal(engine.optimizer.state[p]["exp_avg"], m)
               for p, m in zip(engine.model.parameters(), moments, strict=True))
    assert all(p.grad is None for p in engine.model.parameters())
    assert engine.skipped.take() == (0, 2) and engine.skipped.take() == (0, 0)
    engine.model(torch.ones(1, 2)).sum().backward()  # the next real gradient is taken as usual
    assert engine._clip_and_step() > 0 and engine.optimizer_steps == 4
    assert not all(torch.equal(p, w) for p, w in zip(engine.model.parameters(), weights, strict=True))


def test_a_long_run_of_zero_gradients_is_said_once_and_a_real_step_starts_the_count_again(
        capsys: pytest.CaptureFixture[str]) -> None:
    """Every group flat for good (a constant reward, a task all solved or all failed) trains nothing: no stop, as it is
    no broken loss, but one warning at ZERO_IN_A_ROW_WARNING in a row; a taken step starts the count again."""
    skipped = SkippedSteps()
    for _ in range(ZERO_IN_A_ROW_WARNING - 1):
        skipped.zero(announce=True)
    assert "exactly zero" not in capsys.readouterr().out
    skipped.zero(announce=True)
    assert f"exactly zero at {ZERO_IN_A_ROW_WARNING} optimizer steps in a row" in capsys.readouterr().out
    for _ in range(ZERO_IN_A_ROW_WARNING):
        skipped.zero(announce=True)
    assert "exactly zero" not in capsys.readouterr().out, "said once per run of them"
    skipped.taken()
    for _ in range(ZERO_IN_A_ROW_WARNING):
        skipped.zero(announce=False)
    assert capsys.readouterr().out == "", "only rank 0 says it"
