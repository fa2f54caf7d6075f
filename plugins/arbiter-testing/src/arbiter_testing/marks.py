"""Which processes a test run, or one test, started: read from the marks they inherit.

The repository's root ``conftest.py`` puts two variables in the environment that every
process a test starts inherits, however far it is reparented later: ``ARBITER_TEST_RUN``
(this run) and ``ARBITER_TEST_NODEID`` (the test that was running).  A process that clears
its environment drops them; its parent, which kept them, is found instead.
"""

from __future__ import annotations

import os
from pathlib import Path

RUN_VAR = "ARBITER_TEST_RUN"
NODEID_VAR = "ARBITER_TEST_NODEID"
_PROC = Path("/proc")


def marked(run: str | None = None, nodeid: str | None = None) -> dict[int, str]:
    """pid -> the test that started it, for every live process of ``run`` (by default this
    process's run) but this one, only those started by ``nodeid`` where it is given.  Empty
    where ``/proc`` cannot be read (then nothing can be checked)."""
    run = run if run is not None else os.environ.get(RUN_VAR)
    if not run or not (_PROC / "self" / "environ").exists():
        return {}
    found: dict[int, str] = {}
    mine = os.getpid()
    for entry in _PROC.iterdir():
        if not entry.name.isdigit() or int(entry.name) == mine:
            continue
        try:
            raw = (entry / "environ").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):  # gone meanwhile, or not ours to read
            continue
        if state == "Z":  # it has exited; only its parent's wait is missing
            continue
        env = dict(part.split(b"=", 1) for part in raw.split(b"\0") if b"=" in part)
        if env.get(RUN_VAR.encode()) != run.encode():
            continue
        test = env.get(NODEID_VAR.encode(), b"(outside any test)").decode(errors="replace")
        if nodeid is None or test == nodeid:
            found[int(entry.name)] = test
    return found


def cmdline(pid: int) -> str:
    """A process's command line, for a message (at most 200 characters)."""
    try:
        return (_PROC / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:200]
    except OSError:
        return "?"
