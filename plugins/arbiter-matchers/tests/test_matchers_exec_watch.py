"""Programs seen when they start: a socket of the kernel's process events that lets through
execs alone, and a watch that tells of a program its caller's ``starts`` selects, and of no
other."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

from arbiter.plugin import ProcessInfo
from arbiter_matchers import EXECS_KEY, _execs, _procevents, arbiter_watch_processes
from arbiter_matchers._procscan import ProcScan, Record
from arbiter_testing.waiting import wait_until

pytestmark = pytest.mark.skipif(
    bool(_execs.unusable()), reason=f"the process-events connector cannot be had here: {_execs.unusable()}"
)


class Told:
    def __init__(self) -> None:
        self.count = 0
        self.lock = threading.Lock()

    def __call__(self) -> None:
        with self.lock:
            self.count += 1

    def now(self) -> int:
        with self.lock:
            return self.count


class Judged:
    """A ``starts`` that selects the programs whose command line holds ``marker``, and keeps
    every pid it was asked of."""

    def __init__(self, marker: str) -> None:
        self.marker = marker
        self.asked: list[ProcessInfo] = []
        self.lock = threading.Lock()

    def __call__(self, p: ProcessInfo) -> bool:
        with self.lock:
            self.asked.append(p)
        return any(self.marker in arg for arg in p.cmdline)

    def pids(self) -> set[int]:
        with self.lock:
            return {p.pid for p in self.asked}


def test_the_socket_lets_through_execs_alone() -> None:
    sock = _execs.exec_socket()
    try:
        # a fork that execs nothing, then one that execs: only the second is let through
        forked = os.fork()
        if forked == 0:
            os._exit(0)
        os.waitpid(forked, 0)
        program = subprocess.run(["true"], check=True)
        assert program.returncode == 0
        whats: list[int] = []
        pids: list[int] = []

        def drained() -> bool:
            while True:
                try:
                    data = sock.recv(4096, socket.MSG_DONTWAIT)
                except BlockingIOError:
                    return bool(pids)
                whats.append(_procevents._EVENT.unpack_from(data, _procevents._HEADERS)[0])
                pids.extend(_execs.exec_pids(data))

        wait_until(drained, 10, "the exec of true")
        assert set(whats) == {_procevents.PROC_EVENT_EXEC}
        assert forked not in pids
    finally:
        sock.close()


def test_the_execs_of_a_busy_quarter_second_wait_in_the_socket_unlost() -> None:
    # a shell loop or a build execs a thousand programs a second: those of a pause between two
    # batches fit in the socket, where an overflow would bring a tick forward as a start
    sock = _execs.exec_socket()
    try:
        subprocess.run(["sh", "-c", "i=0; while [ $i -lt 600 ]; do /bin/true; i=$((i+1)); done"], check=True)
        read = 0
        while True:
            try:
                read += len(_execs.exec_pids(sock.recv(4096, socket.MSG_DONTWAIT)))
            except BlockingIOError:
                break
        assert read >= 600
    finally:
        sock.close()


def test_a_program_started_is_told_of_only_when_selected(tmp_path: Path) -> None:
    marker = f"exec-watch-{os.getpid()}"
    told, judged = Told(), Judged(marker)
    watch = _execs.ExecWatch(told)
    try:
        watch.watch(judged)
        other = subprocess.Popen(["sleep", "30"])
        wait_until(lambda: other.pid in judged.pids(), 10, "the other program judged")
        assert told.now() == 0
        # $0: its shell names it, and stays (a program judged a while after its exec is read as
        # it is then)
        selected = subprocess.Popen(["sh", "-c", "sleep 30; :", marker], start_new_session=True)
        wait_until(lambda: told.now() == 1, 10, "the selected program told of")
        assert judged.asked[-1].pid == selected.pid
        assert judged.asked[-1].ppid == os.getpid()
        other.kill()
        os.killpg(selected.pid, signal.SIGKILL)
        for proc in (other, selected):
            proc.wait()
    finally:
        watch.close()
    assert not any(t.name == "arbiter-execs" and t.is_alive() for t in threading.enumerate())


def test_execs_being_read_when_watch_is_called_are_judged_by_what_it_was_given(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # the first call comes right after the watch starts: execs of the machine's other work
    # woke its thread then, and a protected program's exec read with them went unjudged
    marker = f"exec-watch-batch-{os.getpid()}"
    reading, may_go = threading.Event(), threading.Event()
    real = _execs.exec_pids

    def held(data: bytes) -> list[int]:
        reading.set()
        may_go.wait(10)
        return real(data)

    monkeypatch.setattr(_execs, "exec_pids", held)
    told, judged = Told(), Judged(marker)
    watch = _execs.ExecWatch(told)
    selected = subprocess.Popen(["sh", "-c", "sleep 30; :", marker], start_new_session=True)
    try:
        assert reading.wait(10), "the watch's thread did not read the exec"
        watch.watch(judged)
        may_go.set()
        wait_until(lambda: told.now() == 1, 10, "the selected program told of")
    finally:
        may_go.set()
        os.killpg(selected.pid, signal.SIGKILL)
        selected.wait()
        watch.close()


def test_without_the_connector_it_says_why_and_opens_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_execs, "unusable", lambda: "it needs CAP_NET_ADMIN, which this process does not have")
    before = len(os.listdir("/proc/self/fd"))
    scratch: dict[str, object] = {}
    for _ in range(2):
        arbiter_watch_processes(groups=[], ended=lambda pids: None, starts=bool, started=Told(), scratch=scratch)
    assert "CAP_NET_ADMIN" in str(scratch[EXECS_KEY])
    assert not any(t.name == "arbiter-execs" and t.is_alive() for t in threading.enumerate())
    for each in scratch.values():
        if hasattr(each, "close"):
            each.close()
    assert len(os.listdir("/proc/self/fd")) <= before


def test_a_read_of_proc_stuck_in_the_kernel_gives_the_watch_up_without_holding_the_tick(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # reading a command line waits on the process's address space, which a process hung on a
    # network filesystem can hold for as long as it hangs: the tick, whose reads are bounded,
    # then finds the starts, and is not held up by the stuck thread
    marker = f"exec-watch-stuck-{os.getpid()}"
    reading, may_go = threading.Event(), threading.Event()

    def stuck(self: object, pids: list[int]) -> tuple[list[int], list[Record]]:
        reading.set()
        may_go.wait(30)
        # a program the rule selects: told of, were the watch not given up by then
        return pids, [(pids[0], 1, "sh", "/bin/sh", ("sh", marker), 0, "root", 0.0, "S", 0)]

    monkeypatch.setattr(_execs, "READ_LIMIT_S", 0.2)
    monkeypatch.setattr(ProcScan, "read", stuck)
    before = len(os.listdir("/proc/self/fd"))
    scratch: dict[str, object] = {}
    told, judged = Told(), Judged(marker)
    assert arbiter_watch_processes(groups=[], ended=lambda pids: None, starts=judged, started=told, scratch=scratch)
    watch = scratch[EXECS_KEY]
    assert isinstance(watch, _execs.ExecWatch)
    started = subprocess.Popen(["sleep", "30"])
    try:
        assert reading.wait(10), "the watch's thread did not read the exec"
        wait_until(lambda: bool(watch.broken), 10, "the stuck read seen")
        assert "has not returned" in watch.broken
        began = time.monotonic()
        arbiter_watch_processes(groups=[], ended=lambda pids: None, starts=judged, started=told, scratch=scratch)
        assert time.monotonic() - began < 1.0
        assert "has not returned" in str(scratch[EXECS_KEY])
    finally:
        may_go.set()
        started.kill()
        started.wait()
        for each in scratch.values():
            if hasattr(each, "close"):
                each.close()
    wait_until(
        lambda: not any(t.name == "arbiter-execs" and t.is_alive() for t in threading.enumerate()),
        10,
        "the stuck thread ended once its read returned",
    )
    assert told.now() == 0
    assert len(os.listdir("/proc/self/fd")) <= before  # its thread released its descriptors
