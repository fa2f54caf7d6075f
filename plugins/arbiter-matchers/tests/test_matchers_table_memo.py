"""The process table's memo: an unchanged process comes back as the very same object, and
anything that can change what a process is (an exec, a new command line, a new state) is
read afresh; the matcher's verdicts follow."""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from arbiter.plugin import ProcessInfo
from arbiter_matchers import _procscan
from arbiter_matchers._procscan import CMDLINE_RECHECK_SCANS
from arbiter_matchers.process import ProcessMatcher, ProcessOptions
from arbiter_matchers.table import TableMemo, process_table
from arbiter_testing.waiting import wait_until

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the memo serves the /proc table")

#: what the memo gives is the same whether it scans here or in its child
IN_CHILD = pytest.mark.parametrize("in_child", [False, True], ids=["here", "in-child"])


def find(table: list[ProcessInfo], pid: int) -> ProcessInfo:
    return next(p for p in table if p.pid == pid)


def until(memo: TableMemo, pid: int, ok: Callable[[ProcessInfo], bool], what: str = "") -> ProcessInfo:
    """The process as the memo's next scans give it, once ``ok`` holds for it."""

    def fits() -> ProcessInfo | None:
        info = find(memo.table(), pid)
        return info if ok(info) else None

    return wait_until(fits, 10, what or f"pid {pid} in the memo's table as wanted", poll_s=0.02)


def end(child: subprocess.Popen[bytes], flag: str) -> None:
    child.kill()
    child.wait()
    for leftover in (flag, flag + ".ready"):
        if os.path.exists(leftover):
            os.unlink(leftover)


@IN_CHILD
def test_the_memo_gives_what_a_fresh_read_gives_and_reuses_unchanged_processes(in_child: bool) -> None:
    child = subprocess.Popen(["sleep", "60"])
    try:
        memo = TableMemo(in_child=in_child)
        first = until(memo, child.pid, lambda p: p.name == "sleep" and p.state == "S")  # settled: asleep, not starting
        again = find(memo.table(), child.pid)
        assert again is first  # nothing changed: the same object, so matchers may reuse their verdict
        assert again == find(process_table(), child.pid)  # and what a read without the memo says
        assert (memo.child_pid is not None) == in_child and not memo.child_failure

        os.kill(child.pid, signal.SIGSTOP)
        stopped = until(memo, child.pid, lambda p: p.state == "T")
        assert stopped.state == "T" and stopped.cmdline == first.cmdline and stopped is not first
        os.kill(child.pid, signal.SIGCONT)
    finally:
        child.kill()
        child.wait()


@IN_CHILD
def test_a_process_that_only_ran_is_an_equal_one_with_its_cpu_time_and_its_verdict_stands(in_child: bool) -> None:
    spin = "import time\nwhile True: time.sleep(0.001); sum(range(20000))"
    spinner = subprocess.Popen([sys.executable, "-c", spin])
    matcher = ProcessMatcher(ProcessOptions(kind="process", cmdline=["sum(range"]))

    def cpu_s() -> float:
        t = psutil.Process(spinner.pid).cpu_times()
        return float(t.user + t.system)

    def asleep(after_ns: int) -> Callable[[], tuple[list[ProcessInfo], ProcessInfo, float, float] | None]:
        """A table in which it is asleep, having run past ``after_ns`` of CPU time, with its
        CPU time read just before and just after the scan."""

        def scan() -> tuple[list[ProcessInfo], ProcessInfo, float, float] | None:
            before = cpu_s()
            table = memo.table()
            after = cpu_s()
            info = find(table, spinner.pid)
            if info.cmdline[-1:] == (spin,) and info.state == "S" and (info.cpu_ns or 0) > after_ns:
                return table, info, before, after
            return None

        return scan

    try:
        memo = TableMemo(in_child=in_child)
        table, first, _, _ = wait_until(asleep(-1), 10, "the spinner asleep in a scan", poll_s=0.02)
        assert spinner.pid in matcher.select(table)
        judge = matcher._matches
        matcher._matches = lambda p: pytest.fail(f"{p} judged again") if p.pid == spinner.pid else judge(p)  # type: ignore[method-assign]
        at_least = (first.cpu_ns or 0) + 20_000_000
        table, later, before, after = wait_until(asleep(at_least), 10, "the spinner asleep, having run", poll_s=0.02)
        assert later == first and later is not first
        # the stat line's CPU time, read during the scan: between what it was just before and
        # just after (however long the scan took on a busy host)
        assert later.cpu_ns is not None and before - 1e-6 <= later.cpu_ns / 1e9 <= after + 1e-6, (before, after)
        assert spinner.pid in matcher.select(table)  # its verdict stands, not judged again
    finally:
        spinner.kill()
        spinner.wait()


@IN_CHILD
def test_an_exec_is_seen_by_the_memo_and_by_the_matcher(in_child: bool) -> None:
    # a shell that waits for a file, then execs sleep: the same pid and start time, another program
    flag = f"/tmp/arbiter-memo-{os.getpid()}"
    script = f"while [ ! -e {flag} ]; do sleep 0.05; done; exec sleep 61"
    child = subprocess.Popen(["sh", "-c", script])
    matcher = ProcessMatcher(ProcessOptions(kind="process", name=["sleep"]))
    try:
        memo = TableMemo(in_child=in_child)
        before = until(memo, child.pid, lambda p: p.name == "sh")
        assert child.pid not in matcher.select(memo.table())
        open(flag, "w").close()
        after = until(memo, child.pid, lambda p: p.cmdline == ("sleep", "61"))
        assert after.name == "sleep" and after.start_time == before.start_time
        assert after.exe.endswith("sleep")
        assert child.pid in matcher.select(memo.table())
    finally:
        end(child, flag)


@IN_CHILD
def test_an_exec_of_the_same_program_with_other_arguments_is_seen_at_the_next_scan(in_child: bool) -> None:
    # python execs python: the name, the pid and the start time stay; the address space does not
    code = "import os, sys, time; time.sleep(0.3); os.execv(sys.executable, [sys.executable, '-c', 'import time; time.sleep(60)', 'second'])"
    child = subprocess.Popen([sys.executable, "-c", code, "first"])
    try:
        memo = TableMemo(in_child=in_child)
        before = until(memo, child.pid, lambda p: p.cmdline[-1:] == ("first",))

        def execed() -> bool:
            done = psutil.Process(child.pid).cmdline()[-1:] == ["second"]  # read afresh
            memo.table()  # scanned all along, so the memo knew the first program up to the exec
            return done

        wait_until(execed, 10, "the exec", poll_s=0.002)
        # done by now: the scans that follow see it, through its new address space's size or, where
        # that came out the same once it started up, through its command line read again
        seen = [find(memo.table(), child.pid) for _ in range(CMDLINE_RECHECK_SCANS)]
        after = seen[-1]
        assert after.cmdline[-1:] == ("second",), [p.cmdline for p in seen]
        assert after.name == before.name and after.start_time == before.start_time
    finally:
        child.kill()
        child.wait()


def test_a_command_line_rewritten_in_place_is_seen_within_the_recheck(monkeypatch: pytest.MonkeyPatch) -> None:
    # what setproctitle does: new bytes over the old argv, nothing else about the process changes
    code = (
        "import os, sys, time\n"
        "open(sys.argv[1] + '.ready', 'w').close()\n"
        "while not os.path.exists(sys.argv[1]): time.sleep(0.01)\n"
        "f = open('/proc/self/stat', 'rb').read(); fields = f[f.rfind(b')') + 2:].split()\n"
        "start, end = int(fields[48 - 3]), int(fields[49 - 3])\n"
        "title = b'renamed-by-title'.ljust(end - start, b'\\0')[: end - start]\n"
        "with open('/proc/self/mem', 'r+b', buffering=0) as mem: mem.seek(start); mem.write(title)\n"
        "time.sleep(60)\n"
    )
    flag = f"/tmp/arbiter-title-{os.getpid()}"
    child = subprocess.Popen([sys.executable, "-c", code, flag, "x" * 40])
    try:
        memo = TableMemo()
        until(memo, child.pid, lambda p: flag in p.cmdline)
        # started up: its address space no longer grows
        wait_until(lambda: os.path.exists(flag + ".ready"), 10, "the child to start up")
        for _ in range(10):
            memo.table()  # settled: every scan now finds it unchanged
        open(flag, "w").close()
        cmdline = Path(f"/proc/{child.pid}/cmdline")
        wait_until(lambda: cmdline.read_bytes().startswith(b"renamed-by-title"), 10, "the child to rewrite its argv")
        with monkeypatch.context() as m:  # nothing else changed: without the recheck it stays unseen
            m.setattr(_procscan, "CMDLINE_RECHECK_SCANS", 10**9)
            assert all(find(memo.table(), child.pid).cmdline[:1] != ("renamed-by-title",) for _ in range(8))
        seen = [find(memo.table(), child.pid).cmdline for _ in range(CMDLINE_RECHECK_SCANS)]
        assert seen[-1][:1] == ("renamed-by-title",), seen
    finally:
        end(child, flag)


def open_fds() -> int:
    """This process's open process-table files (stat, cmdline): counting every descriptor
    saw another test's leftovers (a pipe, a socket) closed meanwhile, by a thread or the
    collector, as descriptors the memo had closed."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            where = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue  # the one listdir itself held
        count += where.startswith("/proc/") and where.endswith(("/stat", "/cmdline"))
    return count


def started(pid: str) -> str | None:
    """When the process with this pid started (None when there is none): two readings
    that agree name the same process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def test_stat_and_cmdline_files_are_kept_open_between_scans_and_closed_when_their_process_goes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    memo = TableMemo()
    memo.table()
    kept = dict(memo._scan._stat_fds)
    assert str(os.getpid()) in kept and memo._scan._cmdline_fds.keys() == kept.keys()  # every process listed
    born = {pid: started(pid) for pid in kept}
    opened: list[str] = []
    real_open = os.open

    def counting_open(path: str, *args: int) -> int:
        opened.append(path)
        return real_open(path, *args)

    for _ in range(CMDLINE_RECHECK_SCANS):  # every command line is read again once
        with monkeypatch.context() as patch:
            patch.setattr(os, "open", counting_open)
            memo.table()

    # a process that ended meanwhile (its pid perhaps another's now) is rightly opened afresh
    def same(pid: str) -> bool:
        return born[pid] is not None and started(pid) == born[pid]

    reopened = [p for p in opened if p.split("/")[2] in kept and p.split("/")[3] in ("stat", "cmdline")]
    reopened = [p for p in reopened if same(p.split("/")[2])]
    assert not reopened, f"kept files were opened again: {reopened[:3]}"

    child = subprocess.Popen(["sleep", "60"])
    until(memo, child.pid, lambda p: p.name == "sleep")
    fds = memo._scan._stat_fds[str(child.pid)], memo._scan._cmdline_fds[str(child.pid)]
    child.kill()
    child.wait()
    assert all(p.pid != child.pid for p in memo.table())
    assert str(child.pid) not in memo._scan._stat_fds and str(child.pid) not in memo._scan._cmdline_fds
    for fd in fds:
        with pytest.raises(OSError):
            os.fstat(fd)  # closed, not leaked


def test_a_kept_stat_file_of_a_gone_process_never_stands_for_the_pid_now() -> None:
    # a reused pid: the kept descriptor is the old process's, and reads nothing
    live = subprocess.Popen(["sleep", "60"])
    dead = subprocess.Popen(["sleep", "60"])
    try:
        memo = TableMemo()
        until(memo, live.pid, lambda p: p.name == "sleep")
        stale = os.open(f"/proc/{dead.pid}/stat", os.O_RDONLY)
        dead.kill()
        dead.wait()
        os.close(memo._scan._stat_fds[str(live.pid)])
        memo._scan._stat_fds[str(live.pid)] = stale  # as if live.pid had been dead's before
        info = find(memo.table(), live.pid)
        assert info.name == "sleep" and info == find(process_table(), live.pid)
        assert os.pread(memo._scan._stat_fds[str(live.pid)], 100, 0).startswith(f"{live.pid} (sleep)".encode())
    finally:
        live.kill()
        live.wait()


def test_past_the_limit_stat_files_are_read_and_closed_and_the_memo_closes_its_own() -> None:
    children = [subprocess.Popen(["sleep", "60"]) for _ in range(3)]  # its own, there through both scans
    try:
        gc.collect()  # earlier memos close theirs
        before = open_fds()
        memo = TableMemo()
        memo._scan._limit = 3
        full = memo.table()
        kept = len(memo._scan._stat_fds) + len(memo._scan._cmdline_fds)
        assert kept == 3 and memo._scan._cmdline_fds.keys() <= memo._scan._stat_fds.keys() and len(full) > 3
        again = {p.pid: p for p in memo.table()}
        # every process there through both scans is read again, kept file or none (other
        # tests' processes come and go meanwhile: those still there after the scan were there during it)
        through = {p.pid for p in full} & {p.pid for p in process_table()}
        assert through <= again.keys(), sorted(through - again.keys())
        for child in children:
            assert again[child.pid].cmdline == find(full, child.pid).cmdline == ("sleep", "60")
        assert open_fds() == before + 3
    finally:
        for child in children:
            child.kill()
            child.wait()
    del memo
    gc.collect()
    assert open_fds() == before
