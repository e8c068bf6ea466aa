"""The epoch schedule of the offline algorithms (rlkit.trainer.offline_epochs): which rows each step trains on."""

from __future__ import annotations

import pytest

from rlkit.errors import StepError
from rlkit.trainer.offline_epochs import EpochSchedule, data_digest, rank_share


def test_each_epoch_takes_every_row_at_most_once_and_drops_the_partial_batch() -> None:
    schedule = EpochSchedule(n_items=10, batch_size=3, epochs=2, seed=5)
    assert (schedule.steps_per_epoch, schedule.total_steps) == (3, 6)
    first = [schedule.rows(step) for step in (1, 2, 3)]
    flat = [row for rows in first for row in rows]
    assert all(len(rows) == 3 for rows in first) and len(set(flat)) == 9 and set(flat) <= set(range(10))
    second = [row for step in (4, 5, 6) for row in schedule.rows(step)]
    assert second != flat  # a new order each epoch
    assert [schedule.ends_epoch(s) for s in range(1, 7)] == [False, False, True, False, False, True]
    assert [schedule.epochs_done(s) for s in range(1, 7)] == [0, 0, 1, 1, 1, 2]


def test_the_rows_of_a_step_follow_from_the_step_alone() -> None:
    """A resumed run (a new schedule) takes exactly the rows the interrupted one would have."""
    straight = EpochSchedule(n_items=20, batch_size=4, epochs=3, seed=1)
    order = [straight.rows(step) for step in range(1, 16)]
    resumed = EpochSchedule(n_items=20, batch_size=4, epochs=3, seed=1)
    assert [resumed.rows(step) for step in range(9, 16)] == order[8:]
    assert EpochSchedule(n_items=20, batch_size=4, epochs=3, seed=2).rows(1) != order[0]
    assert EpochSchedule(n_items=8, batch_size=4, epochs=1, shuffle=False).rows(2) == [4, 5, 6, 7]


def test_total_train_steps_caps_the_epochs() -> None:
    assert EpochSchedule(n_items=20, batch_size=4, epochs=3, max_steps=7).total_steps == 7
    assert EpochSchedule(n_items=20, batch_size=4, epochs=1, max_steps=70).total_steps == 5
    capped = EpochSchedule(n_items=20, batch_size=4, epochs=3, max_steps=7)
    assert capped.ends_epoch(7)  # the last step ends the run: its eval runs


def test_a_resume_with_other_data_is_refused_by_name() -> None:
    schedule = EpochSchedule(n_items=20, batch_size=4, epochs=3, seed=1)
    saved = schedule.position(6)
    assert saved["epoch"] == 1 and saved["rows_into_epoch"] == 4
    schedule.check_resumed(saved)
    with pytest.raises(StepError, match="n_items=20"):
        EpochSchedule(n_items=21, batch_size=4, epochs=3, seed=1).check_resumed(saved)


def test_rank_shares_cover_a_step_once() -> None:
    rows = list(range(7))
    shares = [rank_share(rows, rank, 3) for rank in range(3)]
    assert sorted(r for share in shares for r in share) == rows
    assert max(map(len, shares)) - min(map(len, shares)) <= 1
    assert data_digest([(1, 2), (3,)]) != data_digest([(1, 2, 3)])
