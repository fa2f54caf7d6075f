"""The watchers of jobs an account may have waiting in the daemon: each holds one of its
connections, so past a quarter of them the rest are answered at once."""

from __future__ import annotations

from arbiter.daemon.jobops import Watchers


def test_an_account_has_at_most_its_share_of_watchers_waiting_and_others_their_own() -> None:
    watchers = Watchers()
    assert watchers.enter(1000, 2) and watchers.enter(1000, 2)
    assert not watchers.enter(1000, 2)  # answered at once: its commands still find a connection
    assert watchers.enter(1001, 2)  # another account's share is its own
    watchers.leave(1000)
    assert watchers.enter(1000, 2)
    for _ in range(2):
        watchers.leave(1000)
    assert watchers.enter(1000, 2) and watchers.enter(1000, 2)


def test_an_account_with_fewer_than_four_connections_has_none_to_spare_for_watchers() -> None:
    # its share is connections_per_uid // 4: with one connection, a waiting watcher would
    # hold the account's only one, and `arbiter job run` could not say its job ended
    assert not Watchers().enter(1000, 3 // 4)
