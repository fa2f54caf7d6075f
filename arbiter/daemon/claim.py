"""Which processes belong to which rule: every matcher offered what earlier rules left.

A process belongs to the first rule, highest priority first, whose matcher selects it, but
one inside the tree of a rule that walks trees goes with that rule
(:mod:`arbiter.daemon.ownership` says the order); a job's processes are its root's descendants.
Each matcher call runs under the host's timeout, and one that hangs or returns what no
matcher may is a fault of its rule.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from arbiter.daemon.ownership import settle_trees
from arbiter.daemon.rules import LiveRule
from arbiter.plugin import Matcher, ProcessInfo
from arbiter.pluginmanager import PluginFailed
from arbiter.pluginsteps import Step, Steps, drive


def _nothing() -> None:
    return None


def plausible(value: object, limit: int) -> bool:
    """An integer amount from 0 to ``limit`` (a bool is not one)."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= limit


def selection_problem(chosen: object) -> str:
    """What is wrong with what a matcher selected, or "" (a set of pids is right)."""
    if not isinstance(chosen, (set, frozenset, list, tuple)):
        return f"it returned {type(chosen).__name__}, not a set of pids"
    wrong = [p for p in chosen if not isinstance(p, int) or isinstance(p, bool)]
    if wrong:
        return f"{wrong[0]!r} is not a pid"
    return ""


def descendants(table: Sequence[ProcessInfo], roots: Iterable[int]) -> dict[int, list[int]]:
    """root → [root, every descendant] (breadth first), from one process table."""
    children: dict[int, list[int]] = {}
    for p in table:
        children.setdefault(p.ppid, []).append(p.pid)
    out: dict[int, list[int]] = {}
    for root in roots:
        order, queue, seen = [], [root], {root}
        while queue:
            pid = queue.pop(0)
            order.append(pid)
            for child in children.get(pid, ()):
                if child not in seen:
                    seen.add(child)
                    queue.append(child)
        out[root] = order
    return out


Call = Callable[..., Any]  # PluginHost.call: (label, fn, *args) under a timeout
Claims = tuple[dict[str, frozenset[int]], dict[str, list[str]]]  # each rule's processes, and its faults


#: a matcher that judges each process alone is offered, on most ticks, only the processes
#: new or changed since the last (the process table hands back the very object of one that
#: did not change), and every process on one tick in this many: a verdict that depends on
#: more than the process (a file, the time) is at most that many ticks late
FULL_OFFER_TICKS = 20

Chosen = dict[str, tuple[LiveRule, frozenset[int]]]  # rule id → (its rule, what its matcher chose of every candidate)


class _Claiming:
    """One tick's claims as they are made: a process belongs to the first rule (highest
    priority first) whose matcher selects it.  A matcher is offered only what no earlier
    rule claimed, except one that judges each process alone, which is offered the
    candidates new or changed since the last tick (every candidate when ``chosen`` has no
    choice of its rule from then) and gets what is left of its whole choice: with a hundred
    rules and a thousand processes, building the list of what is left for each rule, or
    offering each the whole table, cost more than anything else on the tick."""

    def __init__(
        self,
        rules: Sequence[LiveRule],
        candidates: list[ProcessInfo],
        changed: list[ProcessInfo],
        changed_or_gone: set[int],
        chosen: Chosen,
    ) -> None:
        self.candidates = candidates
        self.pids: dict[str, frozenset[int]] = {live.rule.id: frozenset() for live in rules}
        self.faults: dict[str, list[str]] = {live.rule.id: list(live.faults) for live in rules}
        self._all = {p.pid for p in candidates}
        self._offered = set(self._all)  # what no rule claimed yet
        self._left, self._stale = candidates, False  # the candidates no rule claimed (stale: rebuild it)
        self._changed = changed  # the candidates new or changed since the last tick
        self._changed_pids = {p.pid for p in changed}
        self._changed_or_gone = changed_or_gone  # and the pids that vanished since
        self.chosen = chosen
        self._partial: set[str] = set()  # rules offered only what changed

    def offer(self, live: LiveRule) -> Sequence[ProcessInfo] | None:
        """What this rule's matcher is to choose from (None: it has no matcher)."""
        if live.matcher is None:
            return None
        if live.matcher.judges_each_process is True:
            before = self.chosen.get(live.rule.id)
            if before is not None and before[0] is live:
                self._partial.add(live.rule.id)
                return self._changed
            return self.candidates
        if self._stale:
            self._left, self._stale = [p for p in self.candidates if p.pid in self._offered], False
        return self._left

    def take(self, live: LiveRule, chosen: object) -> None:
        """What its matcher chose, or the PluginFailed it met."""
        rid, label = live.rule.id, matcher_label(live)
        if isinstance(chosen, PluginFailed):
            self.faults[rid].append(str(chosen))
            self.chosen.pop(rid, None)
            return
        problem = selection_problem(chosen)
        if problem:
            self.faults[rid].append(f"{label}: returned garbage: {problem}")
            self.chosen.pop(rid, None)
            return
        if rid in self._partial:
            kept = self.chosen[rid][1] - self._changed_or_gone
            whole = kept | (self._changed_pids & set(chosen))  # type: ignore[call-overload]
        else:
            whole = frozenset(p for p in chosen if p in self._all)  # type: ignore[attr-defined]
        if live.matcher is not None and live.matcher.judges_each_process is True:
            self.chosen[rid] = (live, whole)
        mine = whole & self._offered
        self.pids[rid] = mine
        if mine:
            self._offered -= mine
            self._stale = True


def matcher_label(live: LiveRule) -> str:
    return f"matchers/{live.rule.match.kind} ({live.rule.id})"


class Claimer:
    """Runs every rule's matcher in one plugin call a tick (a hundred hand-offs to a pool
    thread cost more than the matching), and names the one that hangs.  :meth:`claiming`
    yields its plugin calls as steps (the tick runs them with its others, see
    :mod:`arbiter.pluginsteps`); :meth:`claim` makes each through ``call``.  While a matcher a
    batch hung in still runs, the rules are matched one call each, as a hung call cannot be
    stopped: the hung one's rule fails at once, the others go on."""

    def __init__(self, call: Call) -> None:
        self.call = call
        self._hung = ""  # the label of the matcher the last batch hung in, while it still runs
        self._hung_why = ""
        self._last: dict[int, ProcessInfo] = {}  # the last tick's candidates
        self._chosen: Chosen = {}
        self._ticks = 0
        #: pid → (the rule that selected it first, the rule whose tree it is in and owns it)
        self.moved: dict[int, tuple[str, str]] = {}

    def claim(self, rules: Iterable[LiveRule], candidates: list[ProcessInfo]) -> Claims:
        return drive(self.claiming(rules, candidates), self.call)

    def claiming(self, rules: Iterable[LiveRule], candidates: list[ProcessInfo]) -> Steps[Claims]:
        rules = list(rules)
        pids, faults = yield from self._claim(rules, candidates)
        if not any(live.matcher is not None and live.matcher.judges_each_process is not True for live in rules):
            self.moved = {}
            return pids, faults

        def select(rid: str, matcher: Matcher, offer: Sequence[ProcessInfo]) -> object:
            return self.call(f"matchers/{rid} tree", matcher.select, offer)

        order = [(live.rule.id, live.matcher, live.rule.priority) for live in rules]
        settled, self.moved = settle_trees(order, candidates, pids, select)
        return settled, faults

    def _claim(self, rules: list[LiveRule], candidates: list[ProcessInfo]) -> Steps[Claims]:
        last, self._last = self._last, {p.pid: p for p in candidates}
        self._ticks += 1
        if self._ticks % FULL_OFFER_TICKS == 0:
            self._chosen = {}
        ids = {live.rule.id for live in rules}
        chosen = {rid: c for rid, c in self._chosen.items() if rid in ids}
        # a process that only ran is a new object equal to its last: not changed
        changed = [p for p in candidates if (before := last.get(p.pid)) is not p and before != p]
        gone = last.keys() - self._last.keys()
        claiming = _Claiming(rules, candidates, changed, {p.pid for p in changed} | gone, chosen)
        self._chosen = claiming.chosen
        if self._hung:
            try:
                yield Step("matchers", _nothing)  # fails at once while the hung batch still runs
                self._hung = ""
            except PluginFailed:
                pass
        start = 0
        if not self._hung:
            start = yield from self._batch(rules, claiming)
            if start >= len(rules):
                return claiming.pids, claiming.faults
        for live in rules[start:]:
            label = matcher_label(live)
            if label == self._hung:
                claiming.take(live, PluginFailed(label, f"{self._hung_why}, and that call is still running"))
                continue
            offer = claiming.offer(live)
            if offer is None:
                continue
            try:
                picked = yield Step(label, live.matcher.select, (offer,))  # type: ignore[union-attr]
            except PluginFailed as exc:
                picked = exc
            claiming.take(live, picked)
        return claiming.pids, claiming.faults

    def _batch(self, rules: list[LiveRule], claiming: _Claiming) -> Steps[int]:
        """Every rule in one call; returns how many were done (all, or up to the one that hung)."""
        lock = threading.Lock()
        at = [0, 0]  # [the rule being matched, 1 once the call was given up]

        def run() -> None:
            for k, live in enumerate(rules):
                with lock:
                    if at[1]:
                        return
                    at[0] = k
                    offer = claiming.offer(live)
                if offer is None:
                    continue
                try:
                    chosen: object = live.matcher.select(offer)  # type: ignore[union-attr]
                except Exception as exc:  # one matcher's failure is its rule's, not the others'
                    chosen = PluginFailed(matcher_label(live), f"{type(exc).__name__}: {exc}")
                with lock:
                    if at[1]:
                        return  # too late: the tick went on without it
                    claiming.take(live, chosen)
            with lock:
                at[0] = len(rules)

        try:
            yield Step("matchers", run)
            return len(rules)
        except PluginFailed as exc:
            why = exc.why
            with lock:
                at[1] = 1
                k = at[0]
        if k >= len(rules):
            return k
        label = matcher_label(rules[k])
        self._hung, self._hung_why = label, why
        claiming.take(rules[k], PluginFailed(label, why))
        return k + 1
