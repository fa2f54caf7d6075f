"""Running a piece of a test as another account (tests that run as root check rights this way)."""

from __future__ import annotations

import json
import os
import pwd
from collections.abc import Callable
from typing import Any


class ChildFailed(Exception):
    """``fn`` raised in the child: ``kind`` is the exception's type name."""

    def __init__(self, kind: str, message: str) -> None:
        self.kind = kind
        super().__init__(f"{kind}: {message}")


def run_as(user: str, fn: Callable[[], Any]) -> Any:
    """Run ``fn`` in a forked child that switched to ``user``; return its (JSON) result.

    Needs root.  The child drops its groups, gid and uid before calling ``fn`` and exits
    without running any cleanup of the parent's.
    """
    account = pwd.getpwnam(user)
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - runs in the forked child
        try:
            os.close(read_end)
            os.setgroups([])
            os.setgid(account.pw_gid)
            os.setuid(account.pw_uid)
            try:
                outcome = {"ok": fn()}
            except Exception as exc:
                outcome = {"error": [type(exc).__name__, str(exc)]}
            os.write(write_end, json.dumps(outcome).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as fh:
        data = fh.read()
    os.waitpid(child, 0)
    if not data:
        raise ChildFailed("NoAnswer", f"the child running as {user} said nothing")
    outcome = json.loads(data)
    if "error" in outcome:
        raise ChildFailed(*outcome["error"])
    return outcome["ok"]
