from __future__ import annotations

import time
from collections.abc import Iterator

import psutil
import pytest

from arbiter.demo.node import LocalNode


@pytest.fixture
def node(tmp_path) -> Iterator[LocalNode]:
    n = LocalNode(tmp_path)
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
        while time.monotonic() - started < timeout:
            if Procs.state(pid) in states:
                return time.monotonic() - started
            time.sleep(0.01)
        raise AssertionError(f"process {pid} stayed {Procs.state(pid)!r}, not in {states} after {timeout}s")

    @staticmethod
    def cpu(pid: int) -> float:
        t = psutil.Process(pid).cpu_times()
        return t.user + t.system


@pytest.fixture
def procs() -> type[Procs]:
    return Procs
