"""What every test shares: markers by folder, tests that run alone, and no process left
running after the run.

Every process a test starts inherits two variables: ``ARBITER_TEST_RUN`` (this run) and
``ARBITER_TEST_NODEID`` (the test that was running when it started).  When the run ends,
any process still carrying this run's mark, however far it was reparented, is a leak: it
is named with the test that started it, killed, and the run fails.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from arbiter_testing.marks import NODEID_VAR, RUN_VAR, cmdline, marked

#: how long processes that are already on their way out get to exit before they count
GRACE_S = 5.0

#: markers given by folder (relative to the repository root), beside those set in the files
FOLDER_MARKERS = {
    "tests/e2e": ("e2e", "slow"),
    "tests/bench": ("bench", "slow"),
    "tests/faults": ("slow",),
    "tests/fuzz": ("slow",),
    "tests/service": ("slow",),
    "tests/docs": ("slow",),
}
ROOT = Path(__file__).parent


#: set on the session that made this run's mark: only it looks for leaks (an xdist worker,
#: or a pytest that a test starts, inherits the mark and must not judge the whole run)
OWNS_MARK = pytest.StashKey[bool]()


def pytest_configure(config: pytest.Config) -> None:
    if RUN_VAR not in os.environ:
        os.environ[RUN_VAR] = uuid.uuid4().hex
        config.stash[OWNS_MARK] = True


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        try:
            where = item.path.relative_to(ROOT).as_posix()
        except ValueError:
            continue
        for folder, marks in FOLDER_MARKERS.items():
            if where.startswith(folder + "/"):
                for mark in marks:
                    item.add_marker(mark)
        if "browser" in item.keywords:
            item.add_marker("slow")
    # the order the workers take them in (each takes a test or two at a time): the tests that
    # run alone together first, while nothing else has started that they would wait out; then
    # the slow ones, so that the run ends on tests of a moment each rather than on one minute long
    items.sort(key=lambda item: 0 if item.get_closest_marker("alone") else 1 if item.get_closest_marker("slow") else 2)


def _turn_files() -> tuple[Path, Path]:
    base = Path(tempfile.gettempdir()) / f"arbiter-tests-{os.environ[RUN_VAR]}"
    return base.with_suffix(".gate"), base.with_suffix(".turn")


@contextlib.contextmanager
def _turn(worker: bool, alone: bool) -> Iterator[None]:
    """Among xdist workers, a test marked ``alone`` runs with no other test beside it.

    Every test holds the run's turn file shared; an ``alone`` test holds it exclusive.  The
    gate gives the exclusive one precedence: a test about to start passes through the gate,
    which an ``alone`` test holds while it waits for those running to end."""
    if not worker:  # one process runs every test (a pytest a test starts inherits the run's files)
        yield
        return
    gate_path, turn_path = _turn_files()
    gate = os.open(gate_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    turn = os.open(turn_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(gate, fcntl.LOCK_EX)
        if alone:
            fcntl.flock(turn, fcntl.LOCK_EX)
            fcntl.flock(gate, fcntl.LOCK_UN)
        else:
            fcntl.flock(gate, fcntl.LOCK_UN)
            fcntl.flock(turn, fcntl.LOCK_SH)
        yield
    finally:
        os.close(turn)  # closing lets go of its lock
        os.close(gate)


# outermost: the wait for a turn is no part of the test's own timeout
@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> object:
    with _turn(hasattr(item.config, "workerinput"), item.get_closest_marker("alone") is not None):
        os.environ[NODEID_VAR] = item.nodeid
        try:
            return (yield)
        finally:
            os.environ.pop(NODEID_VAR, None)


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if not session.config.stash.get(OWNS_MARK, False):
        return
    for path in _turn_files():
        path.unlink(missing_ok=True)
    deadline = time.monotonic() + GRACE_S
    left = marked()
    while left and time.monotonic() < deadline:
        time.sleep(0.1)  # processes already on their way out
        left = marked()
    if not left:
        return
    lines = [f"  pid {pid} started by {test}: {cmdline(pid)}" for pid, test in sorted(left.items())]
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    message = f"{len(left)} process(es) started by the tests still ran when the run ended (killed now):"
    if reporter is not None:
        reporter.write_line(message, red=True)
        for line in lines:
            reporter.write_line(line)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED
