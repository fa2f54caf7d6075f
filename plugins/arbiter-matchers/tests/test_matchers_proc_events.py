"""The process table read only when the kernel's process events say it can have changed:
what the events announce, a table read at once after a change, the last table (without CPU
times) while nothing changed, and the scan on every read once the event source dies or goes
deaf, so that a new program is in the very next table either way."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from arbiter.plugin import ProcessInfo
from arbiter_matchers import _procevents, _procscan, table
from arbiter_matchers._procevents import (
    PROC_EVENT_COMM,
    PROC_EVENT_EXEC,
    PROC_EVENT_EXIT,
    PROC_EVENT_FORK,
    ProcEvents,
    _take,
)
from arbiter_matchers.table import TableMemo
from arbiter_testing.waiting import wait_until

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the connector is Linux's")


def event(what: int, a: int, b: int, c: int = 0, d: int = 0) -> bytes:
    """One connector message as the kernel sends it: netlink header, connector header, event."""
    body = struct.pack("=IIQ", what, 0, 0) + struct.pack("=IIII", a, b, c, d) + bytes(8)
    cn = struct.pack("=IIIIHH", 1, 1, 0, 0, len(body), 0) + body
    return struct.pack("=IHHII", 16 + len(cn), 3, 0, 0, 0) + cn


def test_what_the_events_announce() -> None:
    born: set[int] = set()
    touched: set[int] = set()
    # a process born and gone between two reads is read (and found gone); a thread is no process
    _take(event(PROC_EVENT_FORK, 1, 1, 500, 500), born, touched)
    _take(event(PROC_EVENT_EXEC, 500, 500), born, touched)
    assert born == {500} and touched == set()
    _take(event(PROC_EVENT_EXIT, 500, 500), born, touched)
    _take(event(PROC_EVENT_FORK, 7, 7, 501, 7), born, touched)
    _take(event(PROC_EVENT_EXIT, 501, 7), born, touched)
    assert born == set() and touched == {500}
    touched.clear()
    # one that was there and exits, execs or takes another name is to be read again
    _take(event(PROC_EVENT_EXIT, 42, 42), born, touched)
    _take(event(PROC_EVENT_EXEC, 43, 43), born, touched)
    _take(event(PROC_EVENT_COMM, 44, 44), born, touched)
    _take(event(PROC_EVENT_COMM, 45, 44), born, touched)  # a thread's name is no process's
    assert touched == {42, 43, 44}


def test_a_pid_reused_and_gone_between_two_reads_keeps_the_old_exit() -> None:
    born: set[int] = set()
    touched: set[int] = set()
    _take(event(PROC_EVENT_EXIT, 600, 600), born, touched)  # a process the table holds exits
    _take(event(PROC_EVENT_FORK, 1, 1, 600, 600), born, touched)  # its pid is reused
    _take(event(PROC_EVENT_EXIT, 600, 600), born, touched)  # and the new one exits too
    assert born == set() and touched == {600}


@pytest.fixture
def memo() -> Iterator[TableMemo]:
    memo = TableMemo(in_child=True, events=True)
    if not memo.events_in_use:
        memo.close()
        pytest.skip(f"no process events here: {memo.events_why}")
    try:
        yield memo
    finally:
        memo.close()


def pids(rows: list[ProcessInfo]) -> set[int]:
    return {p.pid for p in rows}


def test_a_new_program_and_its_end_are_in_the_next_table(memo: TableMemo) -> None:
    memo.table()
    child = subprocess.Popen(["sleep", "600"])
    try:
        assert child.pid in pids(memo.table())
    finally:
        child.kill()
        child.wait()
    assert child.pid not in pids(memo.table())
    assert memo.events_in_use


def test_a_failed_read_of_what_the_events_name_reads_everything_at_once(
    memo: TableMemo, monkeypatch: pytest.MonkeyPatch
) -> None:
    memo.table()
    owner = memo._reader if memo._child is not None and memo._from_child else memo._scan
    name = "read"
    real = getattr(owner, name)
    failures: list[tuple[object, ...]] = []

    def fails_once(*args: object) -> object:
        if not failures:
            failures.append(args)
            raise OSError("a read cut short")
        return real(*args)

    monkeypatch.setattr(owner, name, fails_once)
    child = subprocess.Popen(["sleep", "600"])
    try:
        assert child.pid in pids(memo.table())
        assert failures and memo.events_in_use
    finally:
        child.kill()
        child.wait()


def test_while_nothing_changes_nothing_is_read_and_what_an_event_names_is_read_alone(
    memo: TableMemo, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a read that nothing changed during (on a busy machine, one of the next few)
    def quiet_read() -> list[ProcessInfo] | None:
        rows = memo.table()
        return rows if memo._quiet is not None else None

    first = wait_until(quiet_read, 30, "a quiet read")
    assert memo._events is not None
    told: set[int] = set()
    monkeypatch.setattr(memo._events, "changes", lambda: set(told))  # a machine where nothing happens
    monkeypatch.setattr(table, "_process_count", lambda: memo._count)
    scans: list[int] = []
    real = memo._scan_table

    def counted() -> list[ProcessInfo]:
        scans.append(1)
        return real()

    monkeypatch.setattr(memo, "_scan_table", counted)
    quiet = memo.table()
    assert not scans and pids(quiet) == pids(first)
    assert all(p.cpu_ns is None for p in quiet)  # a reader reads the CPU times it needs itself
    assert memo.table()[0] is quiet[0]  # the same records: matchers keep their verdicts
    # what an event names is read again, alone
    child = subprocess.Popen(["sleep", "600"])
    try:
        told.add(child.pid)
        assert child.pid in pids(memo.table())
        told.clear()
        os.kill(child.pid, signal.SIGSTOP)
        told.add(child.pid)  # (no event says so: as one for it would)
        wait_until(lambda: next(p for p in memo.table() if p.pid == child.pid).state == "T", 10, "it read stopped")
        assert not scans
    finally:
        child.kill()
        child.wait()
    told.clear()
    monkeypatch.setattr(memo, "_scanned_at", memo._scanned_at - table.FULL_SCAN_S)
    memo.table()
    assert scans == [1]  # and all are read again at least every FULL_SCAN_S


def test_with_its_event_source_killed_a_new_program_is_in_the_next_table(memo: TableMemo) -> None:
    memo.table()
    assert memo._events is not None and memo._events._sock is not None
    memo._events._sock.close()  # the source dies under it
    child = subprocess.Popen(["sleep", "600"])
    try:
        assert child.pid in pids(memo.table())
        assert not memo.events_in_use and "failed" in memo.events_why
        again = subprocess.Popen(["sleep", "601"])
        try:
            assert again.pid in pids(memo.table())  # from then on every read scans
        finally:
            again.kill()
            again.wait()
    finally:
        child.kill()
        child.wait()


def test_with_its_event_source_deaf_a_new_program_is_in_the_next_table(memo: TableMemo) -> None:
    memo.table()
    assert memo._events is not None and memo._events._sock is not None
    memo._events._sock.close()
    # a socket that hears nothing, as one in a network namespace the connector does not speak in
    memo._events._sock = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, _procevents.NETLINK_CONNECTOR)
    child = subprocess.Popen(["sleep", "600"])
    try:
        assert child.pid in pids(memo.table())  # a pid was handed out with no fork heard
    finally:
        child.kill()
        child.wait()


def test_with_its_event_source_deaf_a_birth_beside_a_death_is_in_the_next_table(memo: TableMemo) -> None:
    """One process gone and one born leave the machine's process count as it was: the newest
    pid the kernel handed out still tells that something was born, and the deaf source is
    given up."""
    old = subprocess.Popen(["sleep", "602"])
    try:
        wait_until(lambda: old.pid in pids(memo.table()), 10, "the old program in the table")
        assert memo._events is not None and memo._events._sock is not None
        memo._events._sock.close()
        memo._events._sock = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, _procevents.NETLINK_CONNECTOR)
    finally:
        old.kill()
        old.wait()
    child = subprocess.Popen(["sleep", "600"])
    try:
        assert child.pid in pids(memo.table())
        assert not memo.events_in_use and "no event announced" in memo.events_why
    finally:
        child.kill()
        child.wait()


def test_where_it_cannot_listen_it_says_why_and_scans() -> None:
    if not _procevents.unusable():
        pytest.skip("this process may listen")
    memo = TableMemo(events=True)
    try:
        assert not memo.events_in_use and "cannot be had" in memo.events_why
    finally:
        memo.close()


def test_it_cannot_open_without_the_right_to_listen(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_procevents, "unusable", lambda: "it needs CAP_NET_ADMIN")
    with pytest.raises(OSError, match="CAP_NET_ADMIN"):
        ProcEvents()


def test_an_exec_that_keeps_the_name_and_size_is_in_the_table_its_event_brings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    # perl re-executing perl: the same name, and all but surely the same address-space size,
    # so only its command line tells the new program from the old; the scans' occasional
    # recheck of command lines is kept out of the way (it runs in this process, not a child)
    monkeypatch.setattr(_procscan, "CMDLINE_RECHECK_SCANS", 1 << 40)
    memo = TableMemo(events=True)
    request.addfinalizer(memo.close)
    if not memo.events_in_use:
        pytest.skip(f"no process events here: {memo.events_why}")
    go = tmp_path / "go"
    perl = shutil.which("perl")
    if perl is None:
        pytest.skip("no perl here")
    script = 'sleep 1 until -e $ARGV[0]; exec {$ARGV[1]} "perl", "-e", "sleep 600", "PROTECTED-MARKER"'
    child = subprocess.Popen([perl, "-e", script, str(go), perl])
    try:
        wait_until(lambda: child.pid in pids(memo.table()), 10, "the first program in the table")
        assert memo._events is not None
        told: list[set[int] | None] = []
        real = memo._events.changes

        def changes() -> set[int] | None:
            named = real()
            told.append(named)
            return named

        monkeypatch.setattr(memo._events, "changes", changes)
        go.touch()
        cmdline = f"/proc/{child.pid}/cmdline"
        wait_until(lambda: b"PROTECTED-MARKER" in Path(cmdline).read_bytes(), 10, "the exec")

        # the read whose events name it (the exec's: it was born before), or all were lost
        def table_told() -> list[ProcessInfo] | None:
            told.clear()
            rows = memo.table()
            return rows if any(named is None or child.pid in named for named in told) else None

        rows = wait_until(table_told, 10, "the exec's event")
        row = next(p for p in rows if p.pid == child.pid)
        assert "PROTECTED-MARKER" in row.cmdline
        assert memo.events_in_use
    finally:
        child.kill()
        child.wait()


def test_a_process_born_and_gone_while_the_full_scan_reads_is_no_miss(
    memo: TableMemo, monkeypatch: pytest.MonkeyPatch
) -> None:
    memo.table()
    real = memo._scan_table
    passing: list[int] = []

    def scan_seeing_one_pass() -> list[ProcessInfo]:
        child = subprocess.Popen(["sleep", "600"])
        try:
            rows = real()
            assert child.pid in pids(rows)
        finally:
            child.kill()
            child.wait()
        passing.append(child.pid)
        return rows

    monkeypatch.setattr(memo, "_scan_table", scan_seeing_one_pass)
    monkeypatch.setattr(memo, "_scanned_at", memo._scanned_at - table.FULL_SCAN_S)
    memo.table()  # the full scan, checking what the events told against what it found
    monkeypatch.undo()
    assert passing and memo.events_in_use, memo.events_why
    assert passing[0] not in pids(memo.table())


def test_what_the_events_name_is_read_here_and_the_childs_next_scan_reads_it_afresh(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    # perl re-executing perl (the same name and size: only the command line tells), with the
    # scans in a child: the exec's event is read in this process, without a round trip, and
    # the child's next scan, which read the old program, reads it afresh rather than bring
    # the old command line back once the process's state changes (stopped here)
    memo = TableMemo(in_child=True, events=True)
    request.addfinalizer(memo.close)
    if not memo.events_in_use:
        pytest.skip(f"no process events here: {memo.events_why}")
    perl = shutil.which("perl")
    if perl is None:
        pytest.skip("no perl here")
    go = tmp_path / "go"
    script = 'sleep 1 until -e $ARGV[0]; exec {$ARGV[1]} "perl", "-e", "sleep 600", "PROTECTED-MARKER"'
    child = subprocess.Popen([perl, "-e", script, str(go), perl])
    try:
        wait_until(lambda: child.pid in pids(memo.table()), 10, "the first program in the table")
        assert memo._child is not None and memo._from_child, memo.child_failure
        asked: list[object] = []
        real_call = memo._child.call

        def call(request: object) -> object:
            asked.append(request)
            return real_call(request)

        memo._child.call = call  # type: ignore[method-assign]
        go.touch()
        wait_until(lambda: b"PROTECTED-MARKER" in Path(f"/proc/{child.pid}/cmdline").read_bytes(), 10, "the exec")

        def row() -> ProcessInfo:
            return next(p for p in memo.table() if p.pid == child.pid)

        wait_until(lambda: "PROTECTED-MARKER" in row().cmdline, 10, "the exec read")
        assert all(not isinstance(r, list) for r in asked), asked  # the child was asked for scans only
        os.kill(child.pid, signal.SIGSTOP)  # no event tells it: the next scan finds it changed
        for _ in range(_procscan.CMDLINE_RECHECK_SCANS):
            memo._scanned_at -= table.FULL_SCAN_S  # a full scan now
            now = row()
            assert "PROTECTED-MARKER" in now.cmdline, now
        assert any(isinstance(r, dict) and child.pid in r["forget"] for r in asked), asked
        wait_until(lambda: row().state == "T", 10, "it read stopped")
        assert memo.events_in_use
    finally:
        child.kill()
        child.wait()
