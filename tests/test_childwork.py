"""A plugin's work in a child process: answers, state, and every way a child can fail."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from arbiter.runtime.childwork import CHILD_CPU, ChildWorker, ChildWorkFailed
from arbiter_testing.waiting import wait_until

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="children talk over POSIX pipes")

WORK = """\
import os, sys, time


class Counter:
    def __init__(self, start):
        self.n = start

    def __call__(self, request):
        self.n += 1
        if request == "modules":
            return sorted(sys.modules)
        if request == "raise":
            raise ValueError("asked to")
        if request == "hang":
            time.sleep(60)
        if request == "exit":
            os._exit(3)
        if request == "object":
            return object()
        if request == "burn":
            end = time.process_time() + 0.05
            while time.process_time() < end:
                pass
        return (self.n, request)
"""


@pytest.fixture
def work(tmp_path: Path) -> str:
    path = tmp_path / "work.py"
    path.write_text(WORK)
    return str(path)


def ended(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] == "Z"  # exited; reaping is its new parent's business
    except FileNotFoundError:
        return True


def gone(pid: int, timeout: float = 10.0) -> bool:
    """Wait until ``pid`` has exited (True), or fail."""
    return wait_until(lambda: ended(pid), timeout, f"pid {pid} to exit", poll_s=0.02)


def test_the_child_keeps_its_state_between_calls_and_answers_marshal_values(work: str) -> None:
    worker = ChildWorker(work, "Counter", 10)
    try:
        assert worker.pid is None  # started by the first call
        assert worker.call({"a": [1, 2.5, b"x"]}) == (11, {"a": [1, 2.5, b"x"]})
        pid = worker.pid
        assert worker.call(None) == (12, None) and worker.pid == pid and not worker.failure
    finally:
        worker.close()


def test_the_cpu_a_child_spends_is_added_where_the_caller_counts_it(work: str) -> None:
    """The daemon's tick counts what its children cost (arbiter.pluginmanager sets the cell)."""
    worker = ChildWorker(work, "Counter", 0)
    try:
        worker.call("burn")  # nothing to add to: the answer alone
        spent = [0.0]
        token = CHILD_CPU.set(spent)
        try:
            assert worker.call("burn") == (2, "burn")
        finally:
            CHILD_CPU.reset(token)
        assert 0.045 <= spent[0] < 1.0
        counted = spent[0]
        worker.call("burn")  # after the caller stopped counting
        assert spent[0] == counted and CHILD_CPU.get() is None
    finally:
        worker.close()


def test_a_plugin_call_counts_its_child_workers_cpu_as_its_own(work: str) -> None:
    from arbiter.pluginmanager import build_plugin_manager

    host = build_plugin_manager(entry_points=False)
    worker = ChildWorker(work, "Counter", 0)
    try:
        before = host.worker_cpu()
        host.call("readers/child", worker.call, "burn")
        assert host.worker_cpu() - before >= 0.045  # on a pool thread, the child's 50 ms counted
        before = host.worker_cpu()
        host.call_here("translators/child", worker.call, "burn")
        assert host.worker_cpu() - before >= 0.045  # here: the thread's own time is the caller's to read
    finally:
        worker.close()
        host.close()


def test_the_child_imports_only_the_standard_library(work: str) -> None:
    worker = ChildWorker(work, "Counter", 0)
    try:
        loaded = set(worker.call("modules"))
    finally:
        worker.close()
    foreign = {m.split(".")[0] for m in loaded} - set(sys.stdlib_module_names) - {"__main__", "arbiter_child_work"}
    assert not foreign, foreign  # neither arbiter nor pydantic nor the plugin's package
    assert "site" not in loaded


@pytest.mark.parametrize(
    ("request_", "why"),
    [
        ("raise", "it raised ValueError: asked to"),
        ("exit", "it exited (status 3)"),
        ("object", "it raised ValueError: unmarshallable object"),
    ],
)
def test_a_child_that_fails_is_ended_and_a_new_one_starts_only_after_the_retry_time(
    work: str, request_: str, why: str, caplog: pytest.LogCaptureFixture
) -> None:
    worker = ChildWorker(work, "Counter", 0, retry_s=60)
    try:
        worker.call(None)
        pid = worker.pid
        assert pid is not None
        with pytest.raises(
            ChildWorkFailed, match="the child worker was given up: " + why.replace("(", r"\(").replace(")", r"\)")
        ):
            worker.call(request_)
        assert worker.pid is None and gone(pid) and why in worker.failure
        assert f"{worker.failure} (work.py); the work is done in this process" in caplog.text
        with pytest.raises(ChildWorkFailed, match="another child starts in 60s"):
            worker.call(None)
        worker.retry_s = 0.0
        worker._retry_at = 0.0
        assert worker.call(None) == (1, None)  # a new child, with none of the last one's state
        assert worker.pid not in (None, pid)
    finally:
        worker.close()


@pytest.mark.parametrize(
    ("request_", "stop", "why"),
    [
        ("hang", False, "did not answer within 0.3s"),  # busy in its work
        (None, True, "did not answer within 0.3s"),  # stopped: reads nothing
        (b"x" * 4_000_000, True, "did not take the request within 0.3s"),  # more than the pipe holds
    ],
    ids=["hangs", "stopped", "stopped-big-request"],
)
def test_a_child_that_does_not_answer_is_killed_after_the_timeout(
    work: str, request_: object, stop: bool, why: str
) -> None:
    worker = ChildWorker(work, "Counter", 0, timeout_s=0.3)
    try:
        worker.call(None)
        pid = worker.pid
        assert pid is not None
        if stop:
            os.kill(pid, signal.SIGSTOP)
        started = time.monotonic()
        with pytest.raises(ChildWorkFailed, match=why):
            worker.call(request_)
        assert 0.3 <= time.monotonic() - started < 2.0
        assert gone(pid)
    finally:
        worker.close()


def test_the_pipes_work_past_descriptor_1024(work: str) -> None:
    # the daemon keeps a stat file open per process: its pipes to a child come after them
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1200:
        pytest.skip(f"the open-file limit ({hard}) leaves no room past 1024")
    resource.setrlimit(
        resource.RLIMIT_NOFILE,
        (max(soft, 1200) if hard == resource.RLIM_INFINITY else max(soft, min(hard, 1200)), hard),
    )
    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    worker = ChildWorker(work, "Counter", 0)
    try:
        assert worker.call("past") == (1, "past")
        assert worker._child[0].stdout.fileno() > 1024  # type: ignore[union-attr]
    finally:
        worker.close()
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_request_that_is_no_marshal_value_is_the_callers_error_and_keeps_the_child(work: str) -> None:
    worker = ChildWorker(work, "Counter", 0)
    try:
        worker.call(None)
        with pytest.raises(TypeError, match="marshal value"):
            worker.call(object())
        assert worker.call(None) == (2, None) and not worker.failure
    finally:
        worker.close()


def test_a_work_module_that_cannot_load_fails_the_call(tmp_path: Path) -> None:
    worker = ChildWorker(str(tmp_path / "missing.py"), "Counter")
    with pytest.raises(ChildWorkFailed, match="it exited"):
        worker.call(None)


def test_the_child_ends_when_closed_collected_or_its_starter_is_killed(work: str) -> None:
    worker = ChildWorker(work, "Counter", 0)
    worker.call(None)
    pid = worker.pid
    assert pid is not None
    worker.close()
    assert gone(pid) and worker.pid is None

    worker = ChildWorker(work, "Counter", 0)
    worker.call(None)
    pid = worker.pid
    del worker
    assert pid is not None and gone(pid)

    code = (
        "import sys, time\nfrom arbiter.runtime.childwork import ChildWorker\nw = ChildWorker(sys.argv[1], 'Counter', 0)\n"
        "w.call(None)\nprint(w.pid, flush=True)\ntime.sleep(60)\n"
    )
    starter = subprocess.Popen([sys.executable, "-c", code, work], stdout=subprocess.PIPE)
    try:
        assert starter.stdout is not None
        pid = int(starter.stdout.readline())
        # nothing marks "still running": a window to see it not end while its starter lives
        with pytest.raises(AssertionError, match="timed out"):
            gone(pid, timeout=0.5)
        starter.kill()
        starter.wait()
        assert gone(pid)  # its request pipe closed
    finally:
        starter.kill()
        starter.wait()
