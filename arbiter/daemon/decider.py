"""The decision thread: takes its inbox, decides, acts through the actuator, publishes.

It alone writes the engine state, the snapshot, the source book and the actuator's record.
It takes tick views, source reports, job changes and paired-run requests from its inbox,
re-decides from the last view with only what changed (at once where an immediate rule's
source changed), and carries the decision out holding the lock the reflex process signals
under.  A decision made while the reflex process acted is made again on what it saw, so it
never undoes it.  Keeping, telling and recording follow after the act.

It runs a little past 400 lines because taking, acting and what follows the act share the
thread's own state (the engine state, the failed controls, the last admission): split, each
part would reach into the others'.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from arbiter.config.models import NodeConfig
from arbiter.daemon.handoff import TenantActions
from arbiter.daemon.inbox import (
    ChangeRun,
    HelperGone,
    HelperReport,
    JobEnded,
    LinkLines,
    Message,
    PolicyChanged,
    ReleaseOver,
    SourceReport,
    Stop,
    Tick,
    drained,
)
from arbiter.daemon.intake import Intake
from arbiter.daemon.jobs import JobRegistry
from arbiter.daemon.observe import TickView
from arbiter.daemon.recorder import Recorder
from arbiter.daemon.rules import RuleBook
from arbiter.daemon.sharehistory import ShareHistory
from arbiter.daemon.snapshot import Published, Snapshot, Targets
from arbiter.daemon.sources import BUSY, PROGRESS
from arbiter.engine import codes, governor
from arbiter.engine.abrun import RunState, to_record
from arbiter.engine.compliance import trust_to_record
from arbiter.engine.decide import decide
from arbiter.engine.evict import evicted_by
from arbiter.engine.handoff import request_over
from arbiter.engine.reacquire import newly_due
from arbiter.engine.rest import at_rest, same_input
from arbiter.engine.types import (
    Action,
    CertView,
    Decision,
    EngineState,
    JobVerdict,
    Observation,
    Policy,
    SourceObs,
    evolve,
)
from arbiter.reflex.act import Actuator, next_seq
from arbiter.state.store import Store

log = logging.getLogger("arbiter.daemon")

REDECIDE_AT_MOST = 3  # then the reflex process waits for the decision: a flapping source must not starve it
#: the interpreter's switch interval while the daemon runs: a phase change waits for the
#: interpreter behind the tick and the source watchers at every step (the queue, each
#: signal's pool call), and under load those waits are most of a decision's reaction
FAST_SWITCH_S = 0.0005
#: how long the decision thread, woken by a tick alone, sleeps before taking it: long enough
#: for the tick thread, which told it right before its own wait, to reach that wait
TICK_SETTLE_S = 0.0002


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


@dataclass(frozen=True)
class _Acted:
    """What carrying the snapshot's decision out leaves for after the act."""

    before: EngineState  # the engine state the decision was made from
    now: float
    failures: list[tuple[str, str]]  # (job id, what failed)
    latency_ms: list[float]  # from sources' changes to acting on them, since the last decision


class Decider:
    """:param run_ended: called for every paired run that ended (a certificate to issue, or
    one to supersede), on this thread.
    :param releasing: called when a decision asked a tenant to release VRAM (the tick then
    looks more often)."""

    def __init__(
        self,
        config: NodeConfig,
        intake: Intake,
        actuator: Actuator,
        jobs: JobRegistry,
        rules: RuleBook,
        tenants: TenantActions,
        recorder: Recorder,
        published: Published,
        targets: Targets,
        state: EngineState,
        run_ended: Callable[[RunState], None],
        releasing: Callable[[], None],
        cpu: Callable[[], float],
        admission_changed: Callable[[], None],
    ) -> None:
        self.config = config
        self.intake = intake
        self.book = intake.book
        self.actuator = actuator
        self.jobs = jobs
        self.rules = rules
        self.tenants = tenants
        self.recorder = recorder
        self.published = published
        self.targets = targets
        self.engine_state = state
        self.policy = published.snapshot.policy
        self.run_ended = run_ended
        self.releasing = releasing
        self.cpu = cpu
        self.admission_changed = admission_changed
        self._admits: bool | None = None  # whether the last decision admitted GPU work
        self.inbox = intake.inbox
        self.view: TickView | None = None
        self.certificates: tuple[CertView, ...] = ()
        self.shares = ShareHistory(config.tick_s)  # this thread's alone; snapshots carry its points
        self.failures = Ongoing()  # actions that fail on this thread
        self._verdicts: Mapping[str, JobVerdict] = {}  # the verdicts as last told to the jobs' watchers
        self._failed_controls: dict[str, Action] = {}
        self.costs = {"decisions": 0, "decide_cpu_s": 0.0, "redecisions": 0, "kept": 0}
        #: the last decision's observation, state and policy, while it is at rest (see
        #: :mod:`arbiter.engine.rest`): a tick that brings the same input keeps it
        self._rest: tuple[Observation, EngineState, Policy] | None = None

    def tell(self, message: Message) -> None:
        self.inbox.put(message)

    def stop(self) -> None:
        self.inbox.put(Stop())

    def run(self) -> None:
        sys.setswitchinterval(FAST_SWITCH_S)
        self.intake.ask_fast_thread("decide")
        while (batch := drained(self.inbox)) is not None:
            if all(isinstance(m, Tick) for m in batch):
                # Woken with a short scheduler slice, this thread is put on the tick thread's
                # core and runs at once, while the tick thread is still a few steps short of
                # its wait: it then waits for the interpreter behind this thread, and the two
                # hand it back and forth.  A tick is not urgent: the tick thread goes to its
                # wait first.
                time.sleep(TICK_SETTLE_S)
            cpu = self.cpu()
            decided = True
            try:
                decided = self.take(batch)
            except Exception as exc:  # this thread must outlive anything one batch meets
                log.exception("decision failed")
                self.recorder.event(codes.PLUGIN_FAILED, "node", f"a decision failed: {type(exc).__name__}: {exc}")
            # the thread's CPU counts whole (reports taken too); a batch of reports alone is no decision
            self.costs["decisions"] += decided
            self.costs["decide_cpu_s"] += self.cpu() - cpu

    def take(self, batch: list[Message]) -> bool:
        """Everything in the batch taken in order; then a decision, unless the batch held
        only reports no rule must act on before the tick.  Whether it decided."""
        urgent = False  # a change an immediate rule must act on now, between ticks
        for message in batch:
            try:
                urgent |= self._take_one(message)
            except Exception as exc:  # the messages after it are still taken
                log.exception("taking %s failed", type(message).__name__)
                self.recorder.event(
                    codes.PLUGIN_FAILED, "node", f"taking {type(message).__name__} failed: {type(exc).__name__}: {exc}"
                )
        if self.view is None:
            return False
        reports = (SourceReport, HelperReport, HelperGone, LinkLines)
        if all(isinstance(m, reports) for m in batch) and not urgent:
            return False  # a rule that is not immediate waits for the tick
        if not urgent and all(isinstance(m, (Tick, *reports)) for m in batch) and self._kept():
            return False
        self._decide_and_act()
        return True

    def _kept(self) -> bool:
        """Whether the last decision stands on this tick: it was at rest, nothing changed
        the state or the policy since, and the observation now is the same but for the
        time.  It is published again on the new view, as decided now."""
        rest, view = self._rest, self.view
        if rest is None or view is None or rest[1] is not self.engine_state or rest[2] is not self.policy:
            return False
        obs = self.observation(view, time.monotonic())
        if not same_input(obs, rest[0]):
            return False
        snap = self.published.snapshot
        self.published.snapshot = replace(snap, obs=obs, view=view, decided_at=time.time(), shares=self.shares.points())
        self.costs["kept"] += 1
        return True

    def _take_one(self, message: Message) -> bool:
        """One message taken; whether a rule must be decided on now."""
        if isinstance(message, Tick):
            self.view, self.certificates = message.view, message.certificates
            self.shares.add(message.view, time.time())
            self._take_tick(message)
        elif isinstance(message, PolicyChanged):
            self.policy = message.policy
        elif isinstance(message, ReleaseOver):  # no VRAM is coming back from that request
            rel = message.release
            st = self.engine_state.vram.get(rel.rule_id)
            if st is not None:
                st = request_over(st, message.failed, rel.why, rel.held_bytes, rel.timeout_s, time.monotonic())
                self.engine_state = replace(self.engine_state, vram={**self.engine_state.vram, rel.rule_id: st})
        elif isinstance(message, ChangeRun):
            self._change_run(message)
        elif isinstance(message, JobEnded):
            with self.intake.acting() as may:
                failures = self.actuator.end_job(message.job_id) if may else []
            for failure in failures:
                self.recorder.event(
                    codes.PLUGIN_FAILED, message.job_id, f"could not continue what was left of it: {failure}"
                )
        elif isinstance(message, SourceReport | HelperReport | HelperGone | LinkLines):
            # a busy probe's change may starve a tenant or free one: the handoff acts now
            return any(
                rp.immediate or rp.progress or rp.busy_probe
                for rid in self.intake.take(message)
                if (rp := self.policy.rules.get(rid))
            )
        return False

    def _take_tick(self, tick: Tick) -> None:
        self.book.sync(tick.wanted, dict(tick.view.rule_uids))
        self.intake.take_held()
        quiet = time.monotonic() - 2 * self.config.tick_s
        linked = self.intake.linked
        for key, state in tick.readings.items():
            if linked is None or linked.counts_tick(key, quiet):
                self.book.own(key, state, "tick")
        if linked is not None:
            linked.sync(self.rules, self.policy)

    def _change_run(self, message: ChangeRun) -> None:
        """Start or abort a paired run: the engine state is this thread's."""
        if not message.answer.set_running_or_notify_cancel():
            return  # the asker gave up and has been told nothing changed
        try:
            run, answer = message.change(self.engine_state.ab)
            self.engine_state = replace(self.engine_state, ab=run)
            self._persist_run(run)  # a start or an abort is kept at once, not at the next block
        except Exception as exc:  # the asker gets it; this thread goes on
            message.answer.set_exception(exc)
        else:
            message.answer.set_result(answer)

    # --- deciding ---------------------------------------------------------------------------

    def observation(self, view: TickView, now: float) -> Observation:
        stale = now - view.now > 3 * self.config.tick_s + self.config.plugin_timeout_s
        node_faults = view.faults + ((f"no fresh observation for {now - view.now:.0f}s",) if stale else ())
        read: dict[str, tuple[tuple[SourceObs, ...], SourceObs | None, SourceObs | None]] = {}
        book = self.book
        for rid, rp in self.policy.rules.items():
            if rid in view.rules and (rp.during or rp.progress or rp.busy_probe):
                read[rid] = (
                    tuple(book.observed((rid, i), now) for i in range(len(rp.during))),
                    book.observed((rid, PROGRESS), now) if rp.progress else None,
                    book.observed((rid, BUSY), now) if rp.busy_probe else None,
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
            invalid_files=tuple(self.rules.invalid_files),
            reader_ok=bool(view.reader),
            reader_why=view.reader_why,
            certificates=self.certificates,
            memory_available=view.memory_available,
            wall=time.time(),
            power=view.power,
            vram_free_bytes=view.vram.get("free"),
        )

    def _decide_and_act(self) -> None:
        view = self.view
        assert view is not None
        self._rest = None
        for _ in range(REDECIDE_AT_MOST):
            seen, now = self.intake.changes, time.monotonic()
            obs = self.observation(view, now)
            decision = decide(obs, self.engine_state, self.policy, now)
            with self.intake.acting() as may:
                if not may:
                    return  # the daemon is stopping: its shutdown resumes everything
                acted = self._act(view, obs, decision, now) if self.intake.changes == seen else None
            if acted is not None:
                self._after_act(acted)
                self._rest = (
                    (obs, decision.state, self.policy) if at_rest(acted.before, decision, self.policy) else None
                )
                return
            # the reflex process acted on a newer phase meanwhile: this decision could undo it
            self.costs["redecisions"] += 1
        with self.intake.acting() as may:  # a source flapping this fast waits for one decision
            if not may:
                return
            now = time.monotonic()
            obs = self.observation(view, now)
            decision = decide(obs, self.engine_state, self.policy, now)
            acted = self._act(view, obs, decision, now)
        self._after_act(acted)
        self._rest = (obs, decision.state, self.policy) if at_rest(acted.before, decision, self.policy) else None

    def _act(self, view: TickView, obs: Observation, decision: Decision, now: float) -> _Acted:
        """Carry a decision out and publish it, holding the reflex process's signalling lock;
        what it does not need is left to :meth:`_after_act`, after the lock."""
        records = {r.id: r for r in self.jobs.active()}
        failures: list[tuple[str, str]] = []
        retry = self._failed_controls
        self._failed_controls = {}
        for action in decision.actions:
            if action.op == "control":
                retry.pop(action.job_id, None)  # superseded by a newer document
        # Pauses first and all in one batch (every job a phase holds stops at once), resumes
        # last and also in one; a paused tree's children born since are caught here, and a
        # resume that failed on an earlier decision is tried again.
        pauses = dict.fromkeys(a.job_id for a in decision.actions if a.op == "pause")
        resumes = dict.fromkeys(a.job_id for a in decision.actions if a.op == "resume")
        paused = self.actuator.trees_paused()
        for jid, verdict in decision.jobs.items():
            if verdict.state == "paused" and verdict.via == "tree":
                pauses[jid] = None
            elif verdict.state == "run" and jid in paused:
                resumes[jid] = None
        targets = [self.targets.of(records[jid], view) for jid in pauses if jid in records]
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
            target = self.targets.of(record, view)
            evicting = evicted_by(decision.jobs.get(action.job_id)) if action.op == "terminate" else None
            if evicting is not None:  # the evicting rule says how the job saves its work first
                target = replace(target, checkpoint=self.rules.checkpoint(evicting))
            result = self.actuator.apply(action, target, seq)
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
            reading = self.book.state((rel.rule_id, BUSY))  # the model names it last listed
            self.tenants.release(rel, reading.models if reading else ())
        # a handoff waits for these to be idle before releasing them: read them on every tick,
        # and tick more often, so that the release follows their last request closely
        draining = [rid for rid, st in decision.state.vram.items() if st.drain_since is not None]
        for rid in draining:
            live = self.rules.live.get(rid)
            if live is not None:
                live.wake_busy(self.rules.host)
        if decision.releases or draining or newly_due(self.engine_state.vram, decision.state.vram):
            self.releasing()  # the tick looks more often until the VRAM is seen to fall, or sooner for a wake
        if decision.profiles_on or decision.profiles_off:
            self.tenants.profiles(decision.profiles_on, decision.profiles_off)
        latency_ms = self.intake.take_acted_ms()
        before, self.engine_state = self.engine_state, decision.state
        self.published.snapshot = Snapshot(
            decision, obs, view, list(records.values()), time.time(), self.policy, self.shares.points()
        )
        if self.intake.linked is not None:
            self.intake.linked.arm(obs, decision, records)
        return _Acted(before, now, failures, latency_ms)

    def _after_act(self, acted: _Acted) -> None:
        """What a decision's act leaves for after the lock: keeping, telling, recording,
        preparing.  The snapshot is still the one just acted on."""
        snap, before, now = self.published.snapshot, acted.before, acted.now
        decision, view = snap.decision, snap.view
        assert decision is not None and view is not None
        if decision.state.trust != before.trust:
            trust = {n: trust_to_record(t, now, time.time()) for n, t in decision.state.trust.items()}
            self.recorder.write(lambda db: Store.put_trust(db, trust))
        if decision.state.governors != before.governors:
            govs = {r: governor.to_record(g, now, time.time()) for r, g in decision.state.governors.items()}
            self.recorder.write(lambda db: Store.put_governors(db, govs))
        if decision.state.held != before.held:  # the eviction clock outlives a restart
            held = {job: time.time() - (now - h.since) for job, h in decision.state.held.items()}
            self.recorder.write(lambda db: Store.put_held(db, held))
        spans = {rid: rs.held_spans for rid, rs in decision.state.rules.items()}
        if spans != {rid: rs.held_spans for rid, rs in before.rules.items()}:  # so do auto's protections
            self.recorder.write(lambda db: Store.put_protections(db, spans))
        self._keep_runs(before.ab, decision)
        if decision.admits_gpu != self._admits:
            # fleet schedulers place work by what the node admits: told now, not a tick later
            self._admits = decision.admits_gpu
            self.admission_changed()
        with self.jobs.changed:
            self.jobs.changed.notify_all()
            if decision.jobs != self._verdicts:  # a job's watchers wait for a change, not a decision
                self._verdicts = decision.jobs
                self.jobs.verdicts.notify_all()
        for event in decision.events:
            data = dict(event.data)
            if acted.latency_ms and event.code.startswith("PROTECTION_PHASE"):
                data["latency_ms"] = round(max(acted.latency_ms), 3)
            self.recorder.event(event.code, event.subject, event.message, data)
        for job_id, message in self.failures.started(set(acted.failures)):
            self.recorder.event(codes.PLUGIN_FAILED, job_id, message)
        # the decision on the next phase change finds every job's target, paused entries and
        # journal rows made: with fifty jobs, making them then came before its first signal
        self.actuator.prepare([self.targets.of(record, view) for record in snap.jobs])

    def _persist_run(self, run: RunState | None) -> None:
        if run is None:
            return
        rec = to_record(run)
        self.recorder.write(lambda db: Store.put_run(db, rec))

    def _keep_runs(self, before: RunState | None, decision: Decision) -> None:
        """Persist a paired run when a block or the run ends (a window in progress is never
        kept); a run that ended is handed on (its certificate, or one it supersedes)."""
        now = decision.state.ab
        changed = list(decision.ab_ended)
        if now is not None and (before is None or now.durable() != before.durable()):
            changed.append(now)
        for run in changed:
            self._persist_run(run)
        for run in decision.ab_ended:
            self.run_ended(run)
