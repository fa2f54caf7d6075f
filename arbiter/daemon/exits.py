"""A protected program's end seen when it happens: the processes of each rule whose program
runs are handed to the ``arbiter_watch_exits`` hook, whose word that all of one rule's have
ended brings the tick forward, so that fleet work held for the program goes at once."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from arbiter.engine.types import RuleObs
from arbiter.plugin import EXITED, ProcessInfo
from arbiter.pluginmanager import PluginFailed, PluginHost
from arbiter.pluginsteps import Steps, one

log = logging.getLogger("arbiter.daemon")


class ExitWatching:
    """What the exit watch was last asked for, and the processes it saw end.

    :param scratch: the process table plugin's scratch dict, where the watch lives too."""

    def __init__(self, host: PluginHost, scratch: dict[str, Any]) -> None:
        self.host = host
        self.scratch = scratch
        self._watched: frozenset[frozenset[int]] | None = None  # the groups last asked for
        self._running: dict[str, frozenset[int]] = {}  # each running rule's pids on the last tick
        self._exited: set[int] = set()  # pids the watch saw end (its own thread adds to it)
        self._lock = threading.Lock()

    def watching(self, rules: Mapping[str, RuleObs], ended: Callable[[], None]) -> Steps[None]:
        """Have the processes of each rule whose program runs watched for their end, where a
        plugin can: ``ended`` is called once all of one rule's have ended.  Asked again only
        when they changed.

        A rule's processes are watched once two ticks in a row saw the same ones: a program
        whose processes come and go (a pool of short-lived workers) would otherwise bring a
        tick forward at each of their ends; this way an end brings forward at most one tick
        in ``tick_s``, as the processes of the tick it brought differ from the tick's before."""
        seen, self._running = self._running, {rid: ro.pids for rid, ro in rules.items() if ro.running and ro.pids}
        groups = frozenset(pids for rid, pids in self._running.items() if seen.get(rid) == pids)
        if groups == self._watched:
            return
        self._watched = groups

        def told(pids: frozenset[int]) -> None:
            with self._lock:
                self._exited |= pids
            ended()

        try:
            yield from one(
                "exit watch",
                lambda: self.host.hook.arbiter_watch_exits(groups=list(groups), ended=told, scratch=self.scratch),
            )
        except PluginFailed as exc:  # the tick notices each end then; asked again on the next one
            self._watched = None
            log.warning("watching protected programs for their end failed: %s", exc)

    def ended(self, table: Sequence[ProcessInfo]) -> set[int]:
        """The processes of the table that the watch saw end and whose parents have not
        waited for them yet: a zombie still answers to its name, but runs no program."""
        with self._lock:
            if self._exited:  # most ticks: none, and the table is not gone through
                self._exited &= {p.pid for p in table if p.state == EXITED}
            return set(self._exited)
