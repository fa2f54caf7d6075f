"""What every test shares: markers by folder, and no process left running after the run.

Every process a test starts inherits two variables: ``ARBITER_TEST_RUN`` (this run) and
``ARBITER_TEST_NODEID`` (the test that was running when it started).  When the run ends,
any process still carrying this run's mark, however far it was reparented, is a leak: it
is named with the test that started it, killed, and the run fails.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from pathlib import Path

import pytest

RUN_VAR = "ARBITER_TEST_RUN"
NODEID_VAR = "ARBITER_TEST_NODEID"
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


def pytest_configure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):  # an xdist worker keeps its controller's mark
        os.environ.setdefault(RUN_VAR, uuid.uuid4().hex)


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


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> object:
    os.environ[NODEID_VAR] = item.nodeid
    try:
        return (yield)
    finally:
        os.environ.pop(NODEID_VAR, None)


def _marked(run: str) -> dict[int, str]:
    """pid -> the test that started it, for every process of this run but this one."""
    found: dict[int, str] = {}
    mine = os.getpid()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == mine:
            continue
        try:
            raw = (entry / "environ").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:  # gone meanwhile, or not ours to read
            continue
        if state == "Z":  # exited; only its parent's wait is missing
            continue
        env = dict(part.split(b"=", 1) for part in raw.split(b"\0") if b"=" in part)
        if env.get(RUN_VAR.encode()) == run.encode():
            found[int(entry.name)] = env.get(NODEID_VAR.encode(), b"(outside any test)").decode(errors="replace")
    return found


def _cmdline(pid: int) -> str:
    try:
        return (Path("/proc") / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:200]
    except OSError:
        return "?"


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    run = os.environ.get(RUN_VAR)
    if hasattr(session.config, "workerinput") or not run or not Path("/proc/self/environ").exists():
        return
    deadline = time.monotonic() + GRACE_S
    left = _marked(run)
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = _marked(run)
    if not left:
        return
    lines = [f"  pid {pid} started by {test}: {_cmdline(pid)}" for pid, test in sorted(left.items())]
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
