"""The tick thread: the slow half of observing, every ``tick_s`` or when woken.

Rule-file reloads, the process table and matching, the GPU readers, every source's state,
certificates checked against this node, and jobs whose processes are gone; the result goes to
the decision thread as one :class:`arbiter.daemon.inbox.Tick`.  It also tells node-state
observers what the node offers, and keeps the service manager's watchdog fed.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from arbiter.config.models import NodeConfig
from arbiter.daemon.decider import Decider, Ongoing
from arbiter.daemon.fleetstate import HeldSince, held_by, labels_told
from arbiter.daemon.inbox import JobEnded, PolicyChanged, Tick
from arbiter.daemon.jobs import JobRegistry
from arbiter.daemon.notify import Notifier
from arbiter.daemon.observe import Observer, TickView, clock_jump_message
from arbiter.daemon.recorder import Recorder
from arbiter.daemon.rules import RuleBook
from arbiter.daemon.snapshot import Published
from arbiter.daemon.sources import BUSY, SlotKey
from arbiter.engine import codes
from arbiter.engine.reacquire import next_look
from arbiter.engine.types import CertView
from arbiter.plugin import Source, SourceState
from arbiter.pluginmanager import PluginFailed, PluginHost
from arbiter.pluginsteps import Steps, each
from arbiter.probing import Prober
from arbiter.runtime.bell import Bell
from arbiter.state.certificates import Certificate, ExeHasher, fingerprint
from arbiter.state.certificates import status as certificate_status
from arbiter.state.store import JobRecord, Store

log = logging.getLogger("arbiter.daemon")

NODE_STATE_EVERY_S = 60.0
RELEASE_POLL_S = 0.02
RELEASE_POLL_FOR_S = 5.0  # a release still pending after this (one queued behind work) waits for ticks
CERTIFICATES_EVERY_S = 5.0  # how often the tick reads certificates again (the A/B harness adds them)


class Ticker:
    """:param status_line: one line on the node, for the service manager's watchdog pings.
    :param reconcile: steps run first on every tick, within its run: jobs an outside
        scheduler started are taken over (where one is due), and twins' published
        certificates read (where due)."""

    def __init__(
        self,
        config: NodeConfig,
        host: PluginHost,
        observer: Observer,
        rules: RuleBook,
        jobs: JobRegistry,
        store: Store,
        recorder: Recorder,
        prober: Prober,
        published: Published,
        decider: Decider,
        status_line: Callable[[], str],
        reconcile: Callable[[], Steps[None]],
    ) -> None:
        self.config = config
        self.host = host
        self.observer = observer
        self.rules = rules
        self.jobs = jobs
        self.store = store
        self.recorder = recorder
        self.prober = prober
        self.published = published
        self.decider = decider
        self.status_line = status_line
        self.reconcile = reconcile
        self.held_since = HeldSince()  # since when new GPU work is held (node state)
        self.scheduler_labels: list[dict[str, Any]] = []  # what the node state observers told their schedulers
        self.notifier = Notifier(None, None)  # the service manager's, if any, is given before start
        self.stop_event = threading.Event()
        self.wake = Bell()  # ends the tick's wait early (reload, stop, a release, admission)
        self.tick_wanted = threading.Event()  # a tick now, not at its turn (reload, a release, a certificate)
        self.admission_told = threading.Event()  # the node state observers are told now, without a tick
        self.reload_wanted = threading.Event()
        self.costs = {"ticks": 0, "tick_cpu_s": 0.0}
        self.hasher = ExeHasher()
        self.certificate_states: list[dict[str, Any]] = []  # each certificate as last checked (for `certificates`)
        self._cert_rows: list[Certificate] = []
        self._certs_read_at = -CERTIFICATES_EVERY_S
        self._expired_certs: set[int] = set()  # seen expired: they stay so, whatever the wall clock says
        self._faults = Ongoing()  # plugin faults seen on the tick
        self._told_running: dict[SlotKey, tuple[Source, bool]] = {}  # what each busy probe was last told
        self._told_events: dict[str, tuple[Source, bool]] = {}  # what each rule's events source was last told
        self._node_state: dict[str, Any] | None = None
        self._node_state_at = 0.0

    def run(self) -> None:
        due: float | None = None  # when the next tick is
        made: Tick | None = None  # the tick made, told as this thread goes to sleep
        while True:
            now = time.monotonic()
            if due is None:
                # while a release awaits its VRAM falling, look every RELEASE_POLL_S: the tenant
                # waiting for that memory should not wait for a whole tick to be told
                releasing = any(
                    st.requested_at is not None and now - st.requested_at < RELEASE_POLL_FOR_S
                    for st in self.decider.engine_state.vram.values()
                )
                wait = min(self.config.tick_s, RELEASE_POLL_S) if releasing else self.config.tick_s
                # a tenant to wake once its quiet period ends is looked at then, not a tick later
                waking = next_look(self.decider.engine_state.vram.values(), now, RELEASE_POLL_S, RELEASE_POLL_FOR_S)
                due = now + (wait if waking is None else min(wait, waking))
            if made is not None:
                # told last, right before this thread sleeps: the decision thread it wakes
                # finds the interpreter free instead of waiting on this thread for it
                self.decider.tell(made)
                made = None
            self.wake.wait(max(0.0, due - now))
            if self.stop_event.is_set():
                return
            if self.admission_told.is_set():
                self.admission_told.clear()
                try:
                    self._publish_node_state()
                except Exception:  # the tick goes on; its own telling tries again
                    log.exception("telling the node state failed")
            if not self.tick_wanted.is_set() and not self.reload_wanted.is_set() and time.monotonic() < due:
                continue  # only the node state was asked for: the tick keeps its turn
            self.tick_wanted.clear()
            due = None
            try:
                made = self._tick()
            except Exception as exc:  # the loop goes on whatever one tick met
                log.exception("tick failed")
                self.recorder.event(codes.PLUGIN_FAILED, "node", f"a tick failed: {type(exc).__name__}: {exc}")
            # fed by the tick's progress: a tick that hangs stops the pings and gets us restarted
            self.notifier.alive(time.monotonic(), self.status_line)

    def stop(self) -> None:
        self.stop_event.set()
        self.wake.ring()

    def reload(self) -> None:
        """Read the rule files again at once (on this thread, which owns the rule book)."""
        self.reload_wanted.set()
        self.wake.ring()

    def certificates_changed(self) -> None:
        """A certificate was issued: read them again on the next tick, not 5 s later."""
        self._certs_read_at = -CERTIFICATES_EVERY_S
        self.tick_soon()

    def tick_soon(self) -> None:
        """A tick now rather than at its turn."""
        self.tick_wanted.set()
        self.wake.ring()

    def admission_changed(self) -> None:
        """The decision changed what the node admits: fleet schedulers place work by it, so the
        node state observers are told now, on this thread, without a whole tick (a phase
        change flips admission, and the process table, readers and sources read again at that
        moment took cores from the protected program and the jobs being stopped)."""
        self.admission_told.set()
        self.wake.ring()

    def cpu(self) -> float:
        """This thread's CPU seconds so far, with its plugin calls' on the pool threads."""
        return time.thread_time() + self.host.worker_cpu()

    def once(self) -> None:
        """One tick, its result told to the decision thread."""
        self.decider.tell(self._tick())

    def _tick(self) -> Tick:
        """One tick; what the decision thread is to be told (after what the tick told it)."""
        cpu = self.cpu()
        if self.reload_wanted.is_set() or self.rules.changed():
            self.reload_wanted.clear()
            if self.prober.answer is not None:
                self.prober.refresh()  # in the background: drivers may have come or gone
            self.rules.load()
            self.decider.tell(PolicyChanged(self.rules.policy()))
        view, (wanted, readings) = self.host.run_steps(self._observing())
        self._note_faults(view)
        self._reap(view)
        tick = Tick(view, wanted, readings, self._certificates(view))
        self._publish_node_state()
        self.costs["ticks"] += 1
        self.costs["tick_cpu_s"] += self.cpu() - cpu
        return tick

    def end_job(self, record: JobRecord, exit_code: int | None, why: str) -> None:
        self.jobs.update(record.id, state="ended", ended=time.time(), exit_code=exit_code)
        self.decider.tell(JobEnded(record.id))
        self.recorder.event(codes.JOB_EXITED, record.id, f"job {record.name} ended: {why}", {"exit_code": exit_code})

    def _reap(self, view: TickView) -> None:
        """Jobs whose launcher and processes are gone have ended."""
        if view.faults or not view.table_size:
            return  # a table that could not be read says nothing about who is gone
        for record in self.jobs.active():
            launcher_gone = record.launcher_pid not in view.alive
            if record.root_pid is None and launcher_gone:
                self.end_job(record, None, "its launcher went away before it started")
            elif record.root_pid is not None and launcher_gone and not view.job_processes.get(record.id):
                self.end_job(record, None, "its processes are gone")

    def _observing(
        self,
    ) -> Steps[tuple[TickView, tuple[dict[SlotKey, tuple[str, int]], dict[SlotKey, SourceState]]]]:
        """The process table, matching, the GPU readers, the host signals and every source,
        as one run of steps, after the look at the schedulers where one is due: a tick hands
        its plugin calls to the pool once, not a dozen times (each hand-over woke two threads,
        most of what a quiet node cost)."""
        yield from self.reconcile()
        view = yield from self.observer.observing(self.rules, self.jobs.active(), own_pids=[os.getpid()])
        # a protected program's end lets held fleet work go, and its start stops fleet work
        # beside it: both are looked at when they happen
        yield from self.observer.watching_processes(view, self.rules, self.config.tick_s, self.tick_soon)
        return view, (yield from self._read_sources(view))

    def _read_sources(self, view: TickView) -> Steps[tuple[dict[SlotKey, tuple[str, int]], dict[SlotKey, SourceState]]]:
        """Every source of every rule (its kind and rule serial, and its state now), each call
        under a timeout.  A busy probe that
        judges by VRAM is told what its tenant holds first."""
        wanted: dict[SlotKey, tuple[str, int]] = {}
        readings: dict[SlotKey, SourceState] = {}
        calls: list[tuple[str, Callable[..., Any], tuple[Any, ...]]] = []
        asked: list[tuple[SlotKey, int]] = []  # each source read, and where its calls begin
        for rid, live in dict(self.rules.live).items():
            for index, block, source in live.sources():
                key = (rid, index)
                wanted[key] = (block.kind, live.serial)
                # a failure is news now: it must override whatever the watch said last
                if source is None:
                    readings[key] = SourceState(
                        readable=False, why="its source plugin failed", changed_at=time.monotonic()
                    )
                    continue
                asked.append((key, len(calls)))
                ro = view.rules.get(rid) if index == BUSY or type(source).uses_vram else None
                if index == BUSY:
                    running = ro is not None and ro.running
                    told = self._told_running.get(key)
                    if told is None or told[0] is not source or told[1] != running:
                        self._told_running[key] = (source, running)
                        calls.append((f"sources/{block.kind} running", source.tenant_running, (running,)))
                if type(source).uses_vram:
                    held = ro.vram_bytes if ro is not None and ro.running else 0
                    calls.append((f"sources/{block.kind} vram", source.tenant_vram, (held,)))
                calls.append((f"sources/{block.kind}", source.state, ()))
        results = yield from each(calls)
        for gone in self._told_running.keys() - wanted.keys():
            del self._told_running[gone]
        yield from self._tell_events(view)
        for n, (key, first) in enumerate(asked):
            end = asked[n + 1][1] if n + 1 < len(asked) else len(calls)
            failed = next((r for r in results[first:end] if isinstance(r, PluginFailed)), None)
            if failed is not None:
                readings[key] = SourceState(readable=False, why=failed.why, changed_at=time.monotonic())
            else:
                readings[key] = results[end - 1]
        return wanted, readings

    def _tell_events(self, view: TickView) -> Steps[None]:
        """Tell each rule's ``events:`` source whether its program runs, when that changed:
        one that connects to the program need not try while nothing listens."""
        calls: list[tuple[str, Callable[..., Any], tuple[Any, ...]]] = []
        told: list[tuple[str, Source, bool]] = []
        for rid, live in dict(self.rules.live).items():
            source = live.events
            if source is None or live.rule.events is None:
                continue
            ro = view.rules.get(rid)
            running = ro is not None and ro.running
            last = self._told_events.get(rid)
            if last is None or last[0] is not source or last[1] != running:
                calls.append((f"sources/{live.rule.events.kind} running", source.tenant_running, (running,)))
                told.append((rid, source, running))
        results = yield from each(calls)
        for (rid, source, running), result in zip(told, results, strict=True):
            if not isinstance(result, PluginFailed):  # one that failed is told again on the next tick
                self._told_events[rid] = (source, running)
        for gone in self._told_events.keys() - self.rules.live.keys():
            del self._told_events[gone]

    def _certificates(self, view: TickView) -> tuple[CertView, ...]:
        """Every certificate, checked against this node and the protected programs now
        (hashing an executable is cached by path, size and mtime)."""
        now = time.monotonic()
        if now - self._certs_read_at >= CERTIFICATES_EVERY_S:  # not every tick: the database is shared
            try:
                self._cert_rows = self.store.certificates()
                self._certs_read_at = now
            except Exception as exc:  # the state database failing must not stop the tick
                log.warning("cannot read certificates: %s", exc)
                return ()
        current = fingerprint(view.machine, list(view.gpus), view.driver)
        now_wall = time.time()
        views, states = [], []
        for cert in self._cert_rows:
            rule = view.rules.get(cert.rule)
            exe_path = view.rule_exes.get(cert.rule)
            digest = self.hasher.digest(exe_path) if exe_path else None
            if rule is not None and rule.running and digest is None:
                # it runs, but what runs cannot be checked: never trust a certificate blind
                state, why = "stale", f"{cert.rule}'s program runs but its executable cannot be read to check it"
            else:
                state, why = certificate_status(cert, now_wall, current, (exe_path, digest or "") if exe_path else None)
            if state == "expired" and cert.id is not None:
                self._expired_certs.add(cert.id)
            elif state == "valid" and cert.id in self._expired_certs:  # a wall clock set back must not revive it
                state, why = "expired", "it expired while this daemon ran; the wall clock has been set back since"
            views.append(CertView(cert.rule, cert.work, cert.duty, state == "valid", why))
            states.append({**cert.to_dict(), "status": state, "why": why})
        self.certificate_states = states
        return tuple(views)

    def _note_faults(self, view: TickView) -> None:
        """Put each plugin failure on the timeline once, when it starts (not every tick)."""
        now = {(rid, f) for rid, ro in view.rules.items() for f in ro.faults} | {("node", f) for f in view.faults}
        now |= {("node", f) for f in view.reader_faults}  # GPU time it cannot give counts as busy
        for subject, fault in self._faults.started(now):
            self.recorder.event(
                codes.PLUGIN_FAILED, subject, f"{fault}; GPU fleet work is held while it fails", {"fault": fault}
            )
        if view.clock_jump_s is not None:
            self.recorder.event(
                codes.CLOCK_JUMPED, "node", clock_jump_message(view.clock_jump_s), {"jump_s": view.clock_jump_s}
            )

    # --- what the node offers -----------------------------------------------------------------

    def node_state(self) -> dict[str, Any]:
        """What the node offers fleet schedulers now (see the ``arbiter_node_state`` hook)."""
        decision = self.published.snapshot.decision
        certified: dict[str, float] = {}
        for cert in self.decider.certificates:
            if cert.valid:
                certified[cert.rule_id] = max(certified.get(cert.rule_id, 0.0), cert.duty)
        apis = self.prober.answer
        return {
            # None until the probes have answered: no labels rather than "no GPU API"
            "gpu_apis": None
            if apis is None
            else {"host": list(apis.get("host") or []), "containers": list(apis.get("containers") or [])},
            "gpu_jobs_admitted": bool(decision and decision.admits_gpu),
            "certified_duty": certified,
            "gpu_jobs": self.config.gpu_jobs,
            "held_since": self.held_since.update(decision.admits_gpu, time.time()) if decision else None,
            "held_by": held_by(decision),
        }

    def node_fingerprint(self) -> dict[str, Any]:
        """What a certificate earned here now is bound to."""
        view = self.published.snapshot.view
        return fingerprint(view.machine if view else {}, list(view.gpus) if view else [], view.driver if view else "")

    def _publish_node_state(self) -> None:
        """Tell node state observers when it changed, or a minute passed."""
        if self.published.snapshot.decision is None:
            return  # nothing decided yet: admission is not known, so say nothing rather than "no"
        state = self.node_state()
        now = time.monotonic()
        if state == self._node_state and now - self._node_state_at < NODE_STATE_EVERY_S:
            return
        self._node_state, self._node_state_at = state, now
        try:
            answers = self.host.call(
                "node state observers",
                lambda: self.host.hook.arbiter_node_state(
                    state={**state, "at": time.time()}, context=self.host.context(self.config)
                ),
            )
        except PluginFailed as exc:
            log.warning("a node state observer failed: %s", exc)
        else:
            self.scheduler_labels = labels_told(answers)
