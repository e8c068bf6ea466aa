"""The push schedule's arithmetic (actor.weight_update_interval / weight_update_offset): versions count pushes, and
the staleness bound admits exactly the groups that stay within max_head_offpolicyness versions."""

from __future__ import annotations

import pytest

from rlkit.rollout.sync_schedule import SyncSchedule


def test_every_step_is_todays_schedule() -> None:
    s = SyncSchedule()
    assert [s.pushes_after(step) for step in range(5)] == [0, 1, 2, 3, 4]
    assert all(s.pushes_at(step) for step in range(1, 5))
    # today's admission bound: (version - base + max_off + 1) batches, base = the step resumed from
    assert s.admission_batches(version=3, max_offpolicyness=1, steps_done=3) == 2
    assert s.admission_batches(version=0, max_offpolicyness=0, steps_done=0) == 1


def test_interval_four_pushes_after_steps_4_8_12() -> None:
    s = SyncSchedule(interval=4)
    assert [step for step in range(1, 13) if s.pushes_at(step)] == [4, 8, 12]
    assert [s.pushes_after(step) for step in range(13)] == [0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3]
    # on-policy in versions: at version 0 the servers may generate the batches of steps 1-4, not step 5's
    assert s.admission_batches(version=0, max_offpolicyness=0, steps_done=0) == 4
    assert s.admission_batches(version=1, max_offpolicyness=0, steps_done=4) == 4
    assert s.admission_batches(version=0, max_offpolicyness=1, steps_done=0) == 8


def test_offset_generates_ahead_for_the_first_steps() -> None:
    s = SyncSchedule(interval=2, offset=3)
    assert [step for step in range(1, 10) if s.pushes_at(step)] == [5, 7, 9]
    assert [s.pushes_after(step) for step in range(10)] == [0, 0, 0, 0, 0, 1, 1, 2, 2, 3]
    assert s.admission_batches(version=0, max_offpolicyness=0, steps_done=0) == 5  # 3 ahead + one interval


@pytest.mark.parametrize("interval,offset,max_off", [(1, 0, 0), (1, 0, 2), (4, 0, 0), (4, 0, 1), (3, 2, 0),
                                                     (2, 5, 1)])
def test_admitted_groups_are_never_staler_than_the_bound(interval: int, offset: int, max_off: int) -> None:
    """Simulate: batches are started in order as soon as admission allows; every batch a step trains must be at most
    max_off versions behind the trainer's weights, and a step never waits for a batch admission refuses for good."""
    s = SyncSchedule(interval, offset)
    started: list[int] = []  # version each batch was started at
    for step in range(1, 40):
        version = s.pushes_after(step - 1)  # the servers' version while step `step` waits for its batch
        while len(started) < s.admission_batches(version, max_off, steps_done=0):
            started.append(version)
        assert len(started) >= step, "the batch of this step can never be admitted"
        trainer_version = s.pushes_after(step - 1)
        assert trainer_version - started[step - 1] <= max_off


def test_resumed_bound_counts_from_the_step_resumed() -> None:
    s = SyncSchedule(interval=4)
    # resumed after step 6 (no push since step 4): version 1, steps 7 and 8 still train on version 1
    assert s.pushes_after(6) == 1
    assert s.admission_batches(version=1, max_offpolicyness=0, steps_done=6) == 2


def test_bad_values() -> None:
    with pytest.raises(ValueError, match="interval"):
        SyncSchedule(0)
    with pytest.raises(ValueError, match="offset"):
        SyncSchedule(1, -1)
