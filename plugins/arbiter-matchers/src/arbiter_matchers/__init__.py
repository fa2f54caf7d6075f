"""arbiter matcher kinds (``process``), the host's process table, and its processes watched
for their end.

Registered through the ``arbiter`` entry point group; imports only :mod:`arbiter.plugin`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from arbiter.plugin import ProcessInfo, hookimpl
from arbiter_matchers import _exits
from arbiter_matchers.process import ProcessMatcher
from arbiter_matchers.table import TableMemo, process_table

__all__ = [
    "ProcessMatcher",
    "arbiter_process_table",
    "arbiter_register_matchers",
    "arbiter_watch_exits",
    "process_table",
]

#: where the process table keeps its memo in the caller's scratch dict
SCRATCH_KEY = "arbiter_matchers.table"
#: where the watch of processes' ends lives in that dict
EXITS_KEY = "arbiter_matchers.exits"


@hookimpl
def arbiter_register_matchers(register: Callable[[str, type], None]) -> None:
    register("process", ProcessMatcher)


@hookimpl
def arbiter_process_table(scratch: dict[str, Any]) -> list[ProcessInfo]:
    # the memo spares re-reading /proc/PID/status and the exe link of processes that did
    # not change (with a thousand processes that is half of the scan's cost); its child
    # scans outside the daemon's interpreter, where the fast path does not wait for it; and
    # where the kernel's process events can be had, a tick on which they announce nothing
    # reads nothing
    memo = scratch.get(SCRATCH_KEY)
    if not isinstance(memo, TableMemo):
        memo = scratch[SCRATCH_KEY] = TableMemo(in_child=True, events=True)
    table = process_table(memo)
    scratch["about"] = memo.about()
    return table


@hookimpl
def arbiter_watch_exits(
    groups: list[frozenset[int]], ended: Callable[[frozenset[int]], None], scratch: dict[str, Any]
) -> bool | None:
    watch = scratch.get(EXITS_KEY)
    if isinstance(watch, str):
        return None  # it could not be had here: the tick notices each end
    if not isinstance(watch, _exits.ExitWatch):
        why = _exits.unusable()
        if not why:
            try:
                watch = _exits.ExitWatch(ended)
            except (OSError, RuntimeError) as exc:  # no descriptor or thread to be had
                why = f"the watch could not start: {exc}"
        if why:
            scratch[EXITS_KEY] = why
            return None
        scratch[EXITS_KEY] = watch
    assert isinstance(watch, _exits.ExitWatch)
    watch.watch(groups)
    return True
