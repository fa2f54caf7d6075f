"""The daemon: observe → decide → act → record, on the tick and on the fast path.

Threads and what they may do:

- ``tick``: process table, matching, readers, rule-file reloads (slow), then hands a
  :class:`TickView` to the decision thread;
- the fast path: a source's or helper's report is taken on the thread that made it (a
  source's own thread, a socket thread), which keeps the source book and, where a phase of
  an immediate rule changed, pauses or resumes at once from the last decision
  (arbiter.engine.reflex), then tells the decision thread.  A hand-off to another thread
  cost a thread wake-up, half a millisecond and more under load, before the first signal.
  Where that would wait (the lock is held, or older reports wait) the report is queued for
  ``reflex``, which takes them in order;
- ``decide``: takes tick views, source changes and job changes from its inbox, re-decides
  from the last view with only what changed, acts through translators and hands timeline
  entries to the recorder.  Nothing slow runs here either.  The two take turns on the
  actuator and the source book (``_act_lock``), and a decision made while the reflex acted
  is made again on what the reflex saw, so it never undoes it;
- ``recorder``: SQLite commits and timeline observers;
- the socket and HTTP servers answer from the last published snapshot.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import queue
import sqlite3
import sys
import threading
import time
from collections import Counter, deque
from collections.abc import Hashable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from arbiter import __version__
from arbiter.certificates import Certificate, ExeHasher, fingerprint
from arbiter.certificates import status as certificate_status
from arbiter.config.models import NodeConfig
from arbiter.daemon.abruns import certificate, resumed_from, supersede
from arbiter.daemon.act import Actuator, make_translators, next_seq
from arbiter.daemon.handoff import TenantActions
from arbiter.daemon.helpers import Helpers
from arbiter.daemon.jobs import JobRegistry
from arbiter.daemon.notify import Notifier, status_line
from arbiter.daemon.observe import Observer, TickView, clock_jump_message
from arbiter.daemon.recorder import Recorder
from arbiter.daemon.reflexlink import Arm, ReflexLink, Spec
from arbiter.daemon.rules import RuleBook
from arbiter.daemon.secure import check_state_dir, ensure_token
from arbiter.daemon.sources import (
    BUSY,
    LATENCY_WINDOW,
    PROGRESS,
    HelperKey,
    SlotKey,
    SourceBook,
    percentiles,
    slot_name,
)
from arbiter.engine import codes, governor
from arbiter.engine.abrun import RunState, to_record
from arbiter.engine.compliance import trust_from_record, trust_to_record
from arbiter.engine.decide import decide
from arbiter.engine.handoff import request_over
from arbiter.engine.reflex import reflex
from arbiter.engine.types import (
    Action,
    CertView,
    CompliancePolicy,
    Decision,
    EngineState,
    GovernorPolicy,
    Observation,
    Policy,
    SourceObs,
    evolve,
)
from arbiter.plugin import JobTarget, ProcessRef, SourceState
from arbiter.pluginmanager import PluginFailed, PluginHost, build_plugin_manager
from arbiter.probing import Prober
from arbiter.reflexhost import arm_key
from arbiter.store import JobRecord, PausedEntry, PausedJournal, Store
from arbiter.transport import SocketServer

log = logging.getLogger("arbiter.daemon")

DAEMON_FILE = "daemon.json"
SOCKET_FILE = "arbiter.sock"
TOKEN_FILE = "token"
NODE_STATE_EVERY_S = 60.0
PROBE_DELAY_S = 60.0
RELEASE_POLL_S = 0.02
REDECIDE_AT_MOST = 3  # then the reflex waits for the decision: a flapping source must not starve it
RELEASE_POLL_FOR_S = 5.0  # a release still pending after this (one queued behind work) waits for ticks
FAST_SWITCH_S = 0.0005  # the interpreter's switch interval while the daemon runs (see _decide_loop)
CERTIFICATES_EVERY_S = 5.0  # how often the tick reads certificates again (the A/B harness adds them)


class Ongoing:
    """Conditions that repeat on every tick or decision, recorded once when they start."""

    def __init__(self) -> None:
        self._now: set[tuple[str, str]] = set()

    def started(self, now: set[tuple[str, str]]) -> list[tuple[str, str]]:
        new = sorted(now - self._now)
        self._now = now
        return new

    @property
    def current(self) -> frozenset[tuple[str, str]]:
        return frozenset(self._now)


class DaemonAlreadyRunning(Exception):
    """Another daemon uses this state directory."""


def platform_name() -> str:
    return {"darwin": "darwin", "win32": "windows"}.get(sys.platform, "linux")


@dataclass
class Snapshot:
    """What the last decision saw and said; replaced whole after every decision."""

    decision: Decision | None = None
    obs: Observation | None = None  # what it was made on
    view: TickView | None = None
    jobs: list[JobRecord] = field(default_factory=list)
    decided_at: float = 0.0


@dataclass(frozen=True)
class _Acted:
    """What carrying the snapshot's decision out leaves for after the act lock."""

    before: EngineState  # the engine state the decision was made from
    now: float
    failures: list[tuple[str, str]]  # (job id, what failed)
    latency_ms: list[float]  # the fast path's, since the last decision


class Daemon:
    def __init__(self, config: NodeConfig, config_path: Path | None = None, host: PluginHost | None = None) -> None:
        self.config = config
        self.config_path = config_path
        self.host = host or build_plugin_manager(
            config.plugins, config.disable_plugins, timeout_s=config.plugin_timeout_s
        )
        self.state_dir = config.state_path()
        self.uid = os.geteuid()
        self.started_wall = time.time()
        self._inbox: queue.Queue[tuple[str, Any]] = queue.Queue()
        self._reports: queue.Queue[tuple[str, Any]] = (
            queue.Queue()
        )  # sources' and helpers' that could not be taken at once
        # per origin (a source's slot, a helper), its reports put in _reports and not taken
        # yet (under _queued_lock): only an origin's own older reports hold a report back
        self._queued: Counter[Hashable] = Counter()
        self._queued_lock = threading.Lock()
        # the actuator, the source book and the snapshot's commit: the reflex and the
        # decision take turns, never holding it while they decide
        self._act_lock = threading.RLock()
        self._reflexes = 0  # how often the reflex has acted: a decision begun before is made again
        self._stop = threading.Event()
        self._wake = threading.Event()  # ends the tick's wait early (reload, stop)
        self._reload_wanted = threading.Event()
        self._threads: list[threading.Thread] = []
        # each fast-path thread's role → what arbiter_fast_thread did for it (status shows
        # it); a source watcher that asked already is marked in its own thread-local
        self.fast_threads: dict[str, str] = {}
        self._fast_asked = threading.local()
        self._engine_state = EngineState()
        self._policy = Policy()
        self._view: TickView | None = None
        self._acted_ms: list[float] = []  # latencies of changes the reflex acted on, for the decision's events
        # the targets built from one view, under _act_lock: a phase pausing fifty jobs built
        # them all on its way to the first signal
        self._targets: tuple[TickView | None, dict[tuple[Any, ...], JobTarget]] = (None, {})
        self.sources = SourceBook(config.governor.period_s)  # written under _act_lock; other threads only read
        self._certs: tuple[CertView, ...] = ()
        self.certificate_states: list[dict[str, Any]] = []  # each certificate as last checked (for `certificates`)
        self.hasher = ExeHasher()
        self._cert_rows: list[Certificate] = []
        self._certs_read_at = -CERTIFICATES_EVERY_S
        self._expired_certs: set[int] = set()  # seen expired: they stay so, whatever the wall clock says
        # GPU API probes: on first need, or PROBE_DELAY_S after start (node labels), on reload and doctor
        self.prober = Prober(lambda: self.host.kind_names("probes"), config.plugins, config.disable_plugins)
        self._node_state: dict[str, Any] | None = None
        self._node_state_at = 0.0
        # CPU seconds of ticking and deciding: the thread's own, plus what the plugin calls it
        # made spent on pool threads (not the whole process: source watchers run beside them)
        self.costs = {"ticks": 0, "tick_cpu_s": 0.0, "decisions": 0, "decide_cpu_s": 0.0, "redecisions": 0}
        self.snapshot = Snapshot()
        self._faults = Ongoing()  # plugin faults seen on the tick
        self._failures = Ongoing()  # actions that failed on the decision thread
        self._failed_controls: dict[str, Action] = {}
        self.http_url = ""
        self._http: Any = None
        self._socket: SocketServer | None = None
        self.notifier = Notifier(None, None)  # serve() gives it the service manager's, if any
        self.link: ReflexLink | None = None  # the reflex process, where the pause translator allows one
        # the sources the reflex process watches (slot → rule serial), under _act_lock: its
        # lines are their readings; the daemon's own watchers' last reports of them are set
        # aside, to be taken if it goes
        self._covered: dict[SlotKey, int] = {}
        self._set_aside: dict[SlotKey, SourceState] = {}
        self._link_seen: dict[SlotKey, float] = {}  # when its last reading of each came
        # phase changes it acted on (armed) or left to the daemon (not armed yet), and per
        # change it acted on, ms from the source's reading to the lock taken, to the first
        # signal (the job taking the most GPU time, or the resumes) and to the last
        self._link_counts = Counter[str]()
        self._link_ms: deque[tuple[float, ...]] = deque(maxlen=LATENCY_WINDOW)

    # --- start and stop -----------------------------------------------------------------------

    def start(self) -> None:
        check_state_dir(self.state_dir)
        self._lock_fd = os.open(self.state_dir / "lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock_fd)
            raise DaemonAlreadyRunning(f"another daemon holds {self.state_dir}; `arbiter status` shows it") from None
        self.store = Store(self.state_dir / "state.db")
        self.recorder = Recorder(self.store, self._observe_event)
        self.recorder.start()
        journal_path = self.state_dir / "paused.journal"
        translators = make_translators(self.config, self.host, self._pid_reused, self._translator_note)
        recovered = {**{e.key: e for e in self.store.paused()}, **PausedJournal.replay(journal_path)}
        self.journal = PausedJournal(journal_path)
        self.actuator = Actuator(self.host, translators, self.journal, self.recorder.paused)
        if recovered:
            # a previous daemon died holding these: never leave work frozen
            self.actuator.paused.update(recovered)
            failures = self.actuator.resume_entries(list(recovered.values()))
            self.recorder.event(
                codes.JOB_RESUMED,
                "node",
                f"resumed {len(recovered)} paused item(s) left by a previous daemon",
                {"failures": failures},
            )
        self.tenants = TenantActions(self)
        self.tenants.restore_all("a previous daemon left it applied")
        self.recorder.flush()
        try:
            self.store.clear_paused()
            self.journal.truncate()
        except (sqlite3.Error, OSError) as exc:  # a full or read-only state directory: protect anyway
            self.recorder.failed(exc)
        kept = list(self.actuator.paused.values())  # what could not be resumed stays on record
        for entry in kept:
            self.journal.append("pause", entry)
        self.recorder.paused("pause", kept)
        pause = translators.get("pause")
        if self.config.reflex_process and pause is not None and pause[1].bounded:
            only = {info.plugin for info in self.host.kinds.get("sources", {}).values()}
            only |= {self.host.kind("translators", pause[0]).plugin}  # type: ignore[union-attr]
            only |= {impl.plugin_name for impl in self.host.hook.arbiter_fast_thread.get_hookimpls()}
            setup = {
                "plugins": self.config.plugins,
                "disable": self.config.disable_plugins,
                "only": sorted(only),
                "timeout_s": self.config.plugin_timeout_s,
                "state_dir": str(self.state_dir),
                "stand_in_gpu": self.config.stand_in_gpu,
                "translator": pause[0],
                "journal": str(journal_path),
            }
            # its lines are taken on the reflex thread, never on the link's reader: a reflex
            # taken there would wait for lines only that reader can read
            self.link = ReflexLink(setup, self.state_dir, lambda: self._enqueue(("link", "link")))

        now, now_wall = time.monotonic(), time.time()
        trust = {name: trust_from_record(rec, now, now_wall) for name, rec in self.store.trust().items()}
        governors = {rid: governor.from_record(rec, now, now_wall) for rid, rec in self.store.governors().items()}
        # strikes, distrust and each rule's governor outlive a restart
        run, run_problem = resumed_from(self.store.running_run())
        self._engine_state = EngineState(trust=trust, governors=governors, ab=run)
        self.jobs = JobRegistry(self.state_dir / "jobs", self._persist_job, platform_name())
        self.jobs.load(self.store)
        self.rulebook = RuleBook(self.config, self.host, self.store, self._on_source, self._record)
        self.rulebook.load()
        self._policy = self.rulebook.policy(self._base_policy())
        self.observer = Observer(self.config, self.host)
        self.token = ensure_token(self.state_dir / TOKEN_FILE)

        # not at once: seven probe processes would slow every start; the first need starts them sooner
        timer = threading.Timer(PROBE_DELAY_S, self.prober.get)
        timer.daemon = True
        timer.start()
        self._spawn("decide", self._decide_loop)
        self._spawn("reflex", self._reflex_loop)
        self._tick_once()  # the first decision waits for a full view
        self._spawn("tick", self._tick_loop)
        self.helpers = Helpers(self)
        self._socket = SocketServer(self.state_dir / SOCKET_FILE, self.dispatch, {"helper.attach": self.helpers.open})
        self._socket.start()
        if self.config.http.enabled:
            self._start_http()
        self._write_daemon_file()
        self._record(
            codes.DAEMON_STARTED,
            "node",
            f"arbiter {__version__} started (pid {os.getpid()})",
            {"config": str(self.config_path or "")},
        )
        if run is not None and run.running:
            self._record(
                codes.AB_RUN_STARTED,
                run.spec.rule_id,
                f"paired run {run.spec.run_id} resumed with "
                f"{len(run.blocks)} of {run.target} blocks done (the window in progress was discarded)",
                {"run": run.spec.run_id, "resumed": True},
            )
        if run_problem:
            self._record(codes.PLUGIN_FAILED, "node", run_problem)

    def _spawn(self, name: str, target: Any) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    def _start_http(self) -> None:
        from arbiter.http.server import HttpServer  # the CLI never pays for importing it

        try:
            self._http = HttpServer(self, self.config.http.host, self.config.http.port)
            self.http_url = self._http.start()
        except Exception as exc:  # a port in use must not stop protection
            self._record(
                codes.PLUGIN_FAILED, "http", f"HTTP listener did not start: {exc}", {"listen": self.config.http.listen}
            )
            self._http = None

    def _write_daemon_file(self) -> None:
        info = {
            "pid": os.getpid(),
            "socket": str(self.state_dir / SOCKET_FILE),
            "http": self.http_url,
            "version": __version__,
            "state_dir": str(self.state_dir),
            "started": self.started_wall,
        }
        tmp = self.state_dir / f".{DAEMON_FILE}.tmp"
        tmp.write_text(json.dumps(info))
        os.chmod(tmp, 0o644)
        os.replace(tmp, self.state_dir / DAEMON_FILE)

    def wait(self, timeout: float | None = None) -> bool:
        return self._stop.wait(timeout)

    def request_stop(self) -> None:
        self._stop.set()
        self._wake.set()
        self._inbox.put(("stop", None))
        self._reports.put(("stop", None))

    def request_reload(self) -> None:
        """Read the rule files again at once (on the tick thread, which owns the rule book)."""
        self._reload_wanted.set()
        self._wake.set()

    def notify_jobs(self) -> None:
        """The registry changed: decide again now rather than at the next tick."""
        self._inbox.put(("jobs", None))

    def shutdown(self) -> None:
        """Resume everything, write every job's control document back to run, and exit."""
        self.request_stop()
        for thread in self._threads:
            thread.join(timeout=10)
        if self._socket:
            self._socket.close()
        if self._http:
            self._http.stop()
        if self.link is not None:
            self.link.close()
        with self._act_lock:  # after a reflex still acting on a source's thread, if one is
            if self.link is not None:  # what it paused last is resumed below
                self._take_reports([("link", "link")])
                self._reconcile()
            failures = self.actuator.resume_entries(list(self.actuator.paused.values()))
        self.tenants.close()
        self.tenants.restore_all("arbiter stopped")
        self._record(codes.DAEMON_STOPPED, "node", "arbiter stopped; paused work resumed", {"failures": failures})
        self.rulebook.close()
        self.observer.close()
        self.recorder.close()
        self.journal.truncate()
        self.journal.close()
        self.store.close()
        self.host.close()
        try:
            (self.state_dir / DAEMON_FILE).unlink()
        except FileNotFoundError:
            pass
        os.close(self._lock_fd)  # releases the lock

    # --- recording ------------------------------------------------------------------------------

    def _record(self, code: str, subject: str, message: str, data: dict[str, Any] | None = None) -> None:
        self.recorder.event(code, subject, message, data)

    record = _record

    def _pid_reused(self, job_id: str, ref: ProcessRef, why: str) -> None:
        """A translator refused to signal a recorded process (called on its thread: only queues)."""
        if not job_id:  # a resume names no job: the paused set knows whose the process was
            actuator = getattr(self, "actuator", None)
            paused = list(actuator.paused.values()) if actuator is not None else []
            job_id = next((e.job_id for e in paused if e.pid == ref.pid and e.start_time == ref.start_time), "")
        self._record(codes.PID_REUSED, job_id or "node", why, {"pid": ref.pid, "recorded_start": ref.start_time})

    def _translator_note(self, job_id: str, code: str, message: str, data: dict[str, Any]) -> None:
        """A translator says what an action did (called on its thread: only queues)."""
        if not job_id and "pid" in data:  # a resume names no job: the paused set knows whose the process was
            actuator = getattr(self, "actuator", None)
            paused = list(actuator.paused.values()) if actuator is not None else []
            job_id = next((e.job_id for e in paused if e.pid == data["pid"]), "")
        self._record(code, job_id or "node", message, data)

    @property
    def engine_state(self) -> EngineState:
        return self._engine_state

    @property
    def policy(self) -> Policy:
        return self._policy

    def profiles_applied(self) -> set[str]:
        return set(self.tenants.applied)

    def action_failures(self) -> list[tuple[str, str]]:
        """Actions failing on the decision thread now: (job id, what failed)."""
        return sorted(self._failures.current)

    def put(self, kind: str, payload: Any) -> None:
        """Hand something to the decision thread."""
        self._inbox.put((kind, payload))

    def certificates_changed(self) -> None:
        """A certificate was issued: read them again on the next tick, not 5 s later."""
        self._certs_read_at = -CERTIFICATES_EVERY_S
        self._wake.set()

    def _observe_event(self, event: dict[str, Any]) -> None:
        self.host.call("timeline observers", lambda: self.host.hook.arbiter_timeline_event(event=event))

    def _persist_job(self, record: JobRecord) -> None:
        snapshot = replace(record)
        self.recorder.write(lambda db: Store.put_job(db, snapshot))

    def _base_policy(self) -> Policy:
        c = self.config
        return Policy(
            gpu_jobs=c.gpu_jobs,
            busy_threshold=c.gpu_busy_threshold,
            release_after_s=c.gpu_release_after_s,
            stop_grace_s=c.stop_grace_s,
            compliance=CompliancePolicy(**c.compliance.model_dump()),
            governor=GovernorPolicy(**c.governor.model_dump(), min_available=c.memory_guard.min_available),
            pause_frees_vram=self._pause_frees_vram(),
        )

    def _pause_frees_vram(self) -> bool:
        """Whether the pause translator gives a paused job's VRAM back (see Translator.frees_vram)."""
        actuator = getattr(self, "actuator", None)
        pausing = actuator.translators.get("pause") if actuator is not None else None
        return bool(pausing is not None and pausing[1].frees_vram)

    # --- the tick -------------------------------------------------------------------------------

    def _tick_loop(self) -> None:
        while True:
            # while a release awaits its VRAM falling, look every RELEASE_POLL_S: the tenant
            # waiting for that memory should not wait for a whole tick to be told
            now = time.monotonic()
            releasing = any(
                st.requested_at is not None and now - st.requested_at < RELEASE_POLL_FOR_S
                for st in self._engine_state.vram.values()
            )
            self._wake.wait(min(self.config.tick_s, RELEASE_POLL_S) if releasing else self.config.tick_s)
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                self._tick_once()
            except Exception as exc:  # the loop goes on whatever one tick met
                log.exception("tick failed")
                self._record(codes.PLUGIN_FAILED, "node", f"a tick failed: {type(exc).__name__}: {exc}")
            # fed by the tick's progress: a tick that hangs stops the pings and gets us restarted
            self.notifier.alive(time.monotonic(), lambda: status_line(self))

    def _cpu(self) -> float:
        """This thread's CPU seconds so far, with its plugin calls' on the pool threads."""
        return time.thread_time() + self.host.worker_cpu()

    def _tick_once(self) -> None:
        cpu = self._cpu()
        if self._reload_wanted.is_set() or self.rulebook.changed():
            self._reload_wanted.clear()
            self._reload_rules()
        view = self.observer.observe(self.rulebook, self.jobs.active(), own_pids=[os.getpid()])
        self._note_faults(view)
        self._reap(view)
        self._inbox.put(("tick", (view, *self._read_sources(view), self._certificates(view))))
        self._publish_node_state()
        self.costs["ticks"] += 1
        self.costs["tick_cpu_s"] += self._cpu() - cpu

    def node_state(self) -> dict[str, Any]:
        """What the node offers fleet schedulers now (see the ``arbiter_node_state`` hook)."""
        decision = self.snapshot.decision
        certified: dict[str, float] = {}
        for cert in self._certs:
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
        }

    def _publish_node_state(self) -> None:
        """On the tick thread: tell node state observers when it changed, or a minute passed."""
        if self.snapshot.decision is None:
            return  # nothing decided yet: admission is not known, so say nothing rather than "no"
        state = self.node_state()
        now = time.monotonic()
        if state == self._node_state and now - self._node_state_at < NODE_STATE_EVERY_S:
            return
        self._node_state, self._node_state_at = state, now
        try:
            self.host.call(
                "node state observers", lambda: self.host.hook.arbiter_node_state(state={**state, "at": time.time()})
            )
        except PluginFailed as exc:
            log.warning("a node state observer failed: %s", exc)

    def node_fingerprint(self) -> dict[str, Any]:
        """What a certificate earned here now is bound to."""
        view = self.snapshot.view
        return fingerprint(view.machine if view else {}, list(view.gpus) if view else [])

    def _certificates(self, view: TickView) -> tuple[CertView, ...]:
        """On the tick thread: every certificate, checked against this node and the protected
        programs now (hashing an executable is cached by path, size and mtime)."""
        now = time.monotonic()
        if now - self._certs_read_at >= CERTIFICATES_EVERY_S:  # not every tick: the database is shared
            try:
                self._cert_rows = self.store.certificates()
                self._certs_read_at = now
            except Exception as exc:  # the state database failing must not stop the tick
                log.warning("cannot read certificates: %s", exc)
                return ()
        current = fingerprint(view.machine, list(view.gpus))
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
            self._record(
                codes.PLUGIN_FAILED, subject, f"{fault}; GPU fleet work is held while it fails", {"fault": fault}
            )
        if view.clock_jump_s is not None:
            self._record(
                codes.CLOCK_JUMPED, "node", clock_jump_message(view.clock_jump_s), {"jump_s": view.clock_jump_s}
            )

    def _reload_rules(self) -> None:
        if self.prober.answer is not None:
            self.prober.refresh()  # in the background: drivers may have come or gone
        self.rulebook.load()
        self._inbox.put(("policy", self.rulebook.policy(self._base_policy())))

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

    def end_job(self, record: JobRecord, exit_code: int | None, why: str) -> None:
        self.jobs.update(record.id, state="ended", ended=time.time(), exit_code=exit_code)
        self._inbox.put(("ended", record.id))
        self._record(codes.JOB_EXITED, record.id, f"job {record.name} ended: {why}", {"exit_code": exit_code})

    # --- the decision thread (fast path) --------------------------------------------------------

    def _on_source(self, rule_id: str, index: int, state: SourceState) -> None:
        """Called from a source's own thread."""
        # every report of every source passes here: the rule is looked up, and nothing made
        if (rule_id, index) in self._covered:
            self._set_aside[(rule_id, index)] = state
            return  # the reflex process reads this source; its readings stand for it
        rp = self._policy.rules.get(rule_id) if index >= 0 else None
        if rp is not None and rp.immediate and not getattr(self._fast_asked, "done", False):
            self._fast_asked.done = True
            self._fast_thread(f"source {rule_id}/{slot_name(index)}")
        self._report(("source", (rule_id, index, state)))

    def _fast_thread(self, role: str) -> None:
        """The calling thread carries the fast path: the host may let it have a core sooner."""
        did = self.host.fast_thread(role)
        self.fast_threads[role] = did
        log.info("fast-path thread %s: %s", role, did)

    def _report(self, report: tuple[str, Any]) -> None:
        """Take a report on this thread, or queue it for the reflex thread; never waits.

        It is taken here only when the lock is free, nothing older from the same origin waits
        in the queue (a source's reports are acted on in the order it made them; another
        source's do not hold them back: a log counted a hundred times a second, queued behind
        a decision's act, would make a phase change wait for the reflex thread), the daemon is
        not stopping (what was paused after the shutdown's resume would stay paused) and this
        thread does not hold the lock already (no plugin code of a source runs under it, but
        a report taken inside a decision's act would act in the middle of it)."""
        origin = _origin(report)
        lock = self._act_lock
        if not lock._is_owned() and lock.acquire(blocking=False):  # type: ignore[attr-defined]
            try:
                taken = not self._queued[origin] and not self._stop.is_set()
                changed = self._take_reports([report]) if taken else set()
            finally:
                lock.release()
            if taken:
                if changed:
                    self._inbox.put(("sourced", frozenset(changed)))
                return
        self._enqueue(report)

    def _enqueue(self, report: tuple[str, Any]) -> None:
        """For the reflex thread, after what waits there already."""
        with self._queued_lock:
            self._queued[_origin(report)] += 1
            self._reports.put(report)

    def _decide_loop(self) -> None:
        # the GIL is handed on every FAST_SWITCH_S instead of every 5 ms: a phase change waits
        # for it behind the tick and the source watchers at every step (the queue, each
        # signal's pool call), and under load those waits were most of the fast path's time
        sys.setswitchinterval(FAST_SWITCH_S)
        self._fast_thread("decide")
        while (batch := _drained(self._inbox)) is not None:
            cpu = self._cpu()
            try:
                self._take(batch)
            except Exception as exc:  # this thread must outlive anything one batch meets
                log.exception("decision failed")
                self._record(codes.PLUGIN_FAILED, "node", f"a decision failed: {type(exc).__name__}: {exc}")
            self.costs["decisions"] += 1
            self.costs["decide_cpu_s"] += self._cpu() - cpu

    def _reflex_loop(self) -> None:
        """The reports that could not be taken on the thread that made them, in order."""
        self._fast_thread("reflex")
        while (batch := _drained(self._reports)) is not None:
            with self._act_lock:
                changed = self._take_reports(batch)
                with self._queued_lock:
                    for report in batch:
                        origin = _origin(report)
                        self._queued[origin] -= 1
                        if not self._queued[origin]:
                            del self._queued[origin]
            if changed:
                self._inbox.put(("sourced", frozenset(changed)))

    def _take_reports(self, batch: list[tuple[str, Any]]) -> set[str]:
        """Into the source book, a reflex where a phase changed; the rules whose sources
        changed.  Under ``_act_lock``; raises nothing (it runs on plugins' and socket threads)."""
        changed: set[str] = set()
        try:
            for kind, payload in batch:
                if kind == "link":
                    for line in self.link.take() if self.link is not None else ():
                        try:
                            self._from_link(line, changed)
                        except Exception as exc:  # the lines after it are still taken
                            log.exception("a line of the reflex process failed")
                            self._record(
                                codes.PLUGIN_FAILED,
                                "node",
                                f"a line of the reflex process failed: {type(exc).__name__}: {exc}",
                            )
                    continue
                if kind == "helper_gone":
                    if self.sources.helper_gone(payload):
                        changed.update(self._policy.rules)
                    continue
                if kind == "source":
                    rule_id, index, state = payload
                    moved = self.sources.own((rule_id, index), state, "watch")
                else:
                    helper, (rule_id, index), state = payload
                    moved = self.sources.helper(helper, (rule_id, index), state)
                if moved:
                    changed.add(rule_id)
                    self._reflex(rule_id, index)
        except Exception as exc:  # the thread that reported must outlive anything one report meets
            log.exception("taking a source report failed")
            self._record(codes.PLUGIN_FAILED, "node", f"a source report failed: {type(exc).__name__}: {exc}")
        return changed

    def _from_link(self, line: dict[str, Any], changed: set[str]) -> None:
        """A line of the reflex process: its reading of a source, and what it did on it
        (taken into the record first, whoever the line is from now)."""
        if "gone" in line:
            covered, self._covered = list(self._covered), {}
            aside, self._set_aside = self._set_aside, {}
            self._reconcile()
            self._record(
                codes.PLUGIN_FAILED,
                "node",
                f"the reflex process was given up ({line['gone']}): phase "
                "changes are acted on inside the daemon until another starts",
            )
            for key in covered:
                # a phase the process read, acted on and never told is the daemon's own
                # watcher's last report, set aside; it and the pauses taken in from the
                # journal are judged now, not at the next tick
                changed.add(key[0])
                state = aside.get(key)
                if state is not None and self.sources.own(key, state, "watch"):
                    self._reflex(*key)
            return
        for op, rows in line.get("did", ()):
            self.actuator.adopt(
                op, [PausedEntry(*row) for row in rows], [PausedEntry(*row) for row in line["unconfirmed"]]
            )
        if line.get("did"):
            self._reflexes += 1  # a decision begun before could undo it
        rid, index, serial = line["slot"]
        key = (rid, index)
        slot = self.sources.slots.get(key)
        if slot is None or slot.serial != serial or line.get("stale"):
            return  # of a rule since reloaded, or of a process given up: the reading no longer counts
        if "state" not in line:
            self._covered.pop(key, None)
            self._set_aside.pop(key, None)  # its watcher's reports are taken again from now
            log.info(
                "the reflex process cannot watch %s/%s (%s): the daemon does", rid, slot_name(index), line.get("why")
            )
            return
        self._covered[key] = serial
        self._link_seen[key] = time.monotonic()
        if "thread" in line:
            self.fast_threads[f"source {rid}/{slot_name(index)}"] = f"{line['thread']} (in the reflex process)"
        raw = line["state"]
        if "armed" in line:
            self._link_counts["armed" if line["armed"] else "not armed"] += 1
            if line["armed"]:
                self._link_ms.append(
                    tuple(
                        (line.get(at, line["acted_at"]) - raw["changed_at"]) * 1000
                        for at in ("locked_at", "first_at", "acted_at")
                    )
                )
        if self.sources.own(key, SourceState(**{**raw, "models": tuple(raw["models"])}), "watch"):
            changed.add(rid)
            if line.get("armed"):
                self._acted_ms.extend(self.sources.decided(line["acted_at"]))
            else:
                self._reflex(rid, index)

    def _reconcile(self) -> None:
        """After the reflex process is gone: what the journal holds paused that the record
        lacks (it wrote the row, then died before its line went out) is taken in, and what
        the record holds that the journal says was resumed is kept but tried again.  Both
        are kept unconfirmed: a decision pauses them again where it must, and resumes them
        where it must.  Under _act_lock."""
        try:
            journal = PausedJournal.replay(self.journal.path)
        except OSError as exc:
            log.error("cannot read the pause journal after the reflex process: %s", exc)
            return
        paused = self.actuator.paused
        missing = [e for key, e in journal.items() if key not in paused]
        # a journal with rows of the daemon's own missing says nothing of what was resumed
        resumed = [] if self.journal.failures else [e for key, e in paused.items() if key not in journal]
        if missing:
            self.actuator.adopt("pause", missing, missing)
        self.actuator.unconfirmed.update(e.key for e in resumed)
        if missing or resumed:
            self._reflexes += 1  # a decision made before this could undo it

    def on_helper(self, helper: HelperKey, key: SlotKey, state: SourceState) -> None:
        """A session helper's report (from a socket thread)."""
        self._report(("helper", (helper, key, state)))

    def helper_gone(self, helper: HelperKey) -> None:
        self._report(("helper_gone", helper))

    def _take(self, batch: list[tuple[str, Any]]) -> None:
        urgent = False  # a change an immediate rule must act on now, between ticks
        for kind, payload in batch:
            if kind == "tick":
                self._view, wanted, readings, self._certs = payload
                with self._act_lock:
                    self.sources.sync(wanted, dict(self._view.rule_uids))
                    quiet = time.monotonic() - 2 * self.config.tick_s
                    for key, state in readings.items():
                        # the reflex process's readings stand for a source it watches (the
                        # daemon's own watcher may lag behind it), but one quiet for two ticks
                        # may have stalled: then this reading counts where it is newer
                        if key not in self._covered or self._link_seen.get(key, 0.0) < quiet:
                            self.sources.own(key, state, "tick")
                    self._sync_link()
            elif kind == "policy":
                self._policy = payload
            elif kind in ("release_failed", "release_moot"):  # no VRAM is coming back from that request
                rel = payload
                st = self._engine_state.vram.get(rel.rule_id)
                if st is not None:
                    st = request_over(
                        st, kind == "release_failed", rel.why, rel.held_bytes, rel.timeout_s, time.monotonic()
                    )
                    self._engine_state = replace(self._engine_state, vram={**self._engine_state.vram, rel.rule_id: st})
            elif kind == "ab":  # start or abort a paired run: the engine state is this thread's
                change, box = payload
                with box["lock"]:  # an asker that gave up has been told nothing changed
                    try:
                        if not box["cancelled"]:
                            run, box["answer"] = change(self._engine_state.ab)
                            self._engine_state = replace(self._engine_state, ab=run)
                            self._persist_run(run)  # a start or an abort is kept at once, not at the next block
                    except Exception as exc:  # the asker gets it; this thread goes on
                        box["error"] = exc
                    finally:
                        box["done"].set()
            elif kind == "ended":
                with self._acting():
                    failures = self.actuator.end_job(payload)
                for failure in failures:
                    self._record(codes.PLUGIN_FAILED, payload, f"could not continue what was left of it: {failure}")
            elif kind == "sourced":
                # a busy probe's change may starve a tenant or free one: the handoff acts now
                urgent = urgent or any(
                    rp.immediate or rp.progress or rp.busy_probe
                    for rid in payload
                    if (rp := self._policy.rules.get(rid))
                )
        if self._view is None:
            return
        if all(kind == "sourced" for kind, _ in batch) and not urgent:
            return  # a rule that is not immediate waits for the tick
        self._decide_and_act()

    def _reflex(self, rule_id: str, index: int) -> None:
        """A phase change acted on at once, from the last decision (see arbiter.engine.reflex);
        the whole decision follows and has the last word.  Under ``_act_lock``."""
        snap = self.snapshot
        last, obs, view = snap.decision, snap.obs, snap.view
        if last is None or obs is None or view is None:
            return
        try:
            move = reflex(
                obs, last, self._policy, rule_id, index, self.sources.observed((rule_id, index), time.monotonic())
            )
            if not move.pause and not move.resume:
                return
            self._reflexes += 1
            records = {r.id: r for r in self.jobs.active()}
            signalling = self.link.held() if self.link is not None else contextlib.nullcontext()
            # what fails here is tried again, and reported, by the decision that follows;
            # the job using the most GPU time is paused alone first (see pause_in_turn)
            with signalling:
                self.actuator.pause_in_turn(self._target(records[jid], view) for jid in move.pause if jid in records)
                if move.resume:
                    paused = self.actuator.trees_paused()
                    entries = [e for jid in move.resume if jid in records for e in paused.get(jid, ())]
                    if entries:
                        self.actuator.resume_entries(entries)
        except Exception:  # the decision that follows must run whatever happened here
            log.exception("the reflex to a phase change failed; the decision acts on it")
            return
        self._acted_ms.extend(self.sources.decided(time.monotonic()))

    def _read_sources(self, view: TickView) -> tuple[dict[SlotKey, tuple[str, int]], dict[SlotKey, SourceState]]:
        """On the tick thread: every source of every rule (its kind and rule serial, and its
        state now), each call under a timeout.  A busy probe that judges by VRAM is told what
        its tenant holds first."""
        wanted: dict[SlotKey, tuple[str, int]] = {}
        readings: dict[SlotKey, SourceState] = {}
        for rid, live in dict(self.rulebook.live).items():
            for index, block, source in live.sources():
                key = (rid, index)
                wanted[key] = (block.kind, live.serial)
                # a failure is news now: it must override whatever the watch said last
                if source is None:
                    readings[key] = SourceState(
                        readable=False, why="its source plugin failed", changed_at=time.monotonic()
                    )
                    continue
                try:
                    if type(source).uses_vram:
                        ro = view.rules.get(rid)
                        held = ro.vram_bytes if ro is not None and ro.running else 0
                        self.host.call(f"sources/{block.kind} vram", source.tenant_vram, held)
                    readings[key] = self.host.call(f"sources/{block.kind}", source.state)
                except PluginFailed as exc:
                    readings[key] = SourceState(readable=False, why=exc.why, changed_at=time.monotonic())
        return wanted, readings

    def _observation(self, view: TickView, now: float) -> Observation:
        stale = now - view.now > 3 * self.config.tick_s + self.config.plugin_timeout_s
        node_faults = view.faults + ((f"no fresh observation for {now - view.now:.0f}s",) if stale else ())
        read: dict[str, tuple[tuple[SourceObs, ...], SourceObs | None, SourceObs | None]] = {}
        # the reflex thread writes the source book: only the reads of it hold the lock (the
        # reflex waited behind this whole loop, a hundred rules long, on every decision)
        with self._act_lock:
            for rid, rp in self._policy.rules.items():
                if rid in view.rules and (rp.during or rp.progress or rp.busy_probe):
                    read[rid] = (
                        tuple(self.sources.observed((rid, i), now) for i in range(len(rp.during))),
                        self.sources.observed((rid, PROGRESS), now) if rp.progress else None,
                        self.sources.observed((rid, BUSY), now) if rp.busy_probe else None,
                    )
        rules = {}
        for rid, ro in view.rules.items():
            phases, progress, busy = read.get(rid, ((), None, None))
            rules[rid] = evolve(ro, phases=phases, progress=progress, busy=busy, faults=ro.faults + node_faults)
        return Observation(
            now=now,
            node_faults=node_faults,
            rules=rules,
            jobs=self.jobs.observations(view.job_processes, now, view.job_busy, view.job_busy_at, view.job_vram),
            invalid_files=tuple(self.rulebook.invalid_files),
            reader_ok=bool(view.reader),
            reader_why=view.reader_why,
            certificates=self._certs,
            memory_available=view.memory_available,
            wall=time.time(),
            power=view.power,
            vram_free_bytes=view.vram.get("free"),
        )

    def _target(self, record: JobRecord, view: TickView) -> JobTarget:
        """What a translator acts on for ``record`` in ``view``.  Under ``_act_lock``, or
        from :meth:`_after_act` beside a reflex: the two may then make a target twice, each
        a right one, and the reflex makes its rows itself (see Actuator.prepare)."""
        seen, made = self._targets
        if seen is not view:
            made = {}
            self._targets = (view, made)
        key = (record.id, record.name, record.root_pid, record.root_start, record.control_path)
        target = made.get(key)
        if target is None:
            refs = view.job_processes.get(record.id) or ()
            if not refs and record.root_pid is not None and record.root_start is not None:
                refs = (ProcessRef(record.root_pid, record.root_start),)
            manifest = self.jobs.manifest(record)
            cooperative = bool({"cooperative_pause", "cooperative_throttle"} & set(manifest.capabilities))
            target = made[key] = JobTarget(record.id, record.name, tuple(refs), record.control_path, cooperative)
        return target

    def _decide_and_act(self) -> None:
        view = self._view
        assert view is not None
        for _ in range(REDECIDE_AT_MOST):
            seen, now = self._reflexes, time.monotonic()
            obs = self._observation(view, now)
            decision = decide(obs, self._engine_state, self._policy, now)
            with self._acting():
                acted = self._act(view, obs, decision, now) if self._reflexes == seen else None
            if acted is not None:
                self._after_act(acted)
                return
            # the reflex acted on a newer phase meanwhile: this decision could undo it
            self.costs["redecisions"] += 1
        with self._acting():  # a source flapping this fast waits for one decision
            now = time.monotonic()
            obs = self._observation(view, now)
            decision = decide(obs, self._engine_state, self._policy, now)
            acted = self._act(view, obs, decision, now)
        self._after_act(acted)

    def _act(self, view: TickView, obs: Observation, decision: Decision, now: float) -> _Acted:
        """Carry a decision out and publish it.  Under ``_act_lock``; what the reflex does
        not need is left to :meth:`_after_act`, after the lock (a phase change that meets the
        lock held waits for the reflex thread)."""
        records = {r.id: r for r in self.jobs.active()}
        failures: list[tuple[str, str]] = []
        retry = self._failed_controls
        self._failed_controls = {}
        for action in decision.actions:
            if action.op == "control":
                retry.pop(action.job_id, None)  # superseded by a newer document
        # Pauses first and all in one batch (the fast path: every job a phase holds stops at
        # once), resumes last and also in one; a paused tree's children born since are
        # caught here, and a resume that failed on an earlier decision is tried again.
        pauses = dict.fromkeys(a.job_id for a in decision.actions if a.op == "pause")
        resumes = dict.fromkeys(a.job_id for a in decision.actions if a.op == "resume")
        paused = self.actuator.trees_paused()
        for jid, verdict in decision.jobs.items():
            if verdict.state == "paused" and verdict.via == "tree":
                pauses[jid] = None
            elif verdict.state == "run" and jid in paused:
                resumes[jid] = None
        targets = [self._target(records[jid], view) for jid in pauses if jid in records]
        for jid, exc in self.actuator.pause_trees(targets).items():
            failures.append((jid, f"pause failed: {exc}"))
        for action in [*decision.actions, *retry.values()]:
            record = records.get(action.job_id)
            if record is None or action.op in ("pause", "resume"):
                continue
            seq = record.seq
            if action.op == "control":
                seq = next_seq(record.control_path, record.seq)
                self.jobs.update(record.id, seq=seq)
            result = self.actuator.apply(action, self._target(record, view), seq)
            if not result.ok:
                failures.append((action.job_id, f"{action.op} failed: {result.detail}"))
                if action.op == "control":
                    self._failed_controls[action.job_id] = action
        resuming = [e for jid in resumes if jid in records for e in paused.get(jid, ())]
        if resuming:
            messages = self.actuator.resume_entries(resuming)
            still = {e.job_id for e in resuming if e.key in self.actuator.paused}
            for jid in sorted(still):
                failures.extend((jid, f"resume failed: {m}") for m in messages)
        for rel in decision.releases:
            reading = self.sources.state((rel.rule_id, BUSY))  # the model names it last listed
            self.tenants.release(rel, reading.models if reading else ())
        if decision.releases:
            self._wake.set()  # the tick looks more often until the VRAM is seen to fall
        if decision.profiles_on or decision.profiles_off:
            self.tenants.profiles(decision.profiles_on, decision.profiles_off)
        latency_ms = [*self._acted_ms, *self.sources.decided(time.monotonic())]
        self._acted_ms.clear()
        before, self._engine_state = self._engine_state, decision.state
        self.snapshot = Snapshot(decision, obs, view, list(records.values()), time.time())
        if self.link is not None:
            self.link.arm(self._arm(obs, decision, view, records))
        return _Acted(before, now, failures, latency_ms)

    @contextlib.contextmanager
    def _acting(self) -> Iterator[None]:
        """The act lock, and the lock the reflex process signals under, with what it did
        taken in first (a decision made before must not undo it: it is made again)."""
        with self._act_lock:
            if self.link is None:
                yield
                return
            with self.link.held():
                changed = self._take_reports([("link", "link")])
                if changed:
                    self._inbox.put(("sourced", frozenset(changed)))
                yield

    def _sync_link(self) -> None:
        """Tell the reflex process the phase sources of the immediate rules.  Under _act_lock."""
        if self.link is None:
            return
        specs: list[Spec] = []
        for rid, rp in self._policy.rules.items():
            live = self.rulebook.live.get(rid)
            if not rp.immediate or live is None:
                continue
            for index, during in enumerate(live.rule.during):
                source = live.phases[index] if index < len(live.phases) else None
                # a source fed processes on each tick (its match_option) reads nothing by itself
                if source is not None and type(source).match_option is None:
                    specs.append((rid, index, live.serial, during.source.kind, during.source.options()))
        self.link.sync(specs)
        self._covered = {
            key: serial
            for key, serial in self._covered.items()
            if (slot := self.sources.slots.get(key)) is not None and slot.serial == serial
        }
        for key in list(self._set_aside):  # list() copies atomically: source threads add to it
            if key not in self._covered:
                self._set_aside.pop(key, None)

    def _arm(self, obs: Observation, decision: Decision, view: TickView, records: dict[str, JobRecord]) -> Arm:
        """Per source the reflex process watches, per phase value, what the reflex would do
        from this decision: the targets to pause and the entries to resume."""
        arm: Arm = {}
        paused = self.actuator.trees_paused()
        now = time.monotonic()
        for (rid, index), serial in self._covered.items():
            seen = self.sources.observed((rid, index), now)
            moves: dict[str, list[Any]] = {}
            for phase in ("on", "off"):
                move = reflex(obs, decision, self._policy, rid, index, replace(seen, readable=True, phase=phase))
                targets = [self._target(records[jid], view) for jid in move.pause if jid in records]
                moves[phase] = [
                    [[t.job_id, t.name, [[r.pid, r.start_time] for r in t.processes]] for t in targets],
                    [e.fields() for jid in move.resume if jid in records for e in paused.get(jid, ())],
                ]
            arm[arm_key(rid, index, serial)] = moves
        return arm

    def _after_act(self, acted: _Acted) -> None:
        """What a decision's act leaves for after the lock: keeping, telling, recording,
        preparing.  On the decision thread, which alone writes the engine state and the
        snapshot: the snapshot is still the one just acted on."""
        snap, before, now = self.snapshot, acted.before, acted.now
        decision, view = snap.decision, snap.view
        assert decision is not None and view is not None
        if decision.state.trust != before.trust:
            trust = {n: trust_to_record(t, now, time.time()) for n, t in decision.state.trust.items()}
            self.recorder.write(lambda db: Store.put_trust(db, trust))
        if decision.state.governors != before.governors:
            govs = {r: governor.to_record(g, now, time.time()) for r, g in decision.state.governors.items()}
            self.recorder.write(lambda db: Store.put_governors(db, govs))
        self._keep_runs(before.ab, decision)
        with self.jobs.changed:
            self.jobs.changed.notify_all()
        for event in decision.events:
            data = dict(event.data)
            if acted.latency_ms and event.code.startswith("PROTECTION_PHASE"):
                data["latency_ms"] = round(max(acted.latency_ms), 3)
            self._record(event.code, event.subject, event.message, data)
        for job_id, message in self._failures.started(set(acted.failures)):
            self._record(codes.PLUGIN_FAILED, job_id, message)
        # the reflex to the next phase change finds every job's target, paused entries and
        # journal rows made: with fifty jobs, making them there came before its first signal
        self.actuator.prepare([self._target(record, view) for record in snap.jobs])

    def _persist_run(self, run: RunState | None) -> None:
        if run is None:
            return
        rec = to_record(run)
        self.recorder.write(lambda db: Store.put_run(db, rec))

    def _keep_runs(self, before: RunState | None, decision: Decision) -> None:
        """Persist a paired run when a block or the run ends (a window in progress is never
        kept), and issue the certificate a passing run earned."""
        now = decision.state.ab
        changed = [r for r in decision.ab_ended]
        if now is not None and (before is None or now.durable() != before.durable()):
            changed.append(now)
        for run in changed:
            self._persist_run(run)
        for run in decision.ab_ended:
            if run.certifies:
                certificate(self, run)
            elif run.verdict == "slowdown" and run.spec.duty is not None:
                supersede(self, run)

    # --- requests -------------------------------------------------------------------------------

    def dispatch(self, op: str, args: dict[str, Any], peer: tuple[int, int]) -> dict[str, Any]:
        from arbiter.daemon.requests import handle

        return handle(self, op, args, peer)

    def latency_figures(self) -> dict[str, Any]:
        """From a source seeing a write to the decision it caused, over every source; and
        what the host was asked for each fast-path thread (a removed rule's watcher gone)."""
        live = {f"source {rid}/{slot_name(index)}" for rid, index in list(self.sources.slots)}
        threads = {
            role: did
            for role, did in sorted(dict(self.fast_threads).items())  # dict() copies atomically
            if not role.startswith("source ") or role in live
        }
        link = self.link
        process = None
        if link is not None:
            timed = list(self._link_ms)
            process = {
                "pid": link.pid,
                "sources": len(self._covered),
                "failure": link.failure,
                "armed": self._link_counts["armed"],
                "not_armed": self._link_counts["not armed"],
                "locked": percentiles([t[0] for t in timed]),
                "first": percentiles([t[1] for t in timed]),
                "acted": percentiles([t[2] for t in timed]),
            }
        return {
            **percentiles(list(self.sources.latencies)),
            "threads": threads,  # list() copies atomically
            "reflex_process": process,
        }


def _origin(report: tuple[str, Any]) -> Hashable:
    """Whose report it is: a source's slot, or a session helper (its reports and its going
    away are one sequence)."""
    kind, payload = report
    origin: Hashable = payload
    if kind == "source":
        origin = payload[:2]
    elif kind == "helper":
        origin = payload[0]
    return origin


def _drained(inbox: queue.Queue[tuple[str, Any]]) -> list[tuple[str, Any]] | None:
    """Everything waiting (at least one item), or None once a stop is among it."""
    batch = [inbox.get()]
    while True:
        try:
            batch.append(inbox.get_nowait())
        except queue.Empty:
            break
    return None if any(kind == "stop" for kind, _ in batch) else batch
