"""rlkit.rollout.silence: when a server that stopped answering /health counts as silent, and when it is back."""

from __future__ import annotations

from rlkit.rollout.silence import SilenceWatch


def test_a_server_is_silent_once_it_has_not_answered_for_the_timeout_and_back_at_its_next_answer() -> None:
    watch = SilenceWatch(timeout=30.0)
    assert watch.update({0: True, 1: True}, now=0.0) == ([], [])
    assert watch.update({0: True, 1: False}, now=20.0) == ([], [])  # 20 s without an answer: not yet
    assert watch.update({0: True, 1: False}, now=30.0) == ([], [])  # exactly the timeout: not yet
    assert watch.update({0: True, 1: False}, now=31.0) == ([1], [])
    assert watch.update({0: True, 1: False}, now=40.0) == ([], [])  # said once
    assert watch.silent == {1} and watch.silenced == 1
    assert watch.update({0: True, 1: True}, now=45.0) == ([], [1])
    assert watch.silent == set()


def test_a_server_first_seen_silent_gets_the_whole_timeout() -> None:
    watch = SilenceWatch(timeout=10.0)
    assert watch.update({2: False}, now=100.0) == ([], [])  # a restarted server, not answering yet
    assert watch.update({2: False}, now=109.0) == ([], [])
    assert watch.update({2: False}, now=111.0) == ([2], [])
