"""The daemon tells a service manager it is ready, alive and stopping, over $NOTIFY_SOCKET."""

from __future__ import annotations

import os
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from arbiter.daemon.notify import Notifier, watchdog_interval
from arbiter_testing.node import HarnessNode


class Receiver:
    """A service manager's end: a real datagram socket bound in a temporary folder."""

    def __init__(self, address: str | bytes) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(address)
        self.messages: list[dict[str, str]] = []

    def next(self, timeout: float = 30.0) -> dict[str, str]:
        self.sock.settimeout(timeout)
        data = self.sock.recv(4096).decode()
        message = dict(line.split("=", 1) for line in data.splitlines() if line)
        self.messages.append(message)
        return message

    def until(self, key: str, timeout: float = 30.0) -> dict[str, str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            message = self.next(max(0.1, deadline - time.monotonic()))
            if key in message:
                return message
        raise AssertionError(f"no {key} within {timeout}s; got {self.messages}")

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def short_dir() -> Iterator[Path]:
    # AF_UNIX paths are limited to ~100 bytes: pytest's tmp_path can be longer
    import tempfile

    with tempfile.TemporaryDirectory(prefix="arb-") as d:
        yield Path(d)


def test_nothing_is_sent_without_a_socket() -> None:
    env: dict[str, str] = {"WATCHDOG_USEC": "1000000"}
    n = Notifier.from_environ(env)
    assert not n.enabled and n.interval_s is None
    assert n.ready("x") is False and n.alive(0.0) is False and n.stopping() is False


def test_messages_reach_a_path_socket_and_the_variables_are_taken(short_dir: Path) -> None:
    rx = Receiver(str(short_dir / "notify"))
    env = {
        "NOTIFY_SOCKET": str(short_dir / "notify"),
        "WATCHDOG_USEC": "4000000",
        "WATCHDOG_PID": str(os.getpid()),
        "KEEP": "1",
    }
    n = Notifier.from_environ(env)
    assert env == {"KEEP": "1"}  # children the daemon starts must not speak for it
    assert n.interval_s == 2.0
    assert n.ready("serving")
    first = rx.next()
    assert first["READY"] == "1" and first["STATUS"] == "serving" and first["MAINPID"] == str(os.getpid())
    assert n.alive(100.0, lambda: "3 rule(s)")
    assert rx.next() == {"WATCHDOG": "1", "STATUS": "3 rule(s)"}
    assert not n.alive(101.0)  # not yet half the timeout since the last ping
    assert n.alive(102.0)
    assert rx.next()["WATCHDOG"] == "1"
    assert n.stopping()
    assert rx.next()["STOPPING"] == "1"
    n.close()
    rx.close()


def test_an_abstract_address() -> None:
    name = f"arbiter-test-{os.getpid()}-{time.monotonic_ns()}"
    rx = Receiver(b"\0" + name.encode())
    n = Notifier(f"@{name}", None)
    assert n.ready("up")
    assert rx.next()["READY"] == "1"
    n.close()
    rx.close()


def test_the_watchdog_belongs_to_the_pid_it_names() -> None:
    assert watchdog_interval({"WATCHDOG_USEC": "1000000", "WATCHDOG_PID": "1"}, pid=4242) is None
    assert watchdog_interval({"WATCHDOG_USEC": "1000000", "WATCHDOG_PID": "4242"}, pid=4242) == 0.5
    assert watchdog_interval({"WATCHDOG_USEC": "1000000"}, pid=4242) == 0.5
    assert watchdog_interval({"WATCHDOG_USEC": "0"}, pid=4242) is None
    assert watchdog_interval({"WATCHDOG_USEC": "soon"}, pid=4242) is None


def test_a_full_or_missing_receiver_never_blocks_nor_raises(short_dir: Path) -> None:
    missing = Notifier(str(short_dir / "nobody"), 1.0)
    assert missing.ready("x") is False  # no such socket: dropped, said once in the log
    rx = Receiver(str(short_dir / "notify"))
    full = Notifier(str(short_dir / "notify"), None)
    # nobody reads: the receiver's queue fills and a blocking send would hang here forever
    sent = 0
    while full.status("x" * 1000):
        sent += 1
        assert sent < 100_000, "the queue never filled"
    started = time.monotonic()
    assert full.status("one more") is False
    assert time.monotonic() - started < 5.0
    rx.next()  # the manager reads again: sending works again
    assert full.status("again") or full.status("again")
    full.close()
    missing.close()
    rx.close()


def test_a_real_daemon_is_ready_pings_and_says_stopping(tmp_path: Path, short_dir: Path) -> None:
    rx = Receiver(str(short_dir / "notify"))
    node = HarnessNode(tmp_path)
    try:
        # 1 s between pings; the node ticks every 0.5 s
        node.start(NOTIFY_SOCKET=str(short_dir / "notify"), WATCHDOG_USEC="2000000")
        assert node.daemon is not None
        ready = rx.until("READY")
        assert ready["READY"] == "1" and ready["MAINPID"] == str(node.daemon.pid)
        assert "rule(s)" in ready["STATUS"] and "arbiter.sock" in ready["STATUS"]
        pings = [rx.until("WATCHDOG") for _ in range(3)]
        assert all(p["WATCHDOG"] == "1" and "active job(s)" in p["STATUS"] for p in pings)
        node.daemon.send_signal(signal.SIGTERM)
        stopping = rx.until("STOPPING")
        assert stopping["STOPPING"] == "1"
        assert node.daemon.wait(30) == 0
        assert sum("READY" in m for m in rx.messages) == 1, rx.messages  # (a ping may come before it)
    finally:
        node.close()
        rx.close()


def test_a_watchdog_meant_for_another_process_gets_no_pings(tmp_path: Path, short_dir: Path) -> None:
    rx = Receiver(str(short_dir / "notify"))
    node = HarnessNode(tmp_path)
    try:
        node.start(NOTIFY_SOCKET=str(short_dir / "notify"), WATCHDOG_USEC="1000000", WATCHDOG_PID="1")
        assert rx.until("READY")["READY"] == "1"
        assert node.daemon is not None
        node.daemon.send_signal(signal.SIGTERM)
        rx.until("STOPPING")
        assert not any("WATCHDOG" in m for m in rx.messages)
    finally:
        node.close()
        rx.close()
