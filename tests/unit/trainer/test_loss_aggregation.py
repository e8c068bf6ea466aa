"""actor.loss_agg_mode (rlkit.trainer.rl_math.aggregation): each mode against values worked out by hand on rows of
unequal lengths with a filler row; token-mean exactly today's reduction of the PPO loss; every mode's micro-batch
means, weighted by their units as the engine weighs them, equal to the whole batch's however the rows are split;
and the engine's unit count (rlkit.trainer.sample_forward.minibatch_steps) in sequences for the seq modes.
1 gloo rank against 2 and packed against padded (other micro-batch splits): tests/unit/trainer/test_packed_steps.py."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from rlkit.config.schema.actor import LOSS_AGG_MODES, MicroBatchSpec
from rlkit.trainer.rl_math.aggregation import aggregate, loss_units
from rlkit.trainer.rl_math.losses import ppo_actor_loss
from rlkit.trainer.rl_math.opmd import opmd_policy_loss
from rlkit.trainer.sample_forward import minibatch_steps
from rlkit.types import Sample

NAN = math.nan
# rows of 3, 1, 0 (a filler) and 2 trained tokens; padding holds garbage that must neither count nor leak gradient
VALUES = [[1.0, 2.0, 3.0, NAN], [4.0, NAN, NAN, NAN], [NAN, NAN, NAN, NAN], [5.0, 6.0, NAN, NAN]]
MASK = [[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0], [1, 1, 0, 0]]
BY_HAND = {  # (loss, units)
    "token-mean": ((1 + 2 + 3 + 4 + 5 + 6) / 6, 6),
    "seq-mean-token-mean": ((6 / 3 + 4 / 1 + 11 / 2) / 3, 3),
    "seq-mean-token-sum": ((6 + 4 + 11) / 3, 3),
    "seq-mean-token-sum-norm": ((6 / 8 + 4 / 8 + 11 / 8) / 3, 3),  # scale_factor 8 (Dr.GRPO's max tokens)
}


def _tensors() -> tuple[torch.Tensor, torch.Tensor]:
    return torch.tensor(VALUES, dtype=torch.float64, requires_grad=True), torch.tensor(MASK, dtype=torch.bool)


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_each_mode_against_its_hand_computed_value(mode: str) -> None:
    values, mask = _tensors()
    loss, units = aggregate(values, mask, mode, scale_factor=8)
    want, want_units = BY_HAND[mode]
    assert units == want_units == loss_units(mask, mode)
    assert float(loss.detach()) == pytest.approx(want, rel=1e-12)
    loss.backward()
    assert values.grad is not None and bool(torch.isfinite(values.grad).all())
    assert bool((values.grad[~mask] == 0).all())  # nothing flows to padding or to the filler row


def test_zero_trained_tokens_give_zero_loss_and_zero_units() -> None:
    values = torch.randn(3, 5, dtype=torch.float64, requires_grad=True)
    mask = torch.zeros(3, 5, dtype=torch.bool)
    for mode in LOSS_AGG_MODES:
        loss, units = aggregate(values, mask, mode, scale_factor=4)
        assert (float(loss.detach()), units) == (0.0, 0)
        loss.backward()  # still part of the graph: a rank whose micro-batch trains nothing runs its backward
    assert values.grad is not None and not bool(values.grad.any())


def test_unknown_modes_and_a_missing_constant_are_refused() -> None:
    values, mask = _tensors()
    with pytest.raises(ValueError, match="loss_agg_mode must be one of token-mean"):
        aggregate(values, mask, "seq-mean")
    with pytest.raises(ValueError, match="needs a positive scale_factor"):
        aggregate(values, mask, "seq-mean-token-sum-norm")


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
@pytest.mark.parametrize("split", [[4], [2, 2], [1, 3], [1, 1, 1, 1]])
def test_micro_batches_weighted_by_units_give_the_whole_batch(mode: str, split: list[int]) -> None:
    """What TrainEngine.optimizer_step does with each micro-batch's (loss, units): sum(loss * units) / all units,
    for the value and for the gradient, whatever the split (a micro-batch of the filler row alone has 0 units)."""
    torch.manual_seed(0)
    values = torch.randn(4, 4, dtype=torch.float64, requires_grad=True)
    mask = torch.tensor(MASK, dtype=torch.bool)
    whole, total = aggregate(values, mask, mode, scale_factor=8)
    (whole_grad,) = torch.autograd.grad(whole, values)
    start, parts = 0, []
    for size in split:
        parts.append(aggregate(values[start:start + size], mask[start:start + size], mode, scale_factor=8))
        start += size
    assert sum(units for _, units in parts) == total
    combined = sum(loss * units for loss, units in parts) / total
    assert isinstance(combined, torch.Tensor)
    (grad,) = torch.autograd.grad(combined, values)
    assert float(combined.detach()) == pytest.approx(float(whole.detach()), rel=1e-12)
    assert torch.allclose(grad, whole_grad, rtol=1e-12, atol=1e-15)


def _ppo_inputs(seed: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    shape = (5, 9)
    mask = torch.rand(shape, generator=generator) > 0.3
    mask[2] = False  # a filler row
    old = -torch.rand(shape, generator=generator) * 3
    return {"logp": (old + 0.3 * torch.randn(shape, generator=generator)).requires_grad_(), "old_logp": old,
            "advantages": torch.randn(shape, generator=generator), "loss_mask": mask,
            "behav_logp": old - 0.5 * torch.rand(shape, generator=generator)}


@pytest.mark.parametrize("options", [{}, {"c_clip": 3.0, "eps_clip_higher": 0.28}, {"use_behav": True},
                                     {"use_behav": True, "behav_imp_weight_cap": 1.5},
                                     {"importance_sampling_level": "sequence"}])
def test_token_mean_is_todays_reduction_bit_for_bit(options: dict[str, Any], monkeypatch: pytest.MonkeyPatch
                                                    ) -> None:
    """The default is the reduction ppo_actor_loss had before the modes: the kept tokens' losses summed over the
    number of tokens in loss_mask (tokens the behaviour bound dropped add 0 but count). The per-token losses are
    caught on their way into the aggregation; today's formula over them equals the loss and its gradient exactly."""
    from rlkit.trainer.rl_math import losses

    caught: list[tuple[torch.Tensor, torch.Tensor]] = []

    def spy(values: torch.Tensor, mask: torch.Tensor, mode: str, **kw: Any) -> tuple[torch.Tensor, int]:
        caught.append((values, mask))
        return aggregate(values, mask, mode, **kw)

    monkeypatch.setattr(losses, "aggregate", spy)
    inputs = _ppo_inputs(1)
    behav = inputs.pop("behav_logp") if options.pop("use_behav", False) else None
    inputs.pop("behav_logp", None)
    loss, stats = ppo_actor_loss(**inputs, behav_logp=behav, **options)
    (values, mask), = caught
    assert torch.equal(mask, inputs["loss_mask"])  # the units are loss_mask's, whatever the bound dropped
    if behav is not None and "behav_imp_weight_cap" in options:
        assert float(stats["behav_filtered_fraction"]) > 0  # the case where dropped tokens still count is tested
    today = values.sum() / mask.sum().clamp(min=1)
    (grad,) = torch.autograd.grad(loss, inputs["logp"], retain_graph=True)
    (grad_today,) = torch.autograd.grad(today, inputs["logp"])
    assert torch.equal(loss, today) and torch.equal(grad, grad_today)


def test_modes_change_the_ppo_and_opmd_losses_as_by_hand() -> None:
    """With ratio 1 and no clip the PPO loss is -A per token, OPMD's -A * logp / (1 + tau): every mode gives the
    hand-computed aggregate of those per-token values."""
    values, mask = _tensors()
    adv = torch.nan_to_num(-values.detach(), nan=0.0)
    logp = torch.zeros_like(adv, requires_grad=True)
    for mode in LOSS_AGG_MODES:
        loss, _ = ppo_actor_loss(logp, logp.detach(), adv, mask, loss_agg_mode=mode, loss_scale_factor=8)
        assert float(loss.detach()) == pytest.approx(BY_HAND[mode][0], rel=1e-12)
        ones = torch.ones_like(adv)
        opmd, _ = opmd_policy_loss(ones, adv, mask, tau=1.0, loss_agg_mode=mode, loss_scale_factor=8)
        assert float(opmd.detach()) == pytest.approx(BY_HAND[mode][0] / 2, rel=1e-12)


class _Recorder:
    """A TrainEngine stand-in that records the units minibatch_steps hands it."""

    def __init__(self) -> None:
        self.units: list[float] = []

    def optimizer_step(self, micro_batches: Any, loss_fn: Any, local_units: float) -> dict[str, float]:
        self.units.append(local_units)
        return {"grad_norm": 0.0, "lr": 0.0}


def _sample(tokens: int, *, finished: bool = True, mask: list[int] | None = None, dummy: bool = False) -> Sample:
    return Sample([1, 2], list(range(3, 3 + tokens)), [-1.0] * tokens, 0.0, 0, finished, 0, loss_mask=mask,
                  dummy=dummy)


@pytest.mark.parametrize(("per_sequence", "mask_truncated", "want"),
                         [(False, False, 3 + 1 + 4), (True, False, 3), (False, True, 3 + 1), (True, True, 2)])
def test_the_engine_counts_sequences_with_a_trained_token(per_sequence: bool, mask_truncated: bool, want: int,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Units of a minibatch: its trained tokens, or (seq modes) its sequences with at least one: a sample whose
    tokens were all inserted (loss mask all 0), a dummy, and with mask_truncated a cut completion count none."""
    samples = [_sample(3), _sample(2, mask=[1, 0]), _sample(2, mask=[0, 0]), _sample(5, dummy=True),
               _sample(4, finished=False)]
    from rlkit.trainer import sample_forward

    monkeypatch.setattr(sample_forward, "micro_batches_idx", lambda sub, idx, spec: [idx])  # no collective here
    engine = _Recorder()
    minibatch_steps(engine, samples, [list(range(len(samples)))], MicroBatchSpec(), lambda m, g: (torch.zeros(()), 0),
                    mask_truncated=mask_truncated, per_sequence=per_sequence)  # type: ignore[arg-type]
    assert engine.units == [want]


@pytest.fixture(scope="module")
def equal_length_grads(tiny_model_dir: Any) -> dict[str, dict[str, torch.Tensor]]:
    """One real PPOActor step of the tiny model on one gloo rank per mode, its gradient recorded (no optimizer step,
    so every mode starts from the same weights): four samples of 4 trained tokens each, in 2 micro-batches, one
    sample cut (dropped by mask_no_eos_with_zero) and one whose tokens were all inserted (loss mask 0): sequences
    with no trained token."""
    import dataclasses

    import torch.distributed as dist

    from rlkit.config.schema.actor import ActorConfig
    from rlkit.servers.health import find_free_port
    from rlkit.trainer.actor import PPOActor

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{find_free_port()}", rank=0, world_size=1)
    try:
        base = ActorConfig(path=str(tiny_model_dir), dtype="float32", gradient_checkpointing=False, attn_impl="sdpa",
                           disable_dropout=True, logprob_chunk_tokens=16, ppo_n_minibatches=1, group_size=1,
                           mask_no_eos_with_zero=True, mb_spec=MicroBatchSpec(n_mbs=2))
        samples = [Sample([1, 2, 3], [20 + i, 21, 22, 23], [-1.0] * 4, 0.0, 0, True, i, advantage=0.3 * i - 0.5)
                   for i in range(4)]
        samples.append(Sample([1, 2], [30, 31, 32], [-1.0] * 3, 0.0, 0, False, 4, advantage=2.0))  # cut
        samples.append(Sample([1, 2], [40, 41], [-1.0] * 2, 0.0, 0, True, 5, advantage=2.0, loss_mask=[0, 0]))
        actor = PPOActor.build(base, rank=0, world=1, device=torch.device("cpu"), pad_id=0, temperature=1.0,
                               total_optimizer_steps=1)
        found: dict[str, torch.Tensor] = {}

        def record() -> float:
            found.update({n: p.grad.full_tensor().clone() for n, p in actor.engine.model.named_parameters()
                          if p.grad is not None})
            return 0.0

        actor.engine._clip_and_step = record  # type: ignore[method-assign]
        out: dict[str, dict[str, torch.Tensor]] = {}
        for mode, scale in (("token-mean", None), ("seq-mean-token-mean", None), ("seq-mean-token-sum", None),
                            ("seq-mean-token-sum-norm", 4)):
            actor.config = dataclasses.replace(base, loss_agg_mode=mode, loss_scale_factor=scale)
            actor.loss_scale_factor = scale
            found.clear()
            actor.train_step(samples, None, None)
            out[mode] = dict(found)
        return out
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize(("mode", "factor"), [("seq-mean-token-mean", 1.0), ("seq-mean-token-sum", 4.0),
                                              ("seq-mean-token-sum-norm", 1.0)])
def test_equal_lengths_tie_the_modes_through_the_real_engine(equal_length_grads: dict[str, dict[str, torch.Tensor]],
                                                             mode: str, factor: float) -> None:
    """Every trained sequence 4 tokens long: the mean of sequence means is the token mean, the mean of sequence
    sums 4 times it, the sums over 4 (seq-mean-token-sum-norm's constant) the token mean again. Through the real
    micro-batching and engine this holds only when the engine divides by the right global count of the right units
    (sequences with a trained token: the cut one and the inserted-only one are no sequence)."""
    want = equal_length_grads["token-mean"]
    got = equal_length_grads[mode]
    assert got.keys() == want.keys() and want
    for name, grad in want.items():
        assert torch.allclose(got[name], factor * grad, rtol=1e-4, atol=1e-7), name
