"""actor.prox_logp_method's approximation of the proximal log-probs (rlkit.trainer.rl_math.proximal), against
hand-computed values: AReaL's alpha = (current - 1 - v) / (current - v) per token, clamped, 0 for tokens at most one
version behind, ahead of the trainer, or not sampled; the metrics mode's errors."""

from __future__ import annotations

import math

import pytest
import torch

from rlkit.trainer.rl_math.proximal import (
    loglinear_alpha,
    loglinear_proximal,
    proximal_logp,
    stat_names,
    version_lists,
)
from rlkit.types import Sample

# one row, current version 5: not sampled (-1), at the trainer's version, 1, 2, 3 and 5 behind, one ahead (6)
VERSIONS = torch.tensor([[-1.0, 5.0, 4.0, 3.0, 2.0, 0.0, 6.0]])
ALPHA = [0.0, 0.0, 0.0, 1 / 2, 2 / 3, 4 / 5, 0.0]
BEHAV = torch.tensor([[-9.0, -2.0, -2.0, -2.0, -3.0, -1.0, -4.0]])
LOGP = torch.tensor([[-7.0, -1.0, -1.0, -1.0, -0.5, -2.0, -0.25]])


def test_alpha_per_token_by_how_many_versions_behind() -> None:
    assert loglinear_alpha(VERSIONS, 5)[0].tolist() == pytest.approx(ALPHA)
    # the same tokens seen by a trainer one version on: every sampled token one more behind
    assert loglinear_alpha(VERSIONS, 6)[0].tolist() == pytest.approx([0, 0, 1 / 2, 2 / 3, 3 / 4, 5 / 6, 0])


def test_mixed_versions_interpolate_each_token_in_log_space() -> None:
    got = loglinear_proximal(BEHAV, LOGP, VERSIONS, 5)[0].tolist()
    # behav + alpha * (logp - behav), by hand
    assert got == pytest.approx([-9.0, -2.0, -2.0, -1.5, -3.0 + (2 / 3) * 2.5, -1.0 + 0.8 * -1.0, -4.0])


def test_equal_versions_keep_the_behaviour_log_probs_as_areal() -> None:
    versions = torch.full((2, 3), 7.0)
    behav = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -0.25, -4.0]])
    assert torch.equal(loglinear_proximal(behav, behav - 1.0, versions, 7), behav)
    assert torch.equal(loglinear_proximal(behav, behav - 1.0, versions - 1.0, 7), behav)  # one behind: too


def test_no_gradient_flows_through_the_current_log_probs() -> None:
    logp = LOGP.clone().requires_grad_(True)
    assert not loglinear_proximal(BEHAV, logp, VERSIONS, 5).requires_grad


def test_an_episode_spanning_updates_has_each_tokens_version() -> None:
    episode = Sample([1], [5, 6, 7, 8], [-1.0] * 4, 0.0, 2, True, 0, token_versions=[2, -1, 3, 4])
    single = Sample([1], [5, 6], [-1.0] * 2, 0.0, 3, True, 0)
    assert version_lists([episode, single]) == {0: [2.0, -1.0, 3.0, 4.0], 1: [3.0, 3.0]}


def test_loglinear_mode_trains_on_the_approximation_and_says_its_mean_alpha() -> None:
    mask = VERSIONS >= 0
    prox, stats = proximal_logp("loglinear", None, BEHAV, LOGP, VERSIONS, 5, mask)
    assert torch.equal(prox, loglinear_proximal(BEHAV, LOGP, VERSIONS, 5))
    assert set(stats) == set(stat_names("loglinear"))
    assert float(stats["loglinear_alpha"]) == pytest.approx(sum(ALPHA) / 6)


def test_metrics_mode_trains_on_the_recomputed_and_measures_the_error() -> None:
    recomputed = torch.tensor([[-8.0, -1.5, -1.5, -1.25, -1.0, -1.5, -3.0]])
    mask = torch.tensor([[False, True, True, True, True, True, False]])  # the last token: a wild value, unmasked
    prox, stats = proximal_logp("metrics", recomputed, BEHAV, LOGP, VERSIONS, 5, mask)
    assert prox is recomputed
    assert set(stats) == set(stat_names("metrics"))
    approx = [-2.0, -2.0, -1.5, -3.0 + (2 / 3) * 2.5, -1.8]  # the masked positions 1..5
    rec = [-1.5, -1.5, -1.25, -1.0, -1.5]
    beh = [-2.0, -2.0, -2.0, -3.0, -1.0]
    cur = [-1.0, -1.0, -1.0, -0.5, -2.0]
    err = [abs(r - a) for r, a in zip(rec, approx, strict=True)]
    expected = {
        "loglinear_alpha": (0 + 0 + 1 / 2 + 2 / 3 + 4 / 5) / 5,
        "loglinear_abs_error": sum(err) / 5,
        "loglinear_rel_error": sum(e / abs(r) for e, r in zip(err, rec, strict=True)) / 5,
        "loglinear_squared_error": sum(e * e for e in err) / 5,
        "loglinear_behave_imp_weight_abs_error": sum(
            abs(math.exp(r - b) - math.exp(a - b)) for r, a, b in zip(rec, approx, beh, strict=True)) / 5,
        "loglinear_importance_weight_abs_error": sum(
            abs(math.exp(c - r) - math.exp(c - a)) for r, a, c in zip(rec, approx, cur, strict=True)) / 5,
        "rollout_abs_error": sum(abs(r - b) for r, b in zip(rec, beh, strict=True)) / 5,
    }
    assert {k: float(v) for k, v in stats.items()} == pytest.approx(expected, rel=1e-5)


def test_the_version_must_be_known_and_metrics_needs_the_recomputed() -> None:
    mask = VERSIONS >= 0
    with pytest.raises(RuntimeError, match=r"PPOActor\.current_version"):
        proximal_logp("loglinear", None, BEHAV, LOGP, VERSIONS, None, mask)
    with pytest.raises(ValueError, match="needs the recomputed"):
        proximal_logp("metrics", None, BEHAV, LOGP, VERSIONS, 5, mask)
    assert stat_names("recompute") == ()
