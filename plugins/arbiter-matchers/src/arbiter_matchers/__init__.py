"""arbiter matcher kinds (``process``), the host's process table, and its processes watched
for their end and programs for their start.

Registered through the ``arbiter`` entry point group; imports only :mod:`arbiter.plugin`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, TypeVar

from arbiter.plugin import ProcessInfo, hookimpl
from arbiter_matchers import _execs, _exits
from arbiter_matchers.process import ProcessMatcher
from arbiter_matchers.table import TableMemo, process_table

log = logging.getLogger("arbiter.matchers")

__all__ = [
    "ProcessMatcher",
    "arbiter_process_table",
    "arbiter_register_matchers",
    "arbiter_watch_processes",
    "process_table",
]

#: where the process table keeps its memo in the caller's scratch dict
SCRATCH_KEY = "arbiter_matchers.table"
#: where the watch of processes' ends lives in that dict
EXITS_KEY = "arbiter_matchers.exits"
#: where the watch of programs' starts lives in that dict
EXECS_KEY = "arbiter_matchers.execs"


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
def arbiter_watch_processes(
    groups: list[frozenset[int]],
    ended: Callable[[frozenset[int]], None],
    starts: Callable[[ProcessInfo], bool] | None,
    started: Callable[[], None],
    scratch: dict[str, Any],
) -> bool | None:
    exits = _kept(scratch, EXITS_KEY, _exits.ExitWatch, _exits.unusable, lambda: _exits.ExitWatch(ended))
    if exits is not None:
        exits.watch(groups)
    execs = _kept(scratch, EXECS_KEY, _execs.ExecWatch, _execs.unusable, lambda: _execs.ExecWatch(started))
    if execs is not None:
        execs.watch(starts)
    return True if exits is not None or execs is not None else None


Watch = TypeVar("Watch", _exits.ExitWatch, _execs.ExecWatch)


def _kept(
    scratch: dict[str, Any], key: str, kind: type[Watch], unusable: Callable[[], str], make: Callable[[], Watch]
) -> Watch | None:
    """The watch kept in ``scratch`` under ``key``, made on the first call; None where it
    cannot be had, or once it stopped: ``scratch`` keeps why and it is not tried again (the
    tick finds what it would have told)."""
    watch = scratch.get(key)
    if isinstance(watch, str):
        return None
    if isinstance(watch, kind):
        broken = watch.broken
        if not broken:
            return watch
        watch.close()
        why = f"it stopped: {broken}"
    else:
        why = unusable()
        if not why:
            try:
                made = scratch[key] = make()
                return made
            except (OSError, RuntimeError) as exc:  # no descriptor or thread to be had
                why = f"the watch could not start: {exc}"
    log.info("%s is not watched between ticks (the tick finds it): %s", kind.WHAT, why)
    scratch[key] = why
    return None
