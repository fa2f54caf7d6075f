"""What sources, session helpers and the reflex process report, taken on the decision thread.

A source's own thread, a socket thread (a session helper) or the reflex process's reader
hands its report to the decision thread's inbox and returns; the decision thread takes it
into the source book, in the order it came, and decides at once where an immediate rule's
source changed.  The one fast path is the reflex process (:mod:`arbiter.daemon.linked`): it
pauses or resumes on a phase change itself, from what the last decision armed it with, and
its readings stand for the sources it watches.  Where it does not run, or cannot watch a
source, the decision that follows the report acts.

A report that moves only a count (a progress source's ten thousand lines a second) changes
nothing a decision acts on before the tick: it is held, the latest of each source's, and the
decision thread takes it with the next tick, instead of waking for every one (except while a
paired run measures: each of its decisions reads the count).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator

from arbiter.daemon.inbox import HelperGone, HelperReport, Inbox, LinkLines, Message, Report, SourceReport
from arbiter.daemon.linked import Linked
from arbiter.daemon.snapshot import Published
from arbiter.daemon.sources import HelperKey, SlotKey, SourceBook, percentiles, slot_name
from arbiter.engine import codes
from arbiter.plugin import SourceState
from arbiter.pluginmanager import PluginHost

log = logging.getLogger("arbiter.daemon")

Record = Callable[[str, str, str], None]


class Intake:
    """Reports in from any thread; taken into the source book on the decision thread.

    It owns the decision thread's inbox, which exists before any source starts: a source may
    report from its ``start``, before the decision thread is built.
    """

    def __init__(self, host: PluginHost, book: SourceBook, published: Published, record: Record) -> None:
        self.host = host
        self.book = book
        self.published = published
        self.record = record
        self.inbox: Inbox[Message] = Inbox()
        self.acted_ms: list[float] = []  # latencies of changes the reflex process acted on, for the decision's events
        # each fast thread's role → what arbiter_fast_thread did for it (status shows it); a
        # source watcher that asked already is marked in its own thread-local
        self.fast_threads: dict[str, str] = {}
        self._fast_asked = threading.local()
        self.linked: Linked | None = None  # the reflex process, where one runs
        self.reflex_off = ""  # why none runs
        self._moved = 0  # source changes its lines brought
        # a decision's act and the shutdown's resume take turns: once stopping, nothing is acted on
        self._turn = threading.Lock()
        self._stopping = False
        #: what a decision acts on in the last report each source handed over (its count aside)
        self._handed: dict[SlotKey, tuple[object, ...]] = {}
        self._held: dict[SlotKey, SourceState] = {}  # the latest report of each, held until the tick

    # --- reports in, on any thread --------------------------------------------------------------

    def tell(self, message: Message) -> None:
        """Hand the decision thread a message."""
        self.inbox.put(message)

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
        if not isinstance(state, SourceState):  # garbage is news: the book says why at once
            self.tell(SourceReport(key, state))
            return
        acted_on = (state.readable, state.phase, state.busy, state.why, state.needs_helper)
        decision = self.published.snapshot.decision
        measuring = decision is not None and decision.state.ab is not None and decision.state.ab.running
        # a paired run reads its program's count on every decision: it is handed over at once
        if self._handed.get(key) == acted_on and not measuring:
            self._held[key] = state  # one thread reports each source: the latest stays
            return
        self._handed[key] = acted_on
        self._held.pop(key, None)
        self.tell(SourceReport(key, state))

    def on_helper(self, helper: HelperKey, key: SlotKey, state: SourceState) -> None:
        """A session helper's report (from a socket thread)."""
        self.tell(HelperReport(helper, key, state))

    def helper_gone(self, helper: HelperKey) -> None:
        self.tell(HelperGone(helper))

    def lines_came(self) -> None:
        """The reflex process wrote lines (called on the link's reader)."""
        self.tell(LinkLines())

    def ask_fast_thread(self, role: str) -> None:
        """The calling thread carries a phase change: the host may let it have a core sooner."""
        did = self.host.fast_thread(role)
        self.fast_threads[role] = did
        log.info("fast-path thread %s: %s", role, did)

    # --- on the decision thread ---------------------------------------------------------------

    def take_held(self) -> None:
        """Take the reports held since the last tick (only their counts moved)."""
        for key in list(self._held):
            state = self._held.pop(key, None)
            if state is not None:
                self.book.own(key, state, "watch")

    def take(self, report: Report) -> set[str]:
        """Into the source book; the rules whose sources changed.  Raises nothing: one bad
        report must not cost the decision the others."""
        changed: set[str] = set()
        try:
            if isinstance(report, LinkLines):
                self._lines(changed)
            elif isinstance(report, HelperGone):
                if self.book.helper_gone(report.helper):
                    changed.update(self.published.snapshot.policy.rules)
            elif isinstance(report, SourceReport):
                if self.book.own(report.key, report.state, "watch"):
                    changed.add(report.key[0])
            elif self.book.helper(report.helper, report.key, report.state):
                changed.add(report.key[0])
        except Exception as exc:
            log.exception("taking a source report failed")
            self.record(codes.PLUGIN_FAILED, "node", f"a source report failed: {type(exc).__name__}: {exc}")
        return changed

    def _lines(self, changed: set[str]) -> None:
        if self.linked is not None:
            before = len(changed)
            self.linked.take(changed)
            if len(changed) > before:
                self._moved += 1

    @property
    def changes(self) -> int:
        """How often the reflex process acted, or its lines moved a source: a decision made
        before that is made again."""
        return self._moved + (self.linked.changes if self.linked is not None else 0)

    @contextlib.contextmanager
    def acting(self) -> Iterator[bool]:
        """Held while a decision acts: the lock the reflex process signals under, with what
        it did taken in first (a decision made before that is made again).  Yields whether
        the decision may act: not once the daemon is stopping."""
        with self._turn:
            if self._stopping:
                yield False
            elif self.linked is None:
                yield True
            else:
                with self.linked.held():
                    self._lines(set())
                    yield True

    @contextlib.contextmanager
    def stopped(self, wait_s: float) -> Iterator[None]:
        """For the shutdown's resume: no decision acts from now on, and one acting now is
        waited for (at most ``wait_s``: a resume that waits forever resumes nothing)."""
        self._stopping = True
        taken = self._turn.acquire(timeout=wait_s)
        if not taken:
            log.error("a decision still acting after %gs: everything is resumed beside it", wait_s)
        try:
            yield
        finally:
            if taken:
                self._turn.release()

    def take_acted_ms(self) -> list[float]:
        """The reflex process's latencies since the last call, and the decision's own."""
        latency_ms = [*self.acted_ms, *self.book.decided(time.monotonic())]
        self.acted_ms.clear()
        return latency_ms

    # --- status, on any thread ----------------------------------------------------------------

    def figures(self) -> dict[str, object]:
        """From a source seeing a write to the decision it caused, over every source; and
        what the host was asked for each fast thread (a removed rule's watcher gone)."""
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
            "reflex_off": self.reflex_off,
        }
