"""The daemon's side of the reflex process: which sources it stands for, its lines taken in.

The process (:mod:`arbiter.reflex.process`, started by :class:`arbiter.reflex.link.ReflexLink`)
watches the phase sources of immediate rules and pauses or resumes on a change itself, from
what the daemon armed it with after the last decision.  Its readings then stand for those
sources: the daemon's own watchers' reports of them are set aside, to be taken if it goes.
Its lines are taken and its table armed on the decision thread; a source thread sets its own
report aside (:meth:`Linked.stands_for`), each such write one dict store.  While the process
watches a source, the daemon's own watcher of it is told so (``Source.watched_elsewhere``): it
then reads on its safety interval only, instead of waking and reading each phase line beside
the process at the moment the process pauses jobs, and reads at once when told the process no
longer does.  A phase change it reads but was not armed for, or any after it is gone, is
acted on by the decision its line (or its going) brings about.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol

from arbiter.config.models import NodeConfig
from arbiter.daemon.rules import RuleBook
from arbiter.daemon.snapshot import Published, Targets
from arbiter.daemon.sources import LATENCY_WINDOW, SlotKey, SourceBook, percentiles, slot_name
from arbiter.engine import codes
from arbiter.engine.reflex import reflex
from arbiter.engine.types import Decision, Observation, Policy
from arbiter.plugin import SourceState, Translator
from arbiter.pluginmanager import PluginFailed, PluginHost
from arbiter.reflex.act import Actuator
from arbiter.reflex.link import Gone, ReflexLink
from arbiter.reflex.wire import ArmTable, Moves, Reading, Setup, SourceSpec, arm_key
from arbiter.state.journal import PausedJournal
from arbiter.state.store import JobRecord

log = logging.getLogger("arbiter.daemon")


class Linked:
    """:param acted_ms: the list of acted-on latencies the next decision's events take,
    which its lines extend."""

    def __init__(
        self,
        link: ReflexLink,
        book: SourceBook,
        actuator: Actuator,
        published: Published,
        targets: Targets,
        acted_ms: list[float],
        record: Callable[[str, str, str], None],
        fast_threads: dict[str, str],
    ) -> None:
        self.link = link
        self.book = book
        self.actuator = actuator
        self.published = published
        self.targets = targets
        self.acted_ms = acted_ms
        self.record = record
        self.fast_threads = fast_threads
        self.rules: RuleBook | None = None  # as the last sync saw them: the process watches none before
        self.changes = 0  # what it did, or the journal said, since start: a decision begun before is made again
        # the sources it watches (slot → rule serial): its lines are their readings; the
        # daemon's own watchers' last reports of them are set aside, to be taken if it goes
        self.covered: dict[SlotKey, int] = {}
        self.set_aside: dict[SlotKey, SourceState] = {}
        self.seen: dict[SlotKey, float] = {}  # when its last reading of each came
        # phase changes it acted on (armed) or left to the daemon (not armed yet), and per
        # change it acted on, ms from the source's reading to the lock taken, to the first
        # signal (the job taking the most GPU time, or the resumes) and to the last
        self.counts = Counter[str]()
        self.ms: deque[tuple[float, ...]] = deque(maxlen=LATENCY_WINDOW)

    def stands_for(self, key: SlotKey, state: SourceState) -> bool:
        """A report of the daemon's own watcher: set aside where the process reads that source."""
        if key in self.covered:
            self.set_aside[key] = state
            return True
        return False

    def counts_tick(self, key: SlotKey, quiet_since: float) -> bool:
        """Whether the tick's reading of ``key`` counts: the process's readings stand for a
        source it watches (the daemon's own watcher may lag behind it), but one quiet since
        ``quiet_since`` may have stalled, and then the tick's reading counts."""
        return key not in self.covered or self.seen.get(key, 0.0) < quiet_since

    def held(self) -> contextlib.AbstractContextManager[None]:
        """The lock the process signals under."""
        return self.link.held()

    def take(self, changed: set[str]) -> None:
        """Its lines, in order (the rules whose sources changed go into ``changed``)."""
        for line in self.link.take():
            try:
                self._line(line, changed)
            except Exception as exc:  # the lines after it are still taken
                log.exception("a line of the reflex process failed")
                self.record(
                    codes.PLUGIN_FAILED, "node", f"a line of the reflex process failed: {type(exc).__name__}: {exc}"
                )

    def _line(self, line: Reading | Gone, changed: set[str]) -> None:
        """Its reading of a source, and what it did on it (taken into the record first,
        whoever the line is from now)."""
        if isinstance(line, Gone):
            covered, self.covered = list(self.covered.items()), {}
            aside, self.set_aside = self.set_aside, {}
            for key, serial in covered:
                self._elsewhere(key, serial, False)  # its reports count again: it reads now
            self.reconcile()
            self.record(
                codes.PLUGIN_FAILED,
                "node",
                f"the reflex process was given up ({line.why}): phase "
                "changes are acted on inside the daemon until another starts",
            )
            for key, _ in covered:
                # a phase the process read, acted on and never told is the daemon's own
                # watcher's last report, set aside; it and the pauses taken in from the
                # journal are judged now, not at the next tick
                changed.add(key[0])
                state = aside.get(key)
                if state is not None:
                    self.book.own(key, state, "watch")
            return
        for op, entries in line.did:
            self.actuator.adopt(op, list(entries), list(line.unconfirmed))
        if line.did:
            self.changes += 1
        rid, index, serial = line.slot
        key = (rid, index)
        slot = self.book.slots.get(key)
        if slot is None or slot.serial != serial or line.stale:
            return  # of a rule since reloaded, or of a process given up: the reading no longer counts
        state = line.state
        if state is None:
            if self.covered.pop(key, None) is not None:
                self._elsewhere(key, serial, False)
            self.set_aside.pop(key, None)  # its watcher's reports are taken again from now
            log.info("the reflex process cannot watch %s/%s (%s): the daemon does", rid, slot_name(index), line.why)
            return
        if self.covered.get(key) != serial:
            self.covered[key] = serial
            self._elsewhere(key, serial, True)
        self.seen[key] = time.monotonic()
        if line.thread is not None:
            self.fast_threads[f"source {rid}/{slot_name(index)}"] = f"{line.thread} (in the reflex process)"
        if line.armed is not None:
            self.counts["armed" if line.armed else "not armed"] += 1
            if line.armed and line.acted_at is not None:
                acted = line.acted_at
                self.ms.append(
                    tuple(
                        ((at if at is not None else acted) - state.changed_at) * 1000
                        for at in (line.locked_at, line.first_at, acted)
                    )
                )
        if self.book.own(key, state, "watch"):
            changed.add(rid)
            if line.armed and line.acted_at is not None:
                self.acted_ms.extend(self.book.decided(line.acted_at))

    def _elsewhere(self, key: SlotKey, serial: int, elsewhere: bool) -> None:
        """Tell the daemon's own watcher of ``key`` (of the rule's loading ``serial``) whether
        the process's readings stand for its own."""
        live = self.rules.live.get(key[0]) if self.rules is not None else None
        if live is None or live.serial != serial or not 0 <= key[1] < len(live.phases):
            return  # reloaded since: its sources are new, and watch on their own
        source = live.phases[key[1]]
        if source is None:
            return
        label = f"sources/{live.rule.during[key[1]].source.kind} elsewhere"
        try:
            self.actuator.host.call(label, source.watched_elsewhere, elsewhere, timeout=1)
        except PluginFailed as exc:  # it goes on waking for each change: only the cost is lost
            log.info(
                "the watcher of %s/%s was not told the reflex process reads it: %s", key[0], slot_name(key[1]), exc
            )

    def reconcile(self) -> None:
        """After the process is gone: what the journal holds paused that the record lacks (it
        wrote the row, then died before its line went out) is taken in, and what the record
        holds that the journal says was resumed is kept but tried again.  Both are kept
        unconfirmed: a decision pauses them again where it must, and resumes them where it
        must."""
        journal = self.actuator.journal
        try:
            rows = PausedJournal.replay(journal.path)
        except OSError as exc:
            log.error("cannot read the pause journal after the reflex process: %s", exc)
            return
        paused = self.actuator.paused
        missing = [e for key, e in rows.items() if key not in paused]
        # a journal with rows of the daemon's own missing says nothing of what was resumed
        resumed = [] if journal.failures else [e for key, e in paused.items() if key not in rows]
        if missing:
            self.actuator.adopt("pause", missing, missing)
        self.actuator.unconfirmed.update(e.key for e in resumed)
        if missing or resumed:
            self.changes += 1

    def sync(self, rules: RuleBook, policy: Policy) -> None:
        """Tell the process the phase sources of the immediate rules."""
        self.rules = rules
        specs: list[SourceSpec] = []
        for rid, rp in policy.rules.items():
            live = rules.live.get(rid)
            if not rp.immediate or live is None:
                continue
            for index, during in enumerate(live.rule.during):
                source = live.phases[index] if index < len(live.phases) else None
                # a source fed processes on each tick (its match_option) reads nothing by itself
                if source is not None and type(source).match_option is None:
                    specs.append(SourceSpec(rid, index, live.serial, during.source.kind, during.source.options()))
        self.link.sync(specs)
        self.covered = {
            key: serial
            for key, serial in self.covered.items()
            if (slot := self.book.slots.get(key)) is not None and slot.serial == serial
        }
        for key in list(self.set_aside):  # list() copies atomically: source threads add to it
            if key not in self.covered:
                self.set_aside.pop(key, None)

    def arm(self, obs: Observation, decision: Decision, records: dict[str, JobRecord]) -> None:
        """Per source it watches, per phase value, what the reflex would do from this
        decision: the targets to pause and the entries to resume."""
        view = self.published.snapshot.view
        policy = self.published.snapshot.policy
        arm: ArmTable = {}
        paused = self.actuator.trees_paused()
        now = time.monotonic()
        for (rid, index), serial in self.covered.items():
            seen = self.book.observed((rid, index), now)
            moves: dict[str, Moves] = {}
            for phase in ("on", "off"):
                move = reflex(obs, decision, policy, rid, index, replace(seen, readable=True, phase=phase))
                moves[phase] = Moves(
                    tuple(self.targets.of(records[jid], view) for jid in move.pause if jid in records),
                    tuple(e for jid in move.resume if jid in records for e in paused.get(jid, ())),
                )
            arm[arm_key(rid, index, serial)] = moves
        self.link.arm(arm)

    def settle(self) -> None:
        """After the process was stopped: what it did last, taken in."""
        self.take(set())
        self.reconcile()

    def figures(self) -> dict[str, Any]:
        timed = list(self.ms)
        return {
            "pid": self.link.pid,
            "sources": len(self.covered),
            "failure": self.link.failure,
            "armed": self.counts["armed"],
            "not_armed": self.counts["not armed"],
            "locked": percentiles([t[0] for t in timed]),
            "first": percentiles([t[1] for t in timed]),
            "acted": percentiles([t[2] for t in timed]),
        }


def reflex_process(
    config: NodeConfig,
    host: PluginHost,
    translators: dict[str, tuple[str, Translator]],
    journal_path: Path,
    intake: IntakeSide,
    actuator: Actuator,
    targets: Targets,
) -> tuple[Linked | None, str]:
    """The reflex process's side, where the config asks for one and the pause translator
    bounds its own time (the process waits on it while it holds the signalling lock); else
    None, and why."""
    pause = translators.get("pause")
    if not config.reflex_process:
        return None, "reflex_process: false in the node config"
    if pause is None:
        return None, "no pause translator is available here"
    if not pause[1].bounded:
        return None, (
            f"the pause translator {pause[0]!r} does not bound its own time (the process would wait on it "
            "holding the signalling lock); name a bounded one first under translators: pause"
        )
    only = {info.plugin for info in host.kinds.get("sources", {}).values()}
    pausing = host.kind("translators", pause[0])
    only |= {pausing.plugin} if pausing is not None else set()
    only |= {impl.plugin_name for impl in host.hook.arbiter_fast_thread.get_hookimpls()}
    state_dir = config.state_path()
    setup = Setup(
        plugins=list(config.plugins),
        disable=list(config.disable_plugins),
        only=sorted(only),
        timeout_s=config.plugin_timeout_s,
        state_dir=str(state_dir),
        stand_in_gpu=config.stand_in_gpu,
        sections={name: opts.model_dump(mode="json") for name, opts in host.context(config).sections.items()},
        translator=pause[0],
        journal=str(journal_path),
    )
    # its lines are taken on the decision thread, never on the link's reader: a decision
    # acting there would wait for lines only that reader can read
    link = ReflexLink(setup, state_dir, intake.lines_came)
    return (
        Linked(
            link,
            intake.book,
            actuator,
            intake.published,
            targets,
            intake.acted_ms,
            intake.record,
            intake.fast_threads,
        ),
        "",
    )


class IntakeSide(Protocol):
    """What of the report intake the reflex process's side is wired to."""

    book: SourceBook
    published: Published
    acted_ms: list[float]
    fast_threads: dict[str, str]

    def lines_came(self) -> None: ...
    def record(self, code: str, subject: str, message: str) -> None: ...
