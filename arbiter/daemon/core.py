"""The daemon: the collaborators built and wired in one place, started and stopped.

Threads and what each may do (ARCHITECTURE.md draws the whole picture):

- ``tick`` (:class:`~arbiter.daemon.ticker.Ticker`): rule-file reloads, the process table,
  matching, readers, sources' states, certificates; hands a view to the decision thread;
- the intake (:class:`~arbiter.daemon.intake.Intake`): a source's, helper's or the reflex
  process's report, handed from the thread that made it to the decision thread;
- ``decide`` (:class:`~arbiter.daemon.decider.Decider`): takes reports, decides and acts;
  alone writes the engine state, the source book and the snapshot;
- the reflex process (:mod:`arbiter.daemon.linked`), the one fast path: pauses or resumes on
  an immediate rule's phase change at once, from what the last decision armed it with;
- ``recorder``: SQLite commits and timeline observers;
- the socket and HTTP servers answer through the table of operations
  (:class:`~arbiter.daemon.api.NodeApi`), handed the collaborators as
  :class:`~arbiter.daemon.parts.Parts`.

It runs past 400 lines because the collaborators are built in one place, in the order each
needs the others, and started and stopped in the order that keeps protection safe.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import sqlite3
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from arbiter import __version__
from arbiter.api.transport import SocketServer
from arbiter.config.models import NodeConfig
from arbiter.daemon.abruns import RunRefused, certificate, resumed_from, start, supersede
from arbiter.daemon.adopt import Reconciler
from arbiter.daemon.api import NodeApi
from arbiter.daemon.decider import Decider
from arbiter.daemon.endpoints import Endpoints
from arbiter.daemon.fleetcerts import FleetCerts
from arbiter.daemon.handoff import TenantActions
from arbiter.daemon.helpers import Helpers
from arbiter.daemon.inbox import ReleaseOver
from arbiter.daemon.intake import Intake
from arbiter.daemon.jobs import JobRegistry
from arbiter.daemon.linked import reflex_process
from arbiter.daemon.observe import Observer
from arbiter.daemon.parts import Parts
from arbiter.daemon.recorder import Recorder
from arbiter.daemon.rules import RuleBook
from arbiter.daemon.secure import check_state_dir, ensure_token
from arbiter.daemon.snapshot import Published, Snapshot, Targets
from arbiter.daemon.sources import SourceBook
from arbiter.daemon.ticker import Ticker
from arbiter.daemon.views import status_line
from arbiter.engine import codes, governor
from arbiter.engine.abrun import RunSpec, RunState
from arbiter.engine.compliance import trust_from_record
from arbiter.engine.evict import SPANS_KEPT
from arbiter.engine.types import EngineState, HeldJob, Policy, RuleState
from arbiter.plugin import ProcessRef
from arbiter.pluginmanager import PluginHost, build_plugin_manager
from arbiter.pluginsteps import Steps
from arbiter.probing import Prober
from arbiter.reflex.act import Actuator, make_translators
from arbiter.state.journal import PausedJournal
from arbiter.state.store import JobRecord, Store

log = logging.getLogger("arbiter.daemon")

DAEMON_FILE = "daemon.json"
SOCKET_FILE = "arbiter.sock"
TOKEN_FILE = "token"
PROBE_DELAY_S = 60.0
#: how long the shutdown waits for each thread to end
JOIN_WAIT_S = 10.0
#: how long the shutdown's resume waits for a decision still acting (each of its plugin calls
#: ends within the plugin timeout): what that act pauses must be resumed too
STOP_WAIT_S = 60.0


class DaemonAlreadyRunning(Exception):
    """Another daemon uses this state directory."""


def platform_name() -> str:
    return {"darwin": "darwin", "win32": "windows"}.get(sys.platform, "linux")


class Daemon:
    """Building one takes the state directory (its lock, its database); :meth:`start` starts
    the threads and :meth:`shutdown` resumes everything and lets the directory go."""

    def __init__(self, config: NodeConfig, config_path: Path | None = None, host: PluginHost | None = None) -> None:
        self.config = config
        self.config_path = config_path
        self.host = host or build_plugin_manager(
            config.plugins, config.disable_plugins, timeout_s=config.plugin_timeout_s
        )
        self.state_dir = config.state_path()
        self.uid = os.geteuid()
        self.started_wall = time.time()
        self.http_url = ""
        self._http: Any = None
        self._socket: SocketServer | None = None  # the listeners exist while the daemon runs
        self._threads: list[threading.Thread] = []
        self._started = False
        # what building opened, closed in reverse where building fails or the daemon never starts
        self._undo = contextlib.ExitStack()
        try:
            self._undo.callback(self.host.close)
            self._lock_fd = self._take_state_dir()
            self._undo.callback(os.close, self._lock_fd)
            self._build(self._undo)
        except BaseException:
            self._undo.close()
            raise

    def _take_state_dir(self) -> int:
        check_state_dir(self.state_dir)
        fd = os.open(self.state_dir / "lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise DaemonAlreadyRunning(f"another daemon holds {self.state_dir}; `arbiter status` shows it") from None
        return fd

    def _build(self, undo: contextlib.ExitStack) -> None:
        config, host = self.config, self.host
        self.token = ensure_token(self.state_dir / TOKEN_FILE)
        self.store = Store(self.state_dir / "state.db")
        undo.callback(self.store.close)
        self.recorder = Recorder(self.store, self._observe_event)
        journal_path = self.state_dir / "paused.journal"
        translators = make_translators(config, host, self._pid_reused, self._translator_note)
        self._recovered = {**{e.key: e for e in self.store.paused()}, **PausedJournal.replay(journal_path)}
        self.journal = PausedJournal(journal_path)
        undo.callback(self.journal.close)
        self.actuator = Actuator(host, translators, self.journal, self.recorder.paused)
        self.jobs = JobRegistry(
            self.state_dir / "jobs", self._persist_job, platform_name(), config.quotas.ended_jobs_kept
        )
        self.jobs.load(self.store)
        self.published = Published(Policy())
        self.targets = Targets(self.jobs)
        self.intake = Intake(host, SourceBook(config.governor.period_s), self.published, self.record)
        pausing = translators.get("pause")
        self.rulebook = RuleBook(
            config,
            host,
            self.store,
            self.intake.on_source,
            self.record,
            pause_frees_vram=bool(pausing is not None and pausing[1].frees_vram),
            may_send=Endpoints(host, self.published, self.record, self.uid).for_rule,
        )
        undo.callback(self.rulebook.close)
        self.rulebook.load()
        self.published.snapshot = Snapshot(policy=self.rulebook.policy())
        self.tenants = TenantActions(
            config,
            host,
            self.store,
            self.rulebook,
            self.recorder,
            lambda release, failed: self.decider.tell(ReleaseOver(release, failed)),
        )
        undo.callback(self.tenants.close)
        self.prober = Prober(lambda: host.kind_names("probes"), config.plugins, config.disable_plugins)
        self.reconciler = Reconciler()  # jobs an outside scheduler started, taken over on the tick
        undo.callback(self.prober.close)
        self._probe_timer = threading.Timer(PROBE_DELAY_S, self.prober.get)
        self._probe_timer.daemon = True
        now, now_wall = time.monotonic(), time.time()
        # strikes, distrust and each rule's governor outlive a restart
        trust = {name: trust_from_record(rec, now, now_wall) for name, rec in self.store.trust().items()}
        governors = {rid: governor.from_record(rec, now, now_wall) for rid, rec in self.store.governors().items()}
        # a job that protection paused before a restart goes on counting towards its eviction
        # from then, the time the daemon was away included (it stayed paused); a wall clock
        # set back meanwhile makes the pause start now
        held = {job: HeldJob(now - max(0.0, now_wall - since)) for job, since in self.store.held().items()}
        # evict_after_s: auto chooses from each rule's latest protections: those seen before a
        # restart count, not the cost alone again as on a node that has seen none
        rules = {rid: RuleState(held_spans=spans) for rid, spans in self.store.protections(SPANS_KEPT).items()}
        run, self._run_problem = resumed_from(self.store.running_run())
        self._resumed_run = run if run is not None and run.running else None
        self.decider = Decider(
            config,
            self.intake,
            self.actuator,
            self.jobs,
            self.rulebook,
            self.tenants,
            self.recorder,
            self.published,
            self.targets,
            EngineState(rules=rules, trust=trust, governors=governors, ab=run, held=held),
            self._run_ended,
            self._releasing,
            lambda: time.thread_time() + host.worker_cpu(),
            self._admission_changed,
        )
        self.ticker = Ticker(
            config,
            host,
            Observer(config, host),
            self.rulebook,
            self.jobs,
            self.store,
            self.recorder,
            self.prober,
            self.published,
            self.decider,
            lambda: status_line(self.parts),
            self._reconcile,
        )
        undo.callback(self.ticker.observer.close)
        self.fleet = FleetCerts(
            config.fleet_certificates,
            self.state_dir,
            self._start_run,
            self.store,
            self.recorder,
            self.tenants,
            self.published,
            self.decider,
            self.ticker,
        )
        linked, self.intake.reflex_off = reflex_process(
            config, host, translators, journal_path, self.intake, self.actuator, self.targets
        )
        if linked is not None:
            undo.callback(linked.link.close)
        self.intake.linked = linked
        self.helpers = Helpers(host, self.rulebook, self.intake)
        self.parts = Parts(
            config=config,
            config_path=self.config_path,
            host=host,
            state_dir=self.state_dir,
            uid=self.uid,
            started_wall=self.started_wall,
            token=self.token,
            store=self.store,
            recorder=self.recorder,
            journal=self.journal,
            actuator=self.actuator,
            jobs=self.jobs,
            rulebook=self.rulebook,
            prober=self.prober,
            published=self.published,
            intake=self.intake,
            decider=self.decider,
            ticker=self.ticker,
            tenants=self.tenants,
            helpers=self.helpers,
            fleet=self.fleet,
        )
        self.api = NodeApi(self.parts)

    # --- start and stop -----------------------------------------------------------------------

    def start(self) -> None:
        self._started = True
        self.recorder.start()
        self._recover()
        # not at once: seven probe processes would slow every start; the first need starts them sooner
        self._probe_timer.start()
        self._spawn("decide", self.decider.run)
        self.ticker.once()  # the first decision waits for a full view
        self._spawn("tick", self.ticker.run)
        self._socket = SocketServer(
            self.state_dir / SOCKET_FILE,
            self.api.dispatch,
            {"helper.attach": self.helpers.open},
            connections_per_uid=self.config.quotas.connections_per_uid,
        )
        self._socket.start()
        if self.config.http.enabled:
            self._start_http()
        self._write_daemon_file()
        self.record(
            codes.DAEMON_STARTED,
            "node",
            f"arbiter {__version__} started (pid {os.getpid()})",
            {"config": str(self.config_path or "")},
        )
        run = self._resumed_run  # as loaded: the first decision may have moved it on already
        if run is not None:
            self.record(
                codes.AB_RUN_STARTED,
                run.spec.rule_id,
                f"paired run {run.spec.run_id} resumed with "
                f"{len(run.blocks)} of {run.target} blocks done (the window in progress was discarded)",
                {"run": run.spec.run_id, "resumed": True},
            )
        if self._run_problem:
            self.record(codes.PLUGIN_FAILED, "node", self._run_problem)

    def _recover(self) -> None:
        """What a previous daemon that died left paused or applied: never leave work frozen."""
        recovered = self._recovered
        if recovered:
            self.actuator.paused.update(recovered)
            failures = self.actuator.resume_entries(list(recovered.values()))
            self.recorder.event(
                codes.JOB_RESUMED,
                "node",
                f"resumed {len(recovered)} paused item(s) left by a previous daemon",
                {"failures": failures},
            )
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

    def _spawn(self, name: str, target: Any) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    def _start_http(self) -> None:
        from arbiter.http.server import HttpServer  # the CLI never pays for importing it

        try:
            self._http = HttpServer(self.api, self.config.http.host, self.config.http.port)
            self.http_url = self._http.start()
        except Exception as exc:  # a port in use must not stop protection
            self.record(
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
        return self.ticker.stop_event.wait(timeout)

    def request_stop(self) -> None:
        self.ticker.stop()
        self.decider.stop()

    def shutdown(self) -> None:
        """Resume everything, write every job's control document back to run, and exit.
        Called again, it does nothing."""
        if not self._started:  # nothing ran: close what building opened (once: it is empty then)
            self._undo.close()
            return
        self._started = False
        self._undo.pop_all()  # what it would close is closed below, in order
        self.request_stop()
        for thread in self._threads:
            thread.join(timeout=JOIN_WAIT_S)
        if self._socket:
            self._socket.close()
        if self._http:
            self._http.stop()
        linked = self.intake.linked
        with self.intake.stopped(STOP_WAIT_S):
            if linked is not None:  # what it paused last is resumed below
                linked.link.close()
                linked.settle()
            failures = self.actuator.resume_entries(list(self.actuator.paused.values()))
        self._probe_timer.cancel()
        self.prober.close()
        self.tenants.close()
        self.tenants.restore_all("arbiter stopped")
        self.record(codes.DAEMON_STOPPED, "node", "arbiter stopped; paused work resumed", {"failures": failures})
        if not failures:  # every job runs again: no protection pause goes on
            self.recorder.write(lambda db: Store.put_held(db, {}))
        self.rulebook.close()
        self.ticker.observer.close()
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

    # --- what the collaborators are given -------------------------------------------------------

    def record(self, code: str, subject: str, message: str, data: dict[str, Any] | None = None) -> None:
        self.recorder.event(code, subject, message, data)

    def _pid_reused(self, job_id: str, ref: ProcessRef, why: str) -> None:
        """A translator refused to signal a recorded process (called on its thread: only records)."""
        if not job_id:  # a resume names no job: the paused set knows whose the process was
            paused = list(self.actuator.paused.values())
            job_id = next((e.job_id for e in paused if e.pid == ref.pid and e.start_time == ref.start_time), "")
        self.record(codes.PID_REUSED, job_id or "node", why, {"pid": ref.pid, "recorded_start": ref.start_time})

    def _translator_note(self, job_id: str, code: str, message: str, data: dict[str, Any]) -> None:
        """A translator says what an action did (called on its thread: only records)."""
        if not job_id and "pid" in data:  # a resume names no job: the paused set knows whose the process was
            job_id = next((e.job_id for e in self.actuator.paused.values() if e.pid == data["pid"]), "")
        self.record(code, job_id or "node", message, data)

    def _observe_event(self, event: dict[str, Any]) -> None:
        self.host.call("timeline observers", lambda: self.host.hook.arbiter_timeline_event(event=event))

    def _persist_job(self, record: JobRecord) -> None:
        snapshot = replace(record)
        kept = self.config.quotas.ended_jobs_kept
        self.recorder.write(lambda db: Store.put_job(db, snapshot, kept))

    def _reconcile(self) -> Steps[None]:
        """Take over the jobs an outside scheduler started here, where a look is due, and read
        the twins' published certificates, where a read is due (steps of the tick's run)."""
        if self.reconciler.due(time.monotonic()):
            yield from self.reconciler.run(self.parts)
        self.fleet.tick()

    def _releasing(self) -> None:
        """A tenant was asked to release VRAM: the tick looks more often until it is seen to fall."""
        self.ticker.tick_soon()

    def _admission_changed(self) -> None:
        """The node now admits GPU work, or no longer does: the tick tells the node state
        observers (a fleet scheduler's features) at once rather than on its next turn."""
        self.ticker.admission_changed()

    def _start_run(self, spec: RunSpec) -> str:
        """Start a paired run of the daemon's own (a confirmation): "" or why it cannot start now."""
        try:
            start(self.parts, spec, self.uid)
        except RunRefused as exc:
            return str(exc)
        return ""

    def _run_ended(self, run: RunState) -> None:
        """Issue the certificate a passing run earned, or supersede the one a failing run had; a
        confirmation of a twin's certificate adopts or refuses that one instead."""
        if run.spec.confirms:
            self.fleet.concluded(run)
        elif run.certifies:
            certificate(self.parts, run)
        elif run.verdict == "slowdown" and run.spec.duty is not None:
            supersede(self.parts, run)
