"""The fast path: every source report, and the pause or resume a phase change causes at once.

A report is taken on the thread that made it (a source's own thread, a socket thread) when
the act lock is free, nothing older from the same origin waits and the daemon is not
stopping: a hand-off to another thread costs a thread wake-up before the first signal.
Otherwise it is queued for the ``reports`` thread (:meth:`FastPath.run`), which takes the
queue in order.  Either way the same code takes it: into the source book, then, where a
phase of an immediate rule changed, :func:`arbiter.engine.reflex.reflex` says from the last
decision which jobs to pause or resume, and the actuator does it.  The decision thread then
hears which rules changed and has the last word.

Where the reflex process runs (:mod:`arbiter.daemon.linked`), its readings stand for the
sources it watches and its lines are taken here, in order, like any other report.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Iterator
from typing import TypeVar

from arbiter.daemon.act import Actuator
from arbiter.daemon.inbox import (
    HelperGone,
    HelperReport,
    LinkLines,
    Message,
    Report,
    Sourced,
    SourceReport,
    Stop,
    origin,
)
from arbiter.daemon.jobs import JobRegistry
from arbiter.daemon.linked import Linked
from arbiter.daemon.snapshot import Published, Targets
from arbiter.daemon.sources import HelperKey, SlotKey, SourceBook, percentiles, slot_name
from arbiter.engine import codes
from arbiter.engine.reflex import reflex
from arbiter.plugin import SourceState
from arbiter.pluginmanager import PluginHost

log = logging.getLogger("arbiter.daemon")

Record = Callable[[str, str, str], None]
T = TypeVar("T")


class FastPath:
    """Takes reports and acts on phase changes; owns the act lock and the source book.

    :param tell: hands the decision thread a message (the rules whose sources changed).
    """

    def __init__(
        self,
        host: PluginHost,
        book: SourceBook,
        actuator: Actuator,
        jobs: JobRegistry,
        published: Published,
        targets: Targets,
        tell: Callable[[Message], None],
        record: Record,
    ) -> None:
        self.host = host
        self.book = book
        self.actuator = actuator
        self.jobs = jobs
        self.published = published
        self.targets = targets
        self.tell = tell
        self.record = record
        # the actuator, the source book and the snapshot's commit: the reflex and the
        # decision take turns, never holding it while they decide
        self.lock = threading.RLock()
        self._reflexes = 0  # how often its reflex acted
        self.acted_ms: list[float] = []  # latencies of changes a reflex acted on, for the decision's events
        self._reports: queue.Queue[Report] = queue.Queue()
        # per origin, its reports queued and not taken yet (under _queued_lock)
        self._queued: Counter[Hashable] = Counter()
        self._queued_lock = threading.Lock()
        self._stopping = False
        # each fast-path thread's role → what arbiter_fast_thread did for it (status shows
        # it); a source watcher that asked already is marked in its own thread-local
        self.fast_threads: dict[str, str] = {}
        self._fast_asked = threading.local()
        self.linked: Linked | None = None  # the reflex process, where one runs

    # --- reports in -------------------------------------------------------------------------

    def on_source(self, rule_id: str, index: int, state: SourceState) -> None:
        """Called from a source's own thread."""
        key = (rule_id, index)
        linked = self.linked
        if linked is not None and linked.stands_for(key, state):
            return  # the reflex process reads this source; its readings stand for it
        rp = self.published.snapshot.policy.rules.get(rule_id) if index >= 0 else None
        if rp is not None and rp.immediate and not getattr(self._fast_asked, "done", False):
            self._fast_asked.done = True
            self.ask_fast_thread(f"source {rule_id}/{slot_name(index)}")
        self.report(SourceReport(key, state))

    def on_helper(self, helper: HelperKey, key: SlotKey, state: SourceState) -> None:
        """A session helper's report (from a socket thread)."""
        self.report(HelperReport(helper, key, state))

    def helper_gone(self, helper: HelperKey) -> None:
        self.report(HelperGone(helper))

    def ask_fast_thread(self, role: str) -> None:
        """The calling thread carries the fast path: the host may let it have a core sooner."""
        did = self.host.fast_thread(role)
        self.fast_threads[role] = did
        log.info("fast-path thread %s: %s", role, did)

    def report(self, report: Report) -> None:
        """Take a report on this thread, or queue it for the reports thread; never waits.

        It is taken here only when the lock is free, nothing older from the same origin waits
        in the queue (a source's reports are acted on in the order it made them; another
        source's do not hold them back), the daemon is not stopping (what was paused after the
        shutdown's resume would stay paused) and this thread does not hold the lock already (a
        report taken inside a decision's act would act in the middle of it)."""
        key = origin(report)
        lock = self.lock
        if not lock._is_owned() and lock.acquire(blocking=False):  # type: ignore[attr-defined]
            try:
                taken = not self._queued[key] and not self._stopping
                changed = self.take([report]) if taken else set()
            finally:
                lock.release()
            if taken:
                if changed:
                    self.tell(Sourced(frozenset(changed)))
                return
        self.enqueue(report)

    def enqueue(self, report: Report) -> None:
        """For the reports thread, after what waits there already."""
        with self._queued_lock:
            self._queued[origin(report)] += 1
            self._reports.put(report)

    @property
    def reflexes(self) -> int:
        """How often a reflex acted here or in the reflex process: a decision begun before
        that is made again."""
        return self._reflexes + (self.linked.changes if self.linked is not None else 0)

    def lines_came(self) -> None:
        """The reflex process wrote lines (called on the link's reader): the reports thread takes them."""
        self.enqueue(LinkLines())

    def stop(self) -> None:
        self._stopping = True
        self._reports.put(Stop())

    def run(self) -> None:
        """The reports thread: the reports that could not be taken where they were made, in order."""
        self.ask_fast_thread("reports")
        while (batch := drained(self._reports)) is not None:
            with self.lock:
                changed = self.take(batch)
                with self._queued_lock:
                    for report in batch:
                        key = origin(report)
                        self._queued[key] -= 1
                        if not self._queued[key]:
                            del self._queued[key]
            if changed:
                self.tell(Sourced(frozenset(changed)))

    def take(self, batch: Iterable[Report]) -> set[str]:
        """Into the source book, a reflex where a phase changed; the rules whose sources
        changed.  Under the lock; raises nothing (it runs on plugins' and socket threads)."""
        changed: set[str] = set()
        try:
            for report in batch:
                if isinstance(report, LinkLines):
                    if self.linked is not None:
                        self.linked.take(changed)
                    continue
                if isinstance(report, HelperGone):
                    if self.book.helper_gone(report.helper):
                        changed.update(self.published.snapshot.policy.rules)
                    continue
                if isinstance(report, SourceReport):
                    moved = self.book.own(report.key, report.state, "watch")
                elif isinstance(report, HelperReport):
                    moved = self.book.helper(report.helper, report.key, report.state)
                else:
                    continue
                if moved:
                    changed.add(report.key[0])
                    self.reflex(*report.key)
        except Exception as exc:  # the thread that reported must outlive anything one report meets
            log.exception("taking a source report failed")
            self.record(codes.PLUGIN_FAILED, "node", f"a source report failed: {type(exc).__name__}: {exc}")
        return changed

    # --- acting -----------------------------------------------------------------------------

    def reflex(self, rule_id: str, index: int) -> None:
        """A phase change acted on at once, from the last decision (see arbiter.engine.reflex);
        the whole decision follows and has the last word.  Under the lock."""
        snap = self.published.snapshot
        last, obs, view = snap.decision, snap.obs, snap.view
        if last is None or obs is None or view is None:
            return
        try:
            move = reflex(
                obs, last, snap.policy, rule_id, index, self.book.observed((rule_id, index), time.monotonic())
            )
            if not move.pause and not move.resume:
                return
            self._reflexes += 1
            records = {r.id: r for r in self.jobs.active()}
            signalling = self.linked.held() if self.linked is not None else contextlib.nullcontext()
            # what fails here is tried again, and reported, by the decision that follows;
            # the job using the most GPU time is paused alone first (see pause_in_turn)
            with signalling:
                self.actuator.pause_in_turn(self.targets.of(records[jid], view) for jid in move.pause if jid in records)
                if move.resume:
                    paused = self.actuator.trees_paused()
                    entries = [e for jid in move.resume if jid in records for e in paused.get(jid, ())]
                    if entries:
                        self.actuator.resume_entries(entries)
        except Exception:  # the decision that follows must run whatever happened here
            log.exception("the reflex to a phase change failed; the decision acts on it")
            return
        self.acted_ms.extend(self.book.decided(time.monotonic()))

    @contextlib.contextmanager
    def acting(self) -> Iterator[None]:
        """The act lock, and the lock the reflex process signals under, with what it did
        taken in first (a decision made before must not undo it: it is made again)."""
        with self.lock:
            if self.linked is None:
                yield
                return
            with self.linked.held():
                changed = self.take([LinkLines()])
                if changed:
                    self.tell(Sourced(frozenset(changed)))
                yield

    def take_acted_ms(self) -> list[float]:
        """The reflexes' latencies since the last call, and the decision's own.  Under the lock."""
        latency_ms = [*self.acted_ms, *self.book.decided(time.monotonic())]
        self.acted_ms.clear()
        return latency_ms

    # --- status -----------------------------------------------------------------------------

    def figures(self) -> dict[str, object]:
        """From a source seeing a write to the decision it caused, over every source; and
        what the host was asked for each fast-path thread (a removed rule's watcher gone)."""
        live = {f"source {rid}/{slot_name(index)}" for rid, index in list(self.book.slots)}
        threads = {
            role: did
            for role, did in sorted(dict(self.fast_threads).items())  # dict() copies atomically
            if not role.startswith("source ") or role in live
        }
        return {
            **percentiles(list(self.book.latencies)),
            "threads": threads,
            "reflex_process": self.linked.figures() if self.linked is not None else None,
        }


def drained(inbox: queue.Queue[T]) -> list[T] | None:
    """Everything waiting (at least one item), or None once a stop is among it."""
    batch = [inbox.get()]
    while True:
        try:
            batch.append(inbox.get_nowait())
        except queue.Empty:
            break
    return None if any(isinstance(item, Stop) for item in batch) else batch
