"""A protected program's end and start seen when they happen: the processes of each rule whose
program runs, and what would select a program of a rule whose program does not, are handed to
the ``arbiter_watch_processes`` hook, whose word that all of one rule's processes have ended,
or that such a program started, brings the tick forward: fleet work held for the program goes
at once, and fleet work beside a program that starts stops at once, not a tick later."""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from arbiter.daemon.rules import LiveRule
from arbiter.engine.types import RuleObs
from arbiter.plugin import EXITED, Matcher, ProcessInfo
from arbiter.pluginmanager import PluginFailed, PluginHost
from arbiter.pluginsteps import Steps, one

log = logging.getLogger("arbiter.daemon")


class ExitWatching:
    """What the watch of the rules' processes was last asked for, and the processes it saw end.

    :param scratch: the process table plugin's scratch dict, where the watch lives too."""

    def __init__(self, host: PluginHost, scratch: dict[str, Any]) -> None:
        self.host = host
        self.scratch = scratch
        self._watched: frozenset[frozenset[int]] | None = None  # the groups last asked for
        self._running: dict[str, frozenset[int]] = {}  # each running rule's pids on the last tick
        self._exited: set[int] = set()  # pids the watch saw end (its own thread adds to it)
        self._lock = threading.Lock()
        self._idle: list[tuple[str, int]] | None = None  # (id, serial) of each rule whose start is watched
        self._judges: dict[str, tuple[LiveRule, Matcher]] = {}  # each such rule's matcher for the watch alone
        self._starts: Callable[[ProcessInfo], bool] | None = None
        self._soon: Callable[[], None] = _nothing
        self._every_s = 0.0  # a start brings forward at most one tick in this long
        self._brought_at = -math.inf

    def watching(
        self,
        rules: Mapping[str, RuleObs],
        live: Sequence[LiveRule],
        own_pids: frozenset[int],
        every_s: float,
        soon: Callable[[], None],
    ) -> Steps[None]:
        """Have the processes of each rule whose program runs watched for their end, and the
        programs that start judged by the matchers of the rules whose program does not, where
        a plugin can: ``soon`` is called once all of one rule's processes have ended, or when
        such a program (not a child of ``own_pids``) started, at most once in ``every_s``
        for a start.  Asked again only when either changed.

        A rule's processes are watched once two ticks in a row saw the same ones: a program
        whose processes come and go (a pool of short-lived workers) would otherwise bring a
        tick forward at each of their ends; this way an end brings forward at most one tick
        in ``tick_s``, as the processes of the tick it brought differ from the tick's before."""
        self._soon, self._every_s = soon, every_s
        seen, self._running = self._running, {rid: ro.pids for rid, ro in rules.items() if ro.running and ro.pids}
        groups = frozenset(pids for rid, pids in self._running.items() if seen.get(rid) == pids)
        idle = [lr for lr in live if lr.matcher is not None and not (lr.rule.id in rules and rules[lr.rule.id].running)]
        idle_keys = [(lr.rule.id, lr.serial) for lr in idle]  # one call, where a generator is one a rule
        if groups == self._watched and idle_keys == self._idle:
            return
        self._watched = groups
        if idle_keys != self._idle:
            self._idle = idle_keys
            self._starts = yield from self._judging(idle, own_pids)
        starts = self._starts

        def told(pids: frozenset[int]) -> None:
            with self._lock:
                self._exited |= pids
            soon()

        try:
            yield from one(
                "process watch",
                lambda: self.host.hook.arbiter_watch_processes(
                    groups=list(groups), ended=told, starts=starts, started=self.started, scratch=self.scratch
                ),
            )
        except PluginFailed as exc:  # the tick notices each end and start then; asked again on the next one
            self._watched = self._idle = None
            log.warning("watching protected programs for their end and start failed: %s", exc)

    def _judging(
        self, idle: Sequence[LiveRule], own_pids: frozenset[int]
    ) -> Steps[Callable[[ProcessInfo], bool] | None]:
        """Whether one of these rules would select a program just started that is not a child
        of ``own_pids`` (the daemon's own commands run all the time on a fleet node), by a
        matcher of each rule's that the watch alone uses: a matcher may keep what it judged
        between calls, and the tick's is called on another thread."""
        wanted = {lr.rule.id: lr for lr in idle}
        for rid in [rid for rid, (lr, _) in self._judges.items() if wanted.get(rid) is not lr]:
            del self._judges[rid]  # its program runs now, or its rule was loaded again
        for rid, lr in wanted.items():
            if rid in self._judges or lr.matcher is None:
                continue
            try:
                made = yield from one(f"matchers/{lr.rule.match.kind}", type(lr.matcher), lr.matcher.options)
            except PluginFailed as exc:  # its start is left to the tick
                log.debug("%s's start is not watched: %s", rid, exc)
                continue
            self._judges[rid] = (lr, made)
        judges = tuple(m for _, m in self._judges.values())
        if not judges:
            return None

        def starts(p: ProcessInfo) -> bool:
            return p.ppid not in own_pids and any(m.select([p]) for m in judges)

        return starts

    def started(self) -> None:
        """A program of a rule whose program did not run started: a tick now, unless a start
        brought one forward less than ``every_s`` ago (a burst of them, or a program that a
        rule selects but the tick does not take, such as a fleet job's, brings forward one)."""
        now = time.monotonic()
        with self._lock:
            if now - self._brought_at < self._every_s:
                return
            self._brought_at = now
        self._soon()

    def ended(self, table: Sequence[ProcessInfo]) -> set[int]:
        """The processes of the table that the watch saw end and whose parents have not
        waited for them yet: a zombie still answers to its name, but runs no program."""
        with self._lock:
            if self._exited:  # most ticks: none, and the table is not gone through
                self._exited &= {p.pid for p in table if p.state == EXITED}
            return set(self._exited)


def _nothing() -> None:
    return None
