from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from arbiter_testing.node import HarnessNode
from arbiter_testing.waiting import wait_until


@pytest.fixture
def node(tmp_path: Path) -> Iterator[HarnessNode]:
    n = HarnessNode(tmp_path)
    yield n
    n.close()


class Procs:
    """Looking at real processes from a test."""

    @staticmethod
    def state(pid: int) -> str:
        try:
            return psutil.Process(pid).status()
        except psutil.NoSuchProcess:
            return "gone"

    @staticmethod
    def wait(pid: int, states: set[str], timeout: float = 10.0) -> float:
        """Wait until the process is in one of ``states``; returns how long it took."""
        started = time.monotonic()
        wait_until(lambda: Procs.state(pid) in states, timeout, f"process {pid} to be one of {sorted(states)}")
        return time.monotonic() - started

    @staticmethod
    def cpu(pid: int) -> float:
        t = psutil.Process(pid).cpu_times()
        return t.user + t.system

    @staticmethod
    def cpu_beside(pid: int, busy_pid: int, busy_s: float, timeout: float = 120.0) -> tuple[float, float]:
        """The CPU time ``pid`` spent, and the time ``busy_pid`` spent, while ``busy_pid`` (a
        program that works without pause) spent ``busy_s`` more.

        A window measured in a busy program's own CPU time, not in seconds: a loaded machine
        stretches it but gives every process in it its share of the cores, so what ``pid``
        spent beside it means the same on a busy machine as on an idle one.
        """
        start, busy_start = Procs.cpu(pid), Procs.cpu(busy_pid)
        busy_end = wait_until(
            lambda: (now := Procs.cpu(busy_pid)) >= busy_start + busy_s and now,
            timeout,
            f"process {busy_pid} to spend {busy_s:g}s of CPU time",
            poll_s=0.05,
        )
        return Procs.cpu(pid) - start, busy_end - busy_start

    @staticmethod
    def spends(pid: int, cpu_s: float, timeout: float = 120.0) -> float:
        """Wait until ``pid`` has spent ``cpu_s`` more CPU time (however long that takes on a
        loaded machine); what it had spent when the wait began."""
        start = Procs.cpu(pid)
        wait_until(
            lambda: Procs.cpu(pid) - start >= cpu_s, timeout, f"process {pid} to spend {cpu_s:g}s of CPU", poll_s=0.05
        )
        return start


@pytest.fixture
def procs() -> type[Procs]:
    return Procs
