"""Processes watched for their end: a group is told of once all of its processes have ended
(a zombie counts), once for as long as it is asked for, with no wake-up while nothing ends."""

from __future__ import annotations

import errno
import os
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from arbiter_matchers import EXECS_KEY, EXITS_KEY, _execs, _exits, arbiter_watch_processes
from arbiter_testing.waiting import wait_until

pytestmark = pytest.mark.skipif(bool(_exits.unusable()), reason="no pidfds here")


class Told:
    def __init__(self) -> None:
        self.count = 0
        self.lock = threading.Lock()

        self.pids: set[int] = set()

    def __call__(self, pids: frozenset[int]) -> None:
        with self.lock:
            self.count += 1
            self.pids |= pids

    def now(self) -> int:
        with self.lock:
            return self.count


@pytest.fixture
def spawn() -> Iterator[list[subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for proc in procs:
        proc.kill()
        proc.wait()


def sleeper(procs: list[subprocess.Popen[bytes]]) -> int:
    procs.append(subprocess.Popen(["sleep", "600"]))
    return procs[-1].pid


def end(pid: int) -> None:
    """Kill it and leave it a zombie: its end is what is watched, not its reaping."""
    os.kill(pid, 9)


def test_a_group_is_told_of_once_every_process_of_it_has_ended(spawn: list[subprocess.Popen[bytes]]) -> None:
    told = Told()
    watch = _exits.ExitWatch(told)
    try:
        a1, a2, b = sleeper(spawn), sleeper(spawn), sleeper(spawn)
        watch.watch([frozenset({a1, a2}), frozenset({b})])
        end(a1)
        end(b)
        wait_until(lambda: told.now() >= 1, 10, "the single group's end told")
        assert told.now() == 1  # one of the pair runs on
        end(a2)
        wait_until(lambda: told.now() >= 2, 10, "the pair's end told")
        assert told.pids == {a1, a2, b}
    finally:
        watch.close()


def test_told_once_while_asked_for_and_a_group_already_gone_at_once(spawn: list[subprocess.Popen[bytes]]) -> None:
    told = Told()
    watch = _exits.ExitWatch(told)
    try:
        gone = sleeper(spawn)
        spawn[-1].kill()
        spawn[-1].wait()  # reaped: no pidfd can be had for it
        alive = sleeper(spawn)
        watch.watch([frozenset({gone}), frozenset({alive})])
        wait_until(lambda: told.now() >= 1, 10, "a group gone before it was watched told at once")
        watch.watch([frozenset({gone}), frozenset({alive}), frozenset({sleeper(spawn)})])
        end(alive)
        wait_until(lambda: told.now() >= 2, 10, "the next end told")
        assert told.now() == 2  # the group gone before is not told of again
    finally:
        watch.close()


def test_groups_past_the_caps_are_left_to_the_tick(
    spawn: list[subprocess.Popen[bytes]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_exits, "MAX_GROUP", 1)
    told = Told()
    watch = _exits.ExitWatch(told)
    try:
        big = frozenset({sleeper(spawn), sleeper(spawn)})
        small = sleeper(spawn)
        watch.watch([big, frozenset({small})])
        for pid in big:
            end(pid)
        end(small)
        wait_until(lambda: told.now() >= 1, 10, "the small group's end told")
        assert told.now() == 1
    finally:
        watch.close()


def test_the_hook_keeps_one_watch_and_close_gives_its_descriptors_back(spawn: list[subprocess.Popen[bytes]]) -> None:
    before = len(os.listdir("/proc/self/fd"))
    told = Told()
    scratch: dict[str, object] = {}
    pids = [sleeper(spawn) for _ in range(3)]
    assert (
        arbiter_watch_processes(groups=[frozenset(pids)], ended=told, starts=None, started=_nothing, scratch=scratch)
        is True
    )
    watch = scratch[EXITS_KEY]
    assert (
        arbiter_watch_processes(
            groups=[frozenset(pids[:1])], ended=told, starts=None, started=_nothing, scratch=scratch
        )
        is True
    )
    assert scratch[EXITS_KEY] is watch
    end(pids[0])
    wait_until(lambda: told.now() == 1, 10, "the group asked for last told")
    assert isinstance(watch, _exits.ExitWatch)
    for each in scratch.values():  # the watch of starts too, where it could be had
        if hasattr(each, "close"):
            each.close()
    assert not any(t.name in ("arbiter-exits", "arbiter-execs") and t.is_alive() for t in threading.enumerate())
    assert len(os.listdir("/proc/self/fd")) <= before


def test_without_pidfds_it_says_so_and_starts_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    def refused(pid: int) -> int:
        raise OSError(errno.ENOSYS, "Function not implemented")

    monkeypatch.setattr(os, "pidfd_open", refused)
    monkeypatch.setattr(_execs, "unusable", lambda: "no connector in this test")
    scratch: dict[str, object] = {}
    threads = threading.active_count()
    assert (
        arbiter_watch_processes(
            groups=[frozenset({os.getpid()})], ended=Told(), starts=None, started=_nothing, scratch=scratch
        )
        is None
    )
    assert "ENOSYS" in str(scratch[EXITS_KEY])
    assert arbiter_watch_processes(groups=[], ended=Told(), starts=None, started=_nothing, scratch=scratch) is None
    assert threading.active_count() == threads


def test_a_watch_that_cannot_start_keeps_no_descriptor_and_is_not_tried_again(monkeypatch: pytest.MonkeyPatch) -> None:
    def cannot(self: threading.Thread) -> None:
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(threading.Thread, "start", cannot)
    before = len(os.listdir("/proc/self/fd"))
    scratch: dict[str, object] = {}
    for _ in range(3):
        assert arbiter_watch_processes(groups=[], ended=Told(), starts=None, started=_nothing, scratch=scratch) is None
    assert "could not start" in str(scratch[EXITS_KEY])
    assert isinstance(scratch[EXECS_KEY], str)  # why the watch of starts is not there either
    assert len(os.listdir("/proc/self/fd")) == before


def test_a_watch_closed_writes_nowhere_after(spawn: list[subprocess.Popen[bytes]], tmp_path: Path) -> None:
    watch = _exits.ExitWatch(Told())
    watch.close()
    # files opened now may get the pipe's old descriptors: a later watch must not write there
    reused = [os.open(tmp_path / f"f{n}", os.O_RDWR | os.O_CREAT) for n in range(4)]
    try:
        watch.watch([frozenset({sleeper(spawn)})])
        watch.close()  # twice is harmless
        assert all(os.pread(fd, 16, 0) == b"" for fd in reused)
    finally:
        for fd in reused:
            os.close(fd)


def _nothing() -> None:
    return None
